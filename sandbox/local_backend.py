"""Local backend: the same supervisor inside bubblewrap namespaces, for hosts without Docker.

What it gives: new user, pid, mount, ipc, uts and network namespaces (only `lo`), the host's
/usr read-only and a read-only root, private size-limited tmpfs for the workspace and /tmp, no
capabilities, a fresh session (no terminal injection), and death with the thread that started
it. Resource limits are rlimits set by `prlimit`, and when the caller is root the sandbox runs
as the unprivileged host user `nobody` (uid 1000 inside).

How it is weaker than the Docker backend (docs/decisions/003-local-backend-isolation.md):
- Memory is RLIMIT_AS per process, not a cgroup limit on the whole sandbox: N processes may
  use N times the limit, virtual reservations count (some runtimes refuse to start), and a
  breach is an allocation failure, not an OOM kill (`oom_killed` stays False).
- Processes are RLIMIT_NPROC, counted per host uid across every sandbox of that uid (and, for
  a non-root caller, across all of the caller's own processes); it is not a per-sandbox pid cap.
- CPU time is RLIMIT_CPU per process (`spec.cpu_time_s`), the supervisor included; there is
  no CPU share limit, so a busy sandbox slows its neighbours.
- No seccomp filter: the whole host kernel syscall surface is reachable (Docker blocks ~50
  syscalls), and no gVisor.
- The host's /usr and a few /etc files are visible (read-only): installed software, its
  versions, and any site-packages on the host are readable.
- Disk: tmpfs size limits hold, but tmpfs pages are not charged to any memory limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor

from sandbox.base import SandboxError
from sandbox.spec import SandboxSpec
from sandbox.supervised import BASE_ENV, SupervisedSandbox
from sandbox.supervisor import bootstrap_argv

START_TIMEOUT_S = 30.0
"""Limit on start-up until the supervisor answers its first ping."""

UNPRIVILEGED_UID = 65534
"""Host uid (nobody) a root caller drops to, so rlimits apply and an escape is not root."""

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Top-level entries that are symlinks into /usr on merged-/usr systems, or directories otherwise.
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# /etc entries programs need to run (dynamic linker, CA bundle, time zone); nothing else of /etc.
_ETC_ENTRIES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "ssl", "ca-certificates", "nsswitch.conf", "hosts", "mime.types")

# --die-with-parent fires when the *thread* that forked bwrap exits, so every sandbox is
# spawned from this one long-lived thread rather than from short-lived request threads.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bwrap-spawner")


def bwrap_argv(spec: SandboxSpec) -> list[str]:
    """The bubblewrap command line (without the command to run inside) for `spec`."""
    uid, _, gid = spec.user.partition(":")
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if spec.network:
        argv.append("--share-net")
    argv += ["--uid", uid, "--gid", gid or uid, "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for entry in _ETC_ENTRIES:
        argv += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    for path in spec.host_paths:
        argv += ["--ro-bind", path, path]
    for name in spec.removed_binaries:
        for directory in ("/usr/local/bin", "/usr/bin", "/usr/sbin"):
            if os.path.exists(f"{directory}/{name}"):
                argv += ["--ro-bind", "/dev/null", f"{directory}/{name}"]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(spec.tmp_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp",
        "--size", str(spec.workspace_mb * 2**20), "--perms", "0755", "--tmpfs", spec.workdir,
        "--remount-ro", "/",
        "--chdir", spec.workdir,
        "--clearenv",
    ]  # fmt: skip
    for key, value in {"PATH": SANDBOX_PATH, **BASE_ENV}.items():
        argv += ["--setenv", key, value]
    return argv


def limits_argv(spec: SandboxSpec) -> list[str]:
    """`prlimit` (and, for a root caller, `setpriv`) prefix that applies the spec's rlimits."""
    argv = [
        "prlimit",
        f"--as={spec.memory_mb * 2**20}",
        f"--nproc={spec.pids}",
        f"--nofile={spec.nofile}",
        f"--cpu={spec.cpu_time_s}",
        "--",
    ]
    if os.geteuid() == 0:
        argv += ["setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups", "--"]
    return argv


class LocalSandbox(SupervisedSandbox):
    """A sandbox in bubblewrap namespaces on this host; starts on construction."""

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec, uuid.uuid4().hex[:16])
        if shutil.which("bwrap") is None:
            raise SandboxError("the local backend needs bubblewrap (`bwrap`) on PATH")
        self._stderr = tempfile.TemporaryFile()  # supervisor's own stderr, for error messages
        argv = limits_argv(spec) + bwrap_argv(spec) + ["--"] + bootstrap_argv(spec.workdir)
        self._process: subprocess.Popen[bytes] | None = _spawner.submit(
            subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        ).result()
        try:
            self._connect(self._process.stdout.read1, self._write, self._describe_failure, START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        """Host pid of the outer bwrap process."""
        return self._process.pid if self._process else None

    def _write(self, data: bytes) -> None:
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def _describe_failure(self) -> str:
        if self._process is None:
            return "sandbox was closed"
        code = self._process.poll()
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 2000))
        stderr = self._stderr.read().decode(errors="replace").strip()
        return "; ".join(part for part in (f"bwrap exited with {code}" if code is not None else "", stderr) if part)

    def close(self) -> None:
        if self._process is None:
            return
        process, self._process = self._process, None
        self._channel = None
        try:
            process.stdin.close()  # supervisor sees EOF, kills its commands and exits
        except BrokenPipeError:
            pass  # it is gone already
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
        self._stderr.close()
