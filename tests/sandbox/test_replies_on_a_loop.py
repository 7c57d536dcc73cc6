"""A sandbox whose supervisor's replies the caller's event loop reads (`replies_on`, decision 138), as the
service's sandboxes are, on each backend: commands awaited on the loop beside blocking calls from other
threads, payloads of many reads, a supervisor that dies under an awaited command, and closing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxError, open_sandbox
from sandbox.channel import READ_BYTES
from sandbox.docker_backend import default_client
from sandbox.local_backend import LocalDeployment
from tests.sandbox.support import SPEC, next_turn, run_on


@pytest.fixture
def loop_read_sandbox(backend: str, running_loop: asyncio.AbstractEventLoop) -> Iterator[Sandbox]:
    """A sandbox on `backend` whose replies `running_loop` reads, closed at the end (again, if the test did)."""
    with open_sandbox(SPEC, backend=backend, replies_on=running_loop) as sandbox:
        yield sandbox


def _kill_supervisor(sandbox: Sandbox) -> None:
    """Kill the sandbox from outside, as an OOM kill or a crashed engine would: its stream ends."""
    deployment = sandbox.deployment
    if isinstance(deployment, LocalDeployment):
        os.kill(deployment.pid, signal.SIGKILL)
    else:
        default_client().api.kill(deployment.container_id)


def test_awaited_commands_and_blocking_calls_are_served_side_by_side(loop_read_sandbox: Sandbox, running_loop: asyncio.AbstractEventLoop) -> None:
    sandbox = loop_read_sandbox
    data = os.urandom(3 * READ_BYTES + 17)  # a payload of several reads each way

    async def commands_beside_a_transfer() -> list[str]:
        transfer = asyncio.get_running_loop().run_in_executor(None, sandbox.write_file, "blob", data)
        outputs = await asyncio.gather(*(sandbox.exec_async(f"echo {i}") for i in range(8)))
        await transfer
        return [result.stdout for result in outputs]

    assert run_on(running_loop, commands_beside_a_transfer) == [f"{i}\n" for i in range(8)]
    assert sandbox.read_file("blob") == data
    assert sandbox.exec("sha256sum blob").stdout.split()[0] == hashlib.sha256(data).hexdigest()
    with sandbox.open_fresh() as fresh:
        assert fresh.replies_on is running_loop
        assert fresh.exec("echo fresh").stdout == "fresh\n"


def test_a_supervisor_that_dies_fails_the_awaited_command_and_the_loop_lets_its_stream_go(
    loop_read_sandbox: Sandbox, running_loop: asyncio.AbstractEventLoop
) -> None:
    sandbox, channel = loop_read_sandbox, loop_read_sandbox._channel

    async def command_under_a_kill() -> None:
        command = asyncio.create_task(sandbox.exec_async("sleep 60"))
        await asyncio.sleep(0)  # the task runs up to its wait: the request is out
        await asyncio.to_thread(_kill_supervisor, sandbox)
        with pytest.raises(SandboxError, match="closed"):
            await command

    run_on(running_loop, command_under_a_kill)
    assert channel._watched is None  # the loop let the stream go at its end
    assert not sandbox.is_alive()


def test_a_sandbox_cannot_start_on_the_loop_that_would_read_its_replies(running_loop: asyncio.AbstractEventLoop) -> None:
    async def start_on_the_loop() -> Sandbox:
        return open_sandbox(SPEC, replies_on=running_loop)

    with pytest.raises(RuntimeError, match="cannot start on it"):
        run_on(running_loop, start_on_the_loop)


def test_a_blocking_call_on_the_reading_loop_is_refused_and_closing_lets_the_stream_go(
    loop_read_sandbox: Sandbox, running_loop: asyncio.AbstractEventLoop
) -> None:
    sandbox, channel = loop_read_sandbox, loop_read_sandbox._channel

    async def blocking_exec() -> None:
        sandbox.exec("true")

    with pytest.raises(RuntimeError, match="wait forever"):
        run_on(running_loop, blocking_exec)
    assert sandbox.exec("echo served").stdout == "served\n"  # from this thread it is served
    sandbox.close()
    run_on(running_loop, next_turn)  # the loop's turn after the close: it has let the stream go by then
    assert channel._watched is None
