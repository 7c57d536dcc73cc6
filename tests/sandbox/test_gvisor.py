"""The Docker backend under gVisor (`runtime="runsc"`), where the engine has it registered.

`.ci/run` registers runsc when Debian's package installs; elsewhere these tests skip.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxError, open_sandbox
from tests.sandbox.support import GVISOR_SPEC, docker_ready


@functools.cache
def runsc_registered() -> bool:
    if not docker_ready():
        return False
    from sandbox.docker_backend import default_client

    return "runsc" in default_client().info().get("Runtimes", {})


pytestmark = [pytest.mark.docker, pytest.mark.skipif(not runsc_registered(), reason="no runsc runtime registered with Docker")]



@pytest.fixture
def gvisor_sandbox() -> Iterator[Sandbox]:
    with open_sandbox(GVISOR_SPEC, backend="docker") as sandbox:
        yield sandbox


def test_commands_run_on_gvisors_kernel(gvisor_sandbox: Sandbox) -> None:
    result = gvisor_sandbox.exec("dmesg 2>/dev/null | head -1; python3 -c 'print(6 * 7)'")
    assert result.exit_code == 0
    assert "gVisor" in result.stdout and result.stdout.rstrip().endswith("42")


def test_timeout_kills_the_group_without_pidfds(gvisor_sandbox: Sandbox) -> None:
    result = gvisor_sandbox.exec("echo partial; sleep 1000 & while true; do :; done", timeout_s=1)
    assert result.timed_out and result.stdout == "partial\n"
    assert gvisor_sandbox.exec("ps -e -o comm= | grep -c sleep").stdout.strip() == "0"


def test_only_loopback_and_files_round_trip(gvisor_sandbox: Sandbox) -> None:
    assert gvisor_sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split() == ["lo"]
    gvisor_sandbox.write_file("pkg/a.py", "x = 1\n")
    assert gvisor_sandbox.read_file("pkg/a.py") == b"x = 1\n"


def test_a_memory_bomb_is_reported_as_oom() -> None:
    # gVisor's sentry shares the container's cgroup, so the OOM killer may take the whole
    # sandbox instead of the command: either way the caller is told it was memory.
    with open_sandbox(GVISOR_SPEC, backend="docker") as sandbox:
        try:
            result = sandbox.exec("python3 -c 'x = b\"x\" * (2 * 1024**3)'", timeout_s=30)
        except SandboxError as exc:
            assert "OOM" in str(exc)
        else:
            assert result.oom_killed
