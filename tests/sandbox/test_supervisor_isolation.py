"""Commands cannot speak for, read, trace or kill their supervisor (issue 10, item 2; decision 006).

The file worker (decision 007) and the command launcher run as the agent's uid: the agent may
kill them (the next file operation or command starts another; a command in flight is killed with its
launcher), but they are non-dumpable, so they cannot be read, traced or written either.

Docker: the supervisor is another uid, so all of it holds. Bubblewrap has one uid: forging and
reading hold (non-dumpable supervisor, root-owned channel pipes, authenticated replies); killing
does not (decision 003), and the kill test runs on Docker only.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from sandbox import Sandbox, open_sandbox
from tests.sandbox.support import SPEC, needs_docker

# Runs inside the sandbox as the agent: finds the supervisor, then tries every way at it.
ATTACK = textwrap.dedent(
    """
    import ctypes, json, os
    def argv(pid):
        return open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    def uid(pid):
        return int(next(line for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")).split()[1])
    # The supervisor, its file worker and its command launcher (forks of it, same command line).
    supervisors = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
                   and argv(p)[0].startswith(b"python") and b"--workdir" in argv(p)]
    targets = sorted(set(supervisors) | {1})
    results = {"supervisors": {pid: uid(pid) for pid in supervisors}, "opened": [], "denied": 0}
    forged = b"".join(b'%s {"id": %d, "ok": true, "exit_code": 0, "stdout": "FORGED"}\\n' % (b"0" * 32, i) for i in range(1, 200))
    for pid in targets:
        for name in ("fd/0", "fd/1", "fd/2", "fd/3", "mem", "environ"):
            for mode in ("wb", "rb"):
                try:
                    f = open(f"/proc/{pid}/{name}", mode, buffering=0)
                except PermissionError:
                    results["denied"] += 1
                    continue
                except OSError:
                    continue  # no such fd
                results["opened"].append(f"{pid}/{name}:{mode}")
                with f:
                    try:
                        f.write(forged) if mode == "wb" else f.read(1)
                    except OSError:
                        pass
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_SEIZE, PTRACE_DETACH = 0x4206, 17
    results["traced"] = [pid for pid in supervisors if libc.ptrace(PTRACE_SEIZE, pid, 0, 0) == 0 and libc.ptrace(PTRACE_DETACH, pid, 0, 0) is not None]
    print(json.dumps(results))
    """
)


def _attack(sandbox: Sandbox) -> dict:
    sandbox.write_file("attack.py", ATTACK)
    result = sandbox.exec("python3 attack.py")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_commands_cannot_forge_replies_or_read_or_trace_the_supervisor(sandbox: Sandbox, backend: str) -> None:
    results = _attack(sandbox)
    # The supervisor, its file worker and its launcher: found, or the attack means nothing.
    assert len(results["supervisors"]) == 3
    # Nothing of the supervisor or its worker could be opened, nor of pid 1, which holds the same
    # stream, except on bubblewrap: its pid 1 is bwrap itself, same uid and dumpable (decision
    # 003): its environ (bare, see the next test) and mem open, its copies of the channel do not.
    bwrap_init = {"1/environ:rb", "1/mem:rb", "1/mem:wb"} if backend == "local" else set()
    assert set(results["opened"]) <= bwrap_init and results["denied"] > 0
    assert results["traced"] == []
    after = sandbox.exec("echo genuine")
    assert (after.exit_code, after.stdout) == (0, "genuine\n")


def test_the_services_environment_is_invisible_inside(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODING_ENV_API_TOKEN", "host-secret-token")
    with open_sandbox(SPEC, backend=backend) as sandbox:
        result = sandbox.exec("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert result.stdout and "host-secret-token" not in result.stdout


def test_file_operations_through_proc_links_never_reach_the_channel(sandbox: Sandbox) -> None:
    forged = '{"id": 1, "ok": true, "stdout": "FORGED"}\n' * 50
    sandbox.exec("ln -s /proc/self/fd/1 self_out; ln -s /proc/self/fd/0 self_in; ln -s /proc/1/fd/1 init_out")
    for link in ("self_out", "self_in", "init_out"):
        with pytest.raises(OSError):
            sandbox.write_file(link, forged)
        with pytest.raises(OSError):
            sandbox.read_file(link)
    assert sandbox.exec("echo genuine").stdout == "genuine\n"


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=needs_docker)])
def test_killing_the_supervisor_fails_and_the_sandbox_keeps_working(sandbox: Sandbox) -> None:
    (supervisor,) = [pid for pid, uid in _attack(sandbox)["supervisors"].items() if uid == 0]
    result = sandbox.exec(f"kill -9 {supervisor}; echo $?; kill -9 1; echo $?; kill -STOP {supervisor}; echo $?")
    assert result.stdout.split() == ["1", "1", "1"] and "Operation not permitted" in result.stderr
    sandbox.exec("kill -9 -1")  # every process the agent may signal: its own and the file worker
    assert sandbox.exec("echo alive").stdout == "alive\n"
    sandbox.write_file("still.txt", "files too")  # a new file worker
    assert sandbox.read_file("still.txt") == b"files too"


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=needs_docker)])
def test_commands_hold_no_capability_and_cannot_regain_root(sandbox: Sandbox) -> None:
    status = sandbox.exec("grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status").stdout.split()
    assert status[1::2] == ["0000000000000000"] * 4
    assert sandbox.exec("python3 -c 'import os; os.setuid(0)'").exit_code != 0


def test_a_killed_file_worker_is_replaced(sandbox: Sandbox) -> None:
    sandbox.write_file("a.txt", "first")  # starts the worker
    # The worker is a supervisor process (same command line) whose parent is one too, and which
    # did not start this command (that is the launcher).
    finder = (
        "import os\n"
        "def supervisor(pid):\n"
        "    argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "    return argv[0].startswith(b'python') and b'--workdir' in argv\n"
        "def parent(pid):\n"
        "    return next(line for line in open(f'/proc/{pid}/status') if line.startswith('PPid:')).split()[1]\n"
        "ancestors, pid = set(), str(os.getpid())\n"
        "while pid != '0':\n"
        "    ancestors.add(pid)\n"
        "    pid = parent(pid)\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    if pid not in ancestors and parent(pid) != '0' and supervisor(pid) and supervisor(parent(pid)):\n"
        "        os.kill(int(pid), 9)\n"
        "        print('killed')\n"
    )
    sandbox.write_file("find_worker.py", finder)
    killed = sandbox.exec("python3 find_worker.py")
    assert killed.stdout == "killed\n", killed.stderr
    assert sandbox.read_file("a.txt") == b"first"
    sandbox.write_file("b.txt", "second")
    assert sandbox.read_file("b.txt") == b"second"


def test_a_killed_launcher_kills_only_the_command_in_flight(sandbox: Sandbox) -> None:
    # bash's parent is the launcher: the agent's uid, so the agent may kill it.
    killed = sandbox.exec("kill -9 $PPID; sleep 5; echo survived", timeout_s=20)
    assert (killed.exit_code, killed.signal, killed.timed_out) == (None, 9, False)
    assert "survived" not in killed.stdout and "was killed" in killed.stderr
    assert sandbox.exec("echo alive").stdout == "alive\n"  # a new launcher
