"""Where a tool runs in the service: a command's tools on the event loop, awaiting their exec with no thread
between a step and its command; every tool that blocks on a worker thread, so the loop serving every session
is never held by one session's file transfer or grading."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, cast

from env_server.tools import TOOLS, CallOutcome, Tool, Workspace

COMMAND_TOOLS = {"bash", "list_dir", "search", "run_tests"}
"""The tools that only run a command in the sandbox (`Sandbox.exec_async`)."""


def test_only_the_tools_that_run_a_command_are_awaited_on_the_loop() -> None:
    awaited = {name for name, t in TOOLS.items() if inspect.iscoroutinefunction(t.run)}
    assert awaited == COMMAND_TOOLS


def test_a_blocking_tool_runs_on_a_worker_thread_and_a_coroutine_tool_on_the_loop() -> None:
    ran_on: dict[str, int] = {}

    def blocking(ws: Workspace) -> CallOutcome:
        ran_on["blocking"] = threading.get_ident()
        return CallOutcome("blocked")

    async def awaited(ws: Workspace) -> CallOutcome:
        ran_on["awaited"] = threading.get_ident()
        return CallOutcome("awaited")

    async def scenario() -> tuple[list[str], int]:
        workspace = cast(Workspace, object())  # passed through untouched
        outcomes = [await Tool(fn.__name__, "", Any, fn).call(workspace) for fn in (blocking, awaited)]  # type: ignore[arg-type]
        return [o.output for o in outcomes], threading.get_ident()

    outputs, loop_thread = asyncio.run(scenario())
    assert outputs == ["blocked", "awaited"]
    assert ran_on["awaited"] == loop_thread
    assert ran_on["blocking"] != loop_thread
