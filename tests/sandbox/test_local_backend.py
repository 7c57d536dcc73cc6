"""Local (bubblewrap) backend specifics: rlimits, unprivileged host uid, death with the caller."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.local_backend import UNPRIVILEGED_UID, LocalSandbox
from tests.sandbox.conftest import SPEC, needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture
def local_sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(SPEC) as sb:
        yield sb


def _wait_exit(pid: int) -> None:
    """Block until process `pid` (not our child) has exited, by its pidfd."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([pidfd], [], [], 60)
        assert ready, f"process {pid} is still running"
    finally:
        os.close(pidfd)


def test_rlimits_apply_inside(local_sandbox: LocalSandbox) -> None:
    limits = local_sandbox.exec("ulimit -v; ulimit -u; ulimit -n; ulimit -t").stdout.split()
    assert limits == [str(SPEC.memory_mb * 1024), str(SPEC.pids), str(SPEC.nofile), str(SPEC.cpu_time_s)]


def test_memory_beyond_the_limit_fails_to_allocate(local_sandbox: LocalSandbox) -> None:
    result = local_sandbox.exec("python3 -c 'x = b\"x\" * (2 * 1024**3)'")
    assert result.exit_code == 1 and "MemoryError" in result.stderr
    assert local_sandbox.exec("echo alive").stdout == "alive\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop applies to root callers")
def test_a_root_caller_runs_the_sandbox_as_an_unprivileged_host_user(local_sandbox: LocalSandbox) -> None:
    children = Path(f"/proc/{local_sandbox.pid}/task/{local_sandbox.pid}/children").read_text().split()
    for pid in [local_sandbox.pid, *map(int, children)]:
        uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
        assert uids.split()[1:] == [str(UNPRIVILEGED_UID)] * 4


def test_a_killed_caller_takes_the_sandbox_with_it() -> None:
    caller = textwrap.dedent(
        """
        import threading
        from sandbox.local_backend import LocalSandbox
        from tests.sandbox.conftest import SPEC
        sb = LocalSandbox(SPEC)
        threading.Thread(target=sb.exec, args=("touch started; sleep 1000",), daemon=True).start()
        while sb.exec("test -f started").exit_code != 0:
            pass
        print(sb.pid, flush=True)
        threading.Event().wait()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        bwrap_pid = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    _wait_exit(bwrap_pid)
