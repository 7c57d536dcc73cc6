"""Local backend: the same supervisor inside bubblewrap namespaces, for hosts without Docker.

What it gives: new user, pid, mount, ipc, uts and network namespaces (only `lo`), the host's
/usr read-only and a read-only root, private size-limited tmpfs for the workspace and /tmp, no
capabilities, a fresh session (no terminal injection), and death with the thread that started
it. Resource limits are rlimits set by `prlimit`, and when the caller is root each sandbox runs
as its own unprivileged host uid from `HOST_UIDS` (uid 1000 inside).

How it is weaker than the Docker backend (docs/decisions/003-local-backend-isolation.md):
- Memory is RLIMIT_AS per process, not a cgroup limit on the whole sandbox: N processes may
  use N times the limit, virtual reservations count (some runtimes refuse to start), and a
  breach is an allocation failure, not an OOM kill (`oom_killed` stays False).
- Processes are RLIMIT_NPROC, counted per host uid and including threads: per sandbox for a
  root caller (one uid each), but for a non-root caller shared by all its sandboxes and all
  of the caller's own processes.
- CPU time is RLIMIT_CPU per process (`spec.cpu_time_s`), the supervisor included; there is
  no CPU share limit, so a busy sandbox slows its neighbours.
- No seccomp filter: the whole host kernel syscall surface is reachable (Docker blocks ~50
  syscalls), and no gVisor.
- The host's /usr and a few /etc files are visible (read-only): installed software, its
  versions, and any site-packages on the host are readable.
- Disk: tmpfs size limits hold, but tmpfs pages are not charged to any memory limit.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from sandbox.base import FailureReport, SandboxError
from sandbox.channel import READ_BYTES, SupervisorStreams
from sandbox.deployment import BASE_ENV, INBOX_MOUNT, Deployment
from sandbox.spec import LocalSpec
from sandbox.supervisor import bootstrap_argv

HOST_UIDS = range(200_000, 265_536)
"""Host uids a root caller's sandboxes run as, one per live sandbox: an escape is not root,
and RLIMIT_NPROC, which the kernel counts per uid (and ignores for root), is per sandbox."""

HOST_UID_LEASES = Path("/run/coding-env/host-uids")
"""A lock file per host uid, held (`flock`) for the life of the sandbox that runs as it: the sandboxes
of every process on the host (replicas of the service, two test runs) get distinct uids, and the
kernel releases a dead process's leases with it, when its sandboxes die too (--die-with-parent)."""

_host_uids_lock = threading.Lock()
_host_uid_leases: dict[int, int] = {}  # this process's leased uids and their lock files' descriptors

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Top-level entries that are symlinks into /usr on merged-/usr systems, or directories otherwise.
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# /etc entries programs need to run (dynamic linker, CA bundle, time zone); nothing else of /etc.
_ETC_ENTRIES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "ssl", "ca-certificates", "nsswitch.conf", "hosts", "mime.types")

# --die-with-parent fires when the *thread* that forked bwrap exits, so every sandbox is
# spawned from this one long-lived thread rather than from short-lived request threads.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bwrap-spawner")


def bwrap_argv(spec: LocalSpec, inbox_dir: Path | None = None, program: str = "bwrap") -> list[str]:
    """The bubblewrap command line (without the command to run inside) for `spec`, with
    `inbox_dir` bound read-only at `INBOX_MOUNT` when given."""
    uid, _, gid = spec.user.partition(":")
    argv = [program, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
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
    if inbox_dir is not None:
        argv += ["--ro-bind", str(inbox_dir), INBOX_MOUNT]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        # bwrap's /dev is an unbounded tmpfs: bound /dev/shm like the other writable places.
        "--size", str(spec.shm_mb * 2**20), "--perms", "1777", "--tmpfs", "/dev/shm",
        "--size", str(spec.tmp_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp",
        "--size", str(spec.workspace_mb * 2**20), "--perms", "0755", "--tmpfs", spec.workdir,
        "--remount-ro", "/",
        "--chdir", spec.workdir,
        "--clearenv",
    ]  # fmt: skip
    for key, value in {"PATH": SANDBOX_PATH, **BASE_ENV}.items():
        argv += ["--setenv", key, value]
    return argv


def _acquire_host_uid() -> int:
    """The first host uid no process on the host holds, leased to the caller until `_release_host_uid`."""
    with _host_uids_lock:
        HOST_UID_LEASES.mkdir(mode=0o700, parents=True, exist_ok=True)
        for uid in HOST_UIDS:
            if uid in _host_uid_leases:
                continue
            lease = os.open(HOST_UID_LEASES / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lease)  # another process's sandbox runs as it
                continue
            _host_uid_leases[uid] = lease
            return uid
    raise SandboxError(f"all {len(HOST_UIDS)} host uids are leased to running sandboxes")


def _release_host_uid(uid: int) -> None:
    with _host_uids_lock:
        os.close(_host_uid_leases.pop(uid))  # closing the only descriptor releases the lock


def limits_argv(spec: LocalSpec, host_uid: int | None) -> list[str]:
    """`prlimit` prefix that applies the spec's rlimits, then `setpriv` to `host_uid` if given."""
    argv = [
        "prlimit",
        f"--as={spec.memory_mb * 2**20}",
        f"--nproc={spec.pids}",
        f"--nofile={spec.nofile}",
        f"--cpu={spec.cpu_time_s}",
        "--",
    ]
    if host_uid is not None:
        argv += ["setpriv", f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--"]
    return argv


class LocalDeployment(Deployment):
    """A sandbox in bubblewrap namespaces on this host; `stop()` ends it."""

    default_start_timeout_s = 30.0

    def __init__(self, spec: LocalSpec, start_timeout_s: float | None = None):
        super().__init__(spec, start_timeout_s)
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None  # supervisor's own stderr, for error messages
        self.host_uid: int | None = None
        """Host uid the sandbox runs as when the caller is root (None: the caller's own uid)."""

    @property
    def pid(self) -> int | None:
        """Host pid of the outer bwrap process."""
        return self._process.pid if self._process else None

    def fresh(self) -> LocalDeployment:
        return LocalDeployment(self.spec, self.start_timeout_s)

    def start(self) -> SupervisorStreams:
        # Resolved on the service's PATH: the sandbox starts with a bare one (below), on which
        # `setpriv` would look for bwrap again and miss one the service was given (decision 117).
        program = shutil.which("bwrap")
        if program is None:
            raise SandboxError("the local backend needs bubblewrap (`bwrap`) on PATH")
        self._stderr = tempfile.TemporaryFile()
        self.host_uid = _acquire_host_uid() if os.geteuid() == 0 else None
        self._create_inbox()
        argv = limits_argv(self.spec, self.host_uid) + bwrap_argv(self.spec, self.inbox_dir, program) + ["--"] + bootstrap_argv(self.spec.workdir)
        # bwrap stays in the sandbox as its pid 1, whose /proc/1/environ the agent can read:
        # it gets a bare environment, never the service's (tokens, API keys).
        self._process = _spawner.submit(
            subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env={"PATH": SANDBOX_PATH}
        ).result()
        # Read unbuffered: bytes buffered above the descriptor would wait unseen by a loop that polls it. And
        # read through the file, not its number: once `stop` closed it, a read fails instead of reading
        # whatever file reuses the number.
        stdout = self._process.stdout.raw

        def read() -> bytes | None:
            data = stdout.read(READ_BYTES)
            # None: nothing there though polled readable (libuv makes a descriptor it polls non-blocking).
            return b"" if data is None else data or None

        return SupervisorStreams(read, self._write, stdout.fileno(), self._describe_failure)

    def _write(self, data: bytes) -> None:
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def _describe_failure(self) -> FailureReport:
        if self._process is None or self._stderr is None or self._stderr.closed:
            return FailureReport("sandbox was closed")
        code = self._process.poll()
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 2000))
        stderr = self._stderr.read().decode(errors="replace").strip()
        # A memory limit breach here is an allocation failure inside the sandbox, never an OOM kill.
        return FailureReport("; ".join(part for part in (f"bwrap exited with {code}" if code is not None else "", stderr) if part))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            self._stop(process)
        if self._stderr is not None:
            self._stderr.close()
        if self.host_uid is not None:
            _release_host_uid(self.host_uid)
            self.host_uid = None
        self._remove_inbox()

    @staticmethod
    def _stop(process: subprocess.Popen[bytes]) -> None:
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
