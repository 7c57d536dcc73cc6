"""Local (bubblewrap) backend specifics: rlimits, unprivileged host uid, death with the caller."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import Sandbox, open_sandbox
from sandbox.local_backend import HOST_UIDS
from tests.sandbox.support import LOCAL_SPEC as SPEC
from tests.sandbox.support import kill_caller_mid_command, needs_bwrap

REPO = Path(__file__).resolve().parents[2]
pytestmark = needs_bwrap
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the host uid drop applies to root callers")


@pytest.fixture
def local_sandbox() -> Iterator[Sandbox]:
    with open_sandbox(SPEC) as sb:
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


def test_rlimits_apply_inside(local_sandbox: Sandbox) -> None:
    limits = local_sandbox.exec("ulimit -v; ulimit -u; ulimit -n; ulimit -t").stdout.split()
    assert limits == [str(SPEC.memory_mb * 1024), str(SPEC.pids), str(SPEC.nofile), str(SPEC.cpu_time_s)]


def test_memory_beyond_the_limit_fails_to_allocate(local_sandbox: Sandbox) -> None:
    result = local_sandbox.exec("python3 -c 'x = b\"x\" * (2 * 1024**3)'")
    assert result.exit_code == 1 and "MemoryError" in result.stderr
    assert local_sandbox.exec("echo alive").stdout == "alive\n"


@root_only
def test_a_root_caller_runs_the_sandbox_as_an_unprivileged_host_uid(local_sandbox: Sandbox) -> None:
    children = Path(f"/proc/{local_sandbox.deployment.pid}/task/{local_sandbox.deployment.pid}/children").read_text().split()
    assert local_sandbox.deployment.host_uid in HOST_UIDS
    for pid in [local_sandbox.deployment.pid, *map(int, children)]:
        uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
        assert uids.split()[1:] == [str(local_sandbox.deployment.host_uid)] * 4


@root_only
def test_each_sandbox_of_a_root_caller_gets_its_own_host_uid(local_sandbox: Sandbox) -> None:
    with open_sandbox(SPEC) as other:
        assert other.deployment.host_uid != local_sandbox.deployment.host_uid


@root_only
def test_another_processs_sandboxes_get_other_host_uids(local_sandbox: Sandbox) -> None:
    """Two service processes on one host (replicas, or two test runs) never share a host uid: a sandbox of
    another process skips the uid this one holds, and gets it once this process's sandbox is gone."""
    caller = (
        "from sandbox import open_sandbox\nfrom tests.sandbox.support import LOCAL_SPEC\n"
        "with open_sandbox(LOCAL_SPEC) as sb:\n    print(sb.deployment.host_uid)\n"
    )

    def other_process_uid() -> int:
        done = subprocess.run([sys.executable, "-c", caller], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    held = local_sandbox.deployment.host_uid
    assert other_process_uid() != held
    local_sandbox.close()
    assert other_process_uid() == held  # the lowest free uid again: the lease went with the sandbox


def test_a_killed_caller_takes_the_sandbox_with_it() -> None:
    _wait_exit(int(kill_caller_mid_command("local", "deployment.pid")))
