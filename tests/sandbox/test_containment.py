"""Bad input stays inside the sandbox (issue 2, section 3)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sandbox import Sandbox, SandboxSpec, open_sandbox
from tests.sandbox.support import SPEC, needs_docker


def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    # The leader spins so the bomb grows until the timeout, not just until the leader exits.
    result = sandbox.exec("bomb() { bomb | bomb & }; bomb; while true; do :; done", timeout_s=3)
    assert result.timed_out
    assert "Resource temporarily unavailable" in result.stderr, "the process limit was never hit"
    after = sandbox.exec("echo alive; ls /proc | grep -c '^[0-9]'")
    assert after.stdout.startswith("alive\n")
    assert int(after.stdout.split()[1]) < 20, "bomb processes outlived the command"


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=needs_docker)])
def test_memory_bomb_is_oom_killed_and_the_sandbox_survives(sandbox: Sandbox) -> None:
    result = sandbox.exec("python3 -c 'x = b\"x\" * (2 * 1024**3)'", timeout_s=30)
    assert result.oom_killed and result.signal == 9
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_filling_the_workspace_fails_with_enospc_inside(sandbox: Sandbox) -> None:
    size_mb = sandbox.spec.workspace_mb
    result = sandbox.exec(f"dd if=/dev/zero of=fill bs=1M count={size_mb * 2}")
    assert result.exit_code != 0 and "No space left on device" in result.stderr
    assert sandbox.exec("rm fill && echo freed > note && cat note").stdout == "freed\n"


def test_filling_every_writable_place_gives_enospc_and_the_sandbox_lives(backend: str) -> None:
    # The case: the tmpfs sizes alone reach the memory limit (256 MB each).
    with open_sandbox(SandboxSpec(memory_mb=256, pids=128), backend=backend) as sandbox:
        for place in (sandbox.spec.workdir, "/tmp", "/dev/shm"):
            result = sandbox.exec(f"head -c 20G /dev/zero > {place}/fill.bin", timeout_s=60)
            assert result.exit_code != 0 and "No space left on device" in result.stderr, place
            assert not result.oom_killed
        assert sandbox.exec("echo alive").stdout == "alive\n"
        # With every tmpfs full, processes still have their whole memory_mb.
        result = sandbox.exec("python3 -c 'x = bytearray(128 * 1024 * 1024); print(len(x))'")
        assert result.stdout == f"{128 * 1024 * 1024}\n", result.stderr


def test_the_root_filesystem_is_read_only(sandbox: Sandbox) -> None:
    for path in ("/evil", "/usr/bin/evil", "/etc/evil"):
        result = sandbox.exec(f"echo x > {path}")
        assert result.exit_code != 0, path
        assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr


def test_only_the_loopback_interface_exists(sandbox: Sandbox) -> None:
    devices = sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()
    assert devices == ["lo"]


def test_host_files_and_the_docker_socket_are_invisible(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = Path("/tmp") / f"coding-env-secret-{uuid.uuid4().hex}"
    secret.write_text("host secret")
    try:
        assert sandbox.exec(f"cat {secret}").exit_code != 0
        assert sandbox.exec(f"cat {Path(__file__).resolve()}").exit_code != 0
        assert sandbox.exec("ls /var/run/docker.sock /run/docker.sock").exit_code != 0
        assert sandbox.exec("cat /root/.bash_history /etc/shadow").exit_code != 0
    finally:
        secret.unlink()


def test_removed_introspection_binaries_cannot_run(sandbox: Sandbox) -> None:
    result = sandbox.exec("for tool in od xxd strings objdump readelf; do $tool --version >/dev/null 2>&1 && echo $tool; done")
    assert result.stdout == ""


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=needs_docker)])
def test_image_holds_bytecode_only_for_its_own_python_and_the_tools_agents_need(sandbox: Sandbox) -> None:
    # Decision 137: the image's own Python (its `sys.path` under /usr) is compiled at build; nothing else is.
    sandbox.write_file("strays.py", (
        "import sys\n"
        "roots = tuple(p + '/' for p in sys.path if p.startswith('/usr'))\n"
        "found = sys.stdin.read().split()\n"
        "print(len(found), *(p for p in found if not p.startswith(roots)))\n"
    ))
    counted = sandbox.exec("find / -xdev \\( -name '*.pyc' -o -name __pycache__ \\) 2>/dev/null | python3 strays.py").stdout.split()
    assert int(counted[0]) > 0 and counted[1:] == []
    tools = sandbox.exec("python3 -m pytest --version; git --version")
    assert tools.exit_code == 0 and tools.stdout.startswith("pytest ") and "git version" in tools.stdout


def test_a_sandbox_outlives_nothing_after_close(backend: str) -> None:
    sb = open_sandbox(SPEC, backend=backend)
    sb.exec("true")
    sb.close()
    sb.close()  # idempotent
    assert not sb.is_alive()
    with pytest.raises(Exception, match="closed"):
        sb.exec("true")


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        SandboxSpec(memory_mb=0)
    with pytest.raises(ValueError):
        open_sandbox(SPEC, backend="vm")  # type: ignore[arg-type]
