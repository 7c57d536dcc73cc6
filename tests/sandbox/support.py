"""Shared pieces of the sandbox tests: backends, the small test spec, a killed caller, an event loop on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar
from pathlib import Path

import pytest
import uvloop

from sandbox import DockerSpec, LocalSpec, SandboxSpec
from sandbox.spec import DEFAULT_IMAGE


@functools.cache
def docker_ready() -> bool:
    """An engine answers and the sandbox image exists (`coding-env build-image` makes it)."""
    try:
        from sandbox.docker_backend import default_client
        from sandbox.image import image_exists

        return image_exists(DEFAULT_IMAGE, default_client())
    except Exception:
        return False


needs_docker = [pytest.mark.docker, pytest.mark.skipif(not docker_ready(), reason="no Docker engine or no sandbox image")]
needs_bwrap = [pytest.mark.bwrap, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")]

BACKENDS = [pytest.param("docker", marks=needs_docker), pytest.param("local", marks=needs_bwrap)]

SPEC = SandboxSpec(memory_mb=512, pids=128, workspace_mb=16, tmp_mb=16, default_timeout_s=20)
"""Small limits so the containment tests hit them quickly (on either backend)."""

DOCKER_SPEC = DockerSpec(**SPEC.model_dump())
LOCAL_SPEC = LocalSpec(**SPEC.model_dump())
"""The same limits as the spec type of each backend (for its own fields: `cpus`, `cpu_time_s`)."""
GVISOR_SPEC = DOCKER_SPEC.model_copy(update={"runtime": "runsc", "pids": SandboxSpec.model_fields["pids"].default})
"""Docker's limits under gVisor, but the default pids limit: gVisor's ptrace platform charges its
own host threads to the container's pids cgroup, and at 128 its sentry panics now and then when a
command starts ("error initializing first thread: resource temporarily unavailable")."""


def kill_caller_mid_command(backend: str, handle: str) -> str:
    """Run a caller process that opens a sandbox and is SIGKILLed while a command runs in it.

    Returns `str(sandbox.<handle>)` as the caller printed it (e.g. its container id).
    """
    caller = textwrap.dedent(
        f"""
        import threading
        from sandbox import open_sandbox
        from tests.sandbox.support import SPEC
        sb = open_sandbox(SPEC, {backend!r})
        threading.Thread(target=sb.exec, args=("touch started; sleep 1000",), daemon=True).start()
        while sb.exec("test -f started").exit_code != 0:
            pass
        print(sb.{handle}, flush=True)
        threading.Event().wait()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        reported = proc.stdout.readline().strip()
    finally:
        proc.kill()  # SIGKILL: no cleanup code of the caller runs
        proc.wait()
    assert reported, "the caller did not start its sandbox"
    return reported


LOOP_KINDS = ["asyncio", "uvloop"]


@contextlib.contextmanager
def loop_on_a_thread(kind: str) -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop (the standard library's, or uvloop, the service's) running on a thread of its own, as the
    service's runs beside its worker threads."""
    loop = uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-event-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


T = TypeVar("T")


def run_on(loop: asyncio.AbstractEventLoop, scenario: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """`scenario()` run on `loop` (running on another thread), its result or its exception here."""
    return asyncio.run_coroutine_threadsafe(scenario(), loop).result(timeout_s)


async def next_turn() -> None:
    """Nothing: run on a loop (`run_on`), it returns once the loop has run every callback queued before it."""
