"""In-sandbox supervisor: runs commands and moves files for the host, over JSON lines.

Standard library only: it runs on whatever `python3` the sandbox has. The host sends this
file's source, and its own compilation of it, over stdin at start-up (see
`sandbox.supervisor.bootstrap_argv`), then one JSON
request per line; every request carries an `id` and every reply echoes it, so requests may be
served concurrently (a thread each) and a slow command never blocks a `ping`.

Request:  {"id": 7, "op": "exec", "cmd": "pytest -q", "timeout_s": 30, "env": {}, "output_cap": 65536}
Reply:    MAC {"id": 7, "ok": true, "exit_code": 0, "signal": null, "stdout": "...", ...}
Failure:  MAC {"id": 7, "ok": false, "error": "FileNotFoundError", "message": "..."}

File contents and archives travel as raw bytes right after their line, never inside the JSON
(decision 011): a line with `"payload_bytes": N` is followed by exactly N bytes; a reply's line
also carries `"payload_mac"`, the MAC of those bytes.

Request:  {"id": 8, "op": "put_archive", "dest": ".", "payload_bytes": 10240}\n<10240 bytes>
Request:  {"id": 9, "op": "put_archive", "dest": ".", "from_file": "/run/inbox/f0c1.tar"}   (no payload)
Request:  {"id": 10, "op": "get_archive", "path": ".", "max_bytes": 99, "to_file": "/run/inbox/f0c1.tar"}
          (the supervisor writes the archive there instead of replying with it)
Reply:    MAC {"id": 9, "ok": true, "payload_bytes": 3, "payload_mac": "..."}\n<3 bytes>

MAC is the hex keyed BLAKE2b of the JSON (or of the payload) under the key the host sends as
the first line after the source. The agent's code never runs as this process's identity (decision 006): with
`--run-as UID:GID` (Docker: the supervisor is root with only SETUID, SETGID and KILL) every
command and every file operation runs in a child that dropped to that uid, so commands can
neither signal, trace nor read this process nor open its channel; without it (bubblewrap, one
uid) the supervisor at least makes itself non-dumpable, which denies ptrace and /proc/PID/mem.
File operations always run in a forked worker with the agent's rights and a deadline: an
agent's FIFO, symlink into /proc/self or 4 GB sparse file can fail that operation, never the
supervisor.

When stdin reaches EOF (the host closed the channel or died) every running command's
process group is killed and the supervisor exits, which ends the sandbox.
"""

import ctypes
import errno
import functools
import io
import json
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
import warnings
from _blake2 import blake2b  # what `hashlib.blake2b` is, without loading OpenSSL (`_hashlib`, 3-4 ms of a cold start)
from _queue import SimpleQueue  # what `queue.SimpleQueue` is, without importing `queue` on the cold start's path

# `subprocess` and `tarfile` (with shutil, bz2 and lzma behind it) are imported where archives are
# handled, not here: loading them was about a third of the supervisor's imports, all on a cold
# start's path to the first ping. Each process loads them once, off that path: the supervisor
# right after dispatching its first request (`Supervisor.serve`), the file worker when it starts.

PROTOCOL_VERSION = 3
READ_CHUNK = 65536
MAC_BYTES = 16

FILE_OP_DEADLINE_S = 50.0  # the file worker is killed when one operation takes longer (the host waits 60 s)
TAR_MEMBER_OVERHEAD = 1536  # header, padding and a long name's PAX record, counted against max_bytes with the name
TAR_RECORD = 10240  # tar pads its output to whole records of this size
SMALL_ARCHIVE_BYTES = 256 * 1024  # sent archives up to this size unpack with tarfile, larger ones with GNU tar

# Prefixed to every command. First the command reports its own pid on its status pipe (fd 3,
# see LaunchedCommand) and closes it, before any of the agent's code runs: a command that kills
# its launcher at once (`kill -9 -1`) is still known and killed as a group. Then it makes its
# processes, not the supervisor, the OOM killer's first choice: a process may raise its own score
# without privilege; the supervisor (root on Docker, without CAP_DAC_OVERRIDE) may not write the
# file of a process of another uid.
COMMAND_PREFIX = "echo pid $$ >&3; exec 3>&-; { echo 1000 >/proc/self/oom_score_adj; } 2>/dev/null || :; "  # `$?` is 0 for CMD

# The program every command runs in: bash, statically linked where the sandbox has Debian's bash-static
# (decision 139). The same bash, started without loading libraries: 0.85-0.9 ms against 1.2-1.6 ms for a
# `bash -c true` on a 2-core VM. It runs as `bash` (argv[0]), so `$0`, `$BASH` and every message read as
# they do for /usr/bin/bash. None: bash from PATH.
STATIC_BASH = next((path for path in ("/usr/bin/bash-static", "/bin/bash-static") if os.access(path, os.X_OK)), None)

# Fixed for every command: no pager or editor may wait for a terminal, no bytecode is written.
COMMAND_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "true",
    "EDITOR": "true",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TERM": "dumb",
}


class CappedOutput:
    """Keeps the first and the last bytes of a stream within `cap`, counting what it drops."""

    def __init__(self, cap):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk):
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def dropped(self):
        return self.total - len(self.head) - len(self.tail)

    def text(self):
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if self.dropped:
            return f"{head}\n[... {self.dropped} bytes truncated ...]\n{tail}"
        return head + tail


@functools.cache
def oom_counter():
    """The file that counts this sandbox's OOM kills, on a `oom_kill N` line: cgroup v2's, else
    v1's; None when there is neither. Looked up once: every command reads it twice."""
    return next((path for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control") if os.path.exists(path)), None)


def oom_kill_count():
    """Number of OOM kills in this sandbox's memory cgroup so far (None if not readable)."""
    path = oom_counter()
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            counters = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    for line in counters.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"oom_kill":
            return int(value)
    return None


GROUP_EXIT_WAIT_S = 2.0  # bound on waiting for killed processes to be reaped


def kill_group(pgid, wait=True):
    """SIGKILL every process of the group and, with `wait`, wait (boundedly) until they are all
    reaped, so that when a command returns none of its processes is left. None: a command killed
    before its first statement reported its pid (by another command), with no process left."""
    if pgid is None:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    if not wait:
        return
    give_up = time.monotonic() + GROUP_EXIT_WAIT_S
    while time.monotonic() < give_up:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.002)


class TooLarge(Exception):
    """A transfer over the caller's bound; `name` is the host's exception class."""

    def __init__(self, name, message):
        super().__init__(message)
        self.name = name


def error_reply(exc):
    """The failure fields of a reply for `exc` (the host rebuilds OSError subclasses by errno)."""
    if isinstance(exc, TooLarge):
        return {"ok": False, "error": exc.name, "message": str(exc)}
    if isinstance(exc, OSError) and exc.errno is not None:
        filename = exc.filename if isinstance(exc.filename, str) else None
        return {"ok": False, "error": type(exc).__name__, "errno": exc.errno, "message": exc.strerror or str(exc), "filename": filename}
    return {"ok": False, "error": type(exc).__name__, "message": str(exc)}


def make_non_dumpable():
    """PR_SET_DUMPABLE 0: processes of the same uid can no longer ptrace this one or open its
    /proc/PID/{mem,environ,fd/*} (forked children inherit it until they exec)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass  # no libc to call: the uid split (Docker) still holds


class Handlers:
    """Threads that serve requests, each request on a thread of its own (a long command never
    holds up a `ping`), kept for the next request when done: starting a thread per request cost
    about 15 system calls (clone, its stack's mmap and munmap, signal masks), a sizeable part of
    what the supervisor spends on an `exec true`. A request finds an idle thread or starts one;
    `idle` counts the threads that will take a request without one being started."""

    def __init__(self, handle):
        self.handle = handle
        self.requests = SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, *request):
        with self.lock:
            start = self.idle == 0
            if not start:
                self.idle -= 1
        self.requests.put(request)
        if start:
            threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            self.handle(*self.requests.get())
            with self.lock:
                self.idle += 1


class Supervisor:
    def __init__(self, workdir, key, run_as):
        self.key = key
        self.run_as = run_as  # (uid, gid) commands and file operations run as; None: our own
        self.file_worker = FileWorker(workdir, run_as)
        # Both forked now, while the sandbox waits in the warm pool, not at the first use: that is
        # often on a request's path (a reset's files, a fork's copy, the first command).
        self.file_worker.start()
        self.launcher = CommandLauncher(run_as)
        self.launcher.start()
        self.write_lock = threading.Lock()
        self.handlers = Handlers(self.handle)
        self.running = set()  # process group ids of commands in flight
        self.running_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------

    def mac(self, data):
        return blake2b(data, key=self.key, digest_size=MAC_BYTES).hexdigest()

    def reply(self, message):
        self.send(json.dumps(message).encode())

    def send(self, body, payload=b""):
        """Write one reply: the MAC of the JSON body, a space, the body, a newline, then the
        payload's bytes (`body` then names their count and MAC; see `payload_fields`)."""
        line = self.mac(body).encode() + b" " + body + b"\n"
        with self.write_lock:
            sys.stdout.buffer.write(line)
            if payload:
                sys.stdout.buffer.write(payload)
            sys.stdout.buffer.flush()

    def payload_fields(self, payload):
        """The JSON fields that announce `payload` (spliced into a reply's object)."""
        if not payload:
            return b""
        return b'"payload_bytes": %d, "payload_mac": "%s", ' % (len(payload), self.mac(payload).encode())

    def serve(self):
        stdin = sys.stdin.buffer
        while line := stdin.readline():
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                # The payload must be consumed here, in order, before the next line is read.
                size = request.get("payload_bytes", 0) if isinstance(request, dict) else 0
                if not isinstance(size, int) or size < 0:
                    raise ValueError("'payload_bytes' must be a non-negative integer")
                payload = stdin.read(size) if size else b""
            except ValueError as exc:
                request, payload = exc, b""
            self.handlers.submit(request, payload)
            # put_sealed_archive's module, loaded right after the first request (the start's ping)
            # went to its thread and before the next line is read, so that no request can fork a
            # worker while the import holds a lock the child would inherit. Later lines find it loaded.
            import tarfile  # noqa: F401
        # The host is gone: nothing may outlive the channel.
        with self.running_lock:
            for pgid in self.running:
                kill_group(pgid)

    def handle(self, request, payload):
        """Serve one parsed request (or the ValueError its line raised) and write its reply."""
        request_id = None
        try:
            if isinstance(request, ValueError):
                raise request
            request_id = request.get("id") if isinstance(request, dict) else None
            if not isinstance(request_id, int):
                raise ValueError("a request needs an integer 'id'")
            op_name = str(request.get("op"))
            if op_name in FILE_OPS:
                fields, result = self.file_worker.run(json.dumps(request).encode(), payload)
                if request.get("to_file") and fields.startswith(b'{"ok": true'):
                    write_new_file(request["to_file"], result)
                    result = b""
                # The worker's JSON object is spliced, not re-parsed.
                self.send(b'{"id": %d, ' % request_id + self.payload_fields(result) + fields[1:], result)
                return
            if op_name == "put_sealed_archive":
                result = self.op_put_sealed_archive(request, payload)
            elif op_name in ("ping", "exec"):
                result = getattr(self, "op_" + op_name)(request)
            else:
                raise ValueError(f"unknown op {op_name!r}")
            self.reply({"id": request_id, "ok": True, **result})
        except Exception as exc:  # every failure becomes a typed reply; the loop must survive
            self.reply({"id": request_id, **error_reply(exc)})

    # -- operations -----------------------------------------------------------------------

    def op_ping(self, request):
        return {"protocol": PROTOCOL_VERSION, "pid": os.getpid()}

    def op_exec(self, request):
        cap = int(request.get("output_cap", 65536))
        timeout_s = float(request["timeout_s"])
        env = {**os.environ, **COMMAND_ENV, **request.get("env", {})}
        oom_before = oom_kill_count()
        started = time.monotonic()
        command = self.launcher.launch(["bash", "-c", COMMAND_PREFIX + request["cmd"]], env, executable=STATIC_BASH)
        with self.running_lock:
            self.running.add(command.pid)
        try:
            stdout, stderr, timed_out, wait_status = self.collect(command, timeout_s, cap)
        finally:
            with self.running_lock:
                self.running.discard(command.pid)
            command.close()
        duration_ms = (time.monotonic() - started) * 1000
        oom_after = oom_kill_count()
        if wait_status is None:
            # The agent killed or stopped the launcher (same uid; `kill -9 -1` does): the command's
            # status is lost, collect() has killed its group, and the next command gets a new
            # launcher (reaped now, so that it is not taken for alive while it exits).
            self.launcher.replace(command.launcher_pid)
            if not timed_out:
                stderr.feed(LAUNCHER_KILLED_NOTE)
        code = -signal.SIGKILL if wait_status is None else os.waitstatus_to_exitcode(wait_status)
        return {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "timed_out": timed_out,
            "truncated": bool(stdout.dropped or stderr.dropped),
            "oom_killed": oom_before is not None and oom_after is not None and oom_after > oom_before,
            "duration_ms": duration_ms,
        }

    def op_put_sealed_archive(self, request, payload):
        """Extract the host's archive into a new directory, as this process's own identity, so
        that commands (another uid, decision 058) can neither change, remove, rename nor add
        anything there. Only where commands run as another uid; the bubblewrap backend has one."""
        if self.run_as is None:
            raise SealingUnavailable("this sandbox runs commands as the supervisor's own uid: nothing it writes is out of their reach")
        extract_sealed(payload, str(request["dest"]))
        return {}

    def collect(self, command, timeout_s, cap):
        """Drain both pipes until the leader exits, enforcing the timeout on the whole group;
        the output, whether it timed out, and the leader's wait status (None if unknown).

        The group is killed when its leader exits, so background children (`sleep 1000 &`)
        never outlive the command; a daemon must `setsid` and redirect its output to survive.
        """
        stdout, stderr = CappedOutput(cap), CappedOutput(cap)
        outputs = {command.stdout: stdout, command.stderr: stderr}
        open_outputs = set(outputs)
        poller = select.poll()
        for fd in (*outputs, command.status):
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout_s
        timed_out = False

        def read_ready(timeout):
            events = poller.poll(timeout * 1000)
            for fd, _ in events:
                if fd == command.status:
                    command.read_status()
                    if command.ended:
                        poller.unregister(fd)
                    continue
                chunk = os.read(fd, READ_CHUNK)
                if chunk:
                    outputs[fd].feed(chunk)
                else:
                    poller.unregister(fd)
                    open_outputs.discard(fd)
            return events

        while not command.ended:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                kill_group(command.pid, wait=False)
                # Until the launcher has reaped the leader, a zombie leader keeps the group
                # alive to killpg; its status says it has.
                command.read_status_until(lambda c: c.ended, time.monotonic() + GROUP_EXIT_WAIT_S)
                break
            read_ready(remaining)
        kill_group(command.pid)
        # What the group wrote before it died is still in the pipes; a writer that escaped
        # the group (setsid) may hold them open, so read only what is there now.
        while open_outputs and read_ready(0):
            pass
        return stdout, stderr, timed_out, command.wait_status


# -- workers: long-lived children with the agent's rights ------------------------------------


class ForkedWorker:
    """A long-lived child of the supervisor, dropped to the agent's uid, that serves it over its
    end of a socket pair and holds no other fd (no channel: it acts with exactly the agent's
    rights, and /proc/self is the worker). It is forked once and reused because a fork costs
    milliseconds of CPU; the agent may kill or stop it (same uid), so it is checked before each
    use and forked anew when it is gone. `serve(sock, *args)` is the child's loop."""

    def __init__(self, serve, run_as, *args):
        self.serve = serve
        self.run_as = run_as
        self.args = args
        self.pid = None
        self.sock = None

    def start(self):
        parent_end, child_end = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                # Keep only our socket: the channel's ends become /dev/null, other fds close.
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                keep = child_end.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 20)
                if self.run_as is not None:
                    uid, gid = self.run_as
                    os.setgroups([])
                    os.setresgid(gid, gid, gid)
                    os.setresuid(uid, uid, uid)
                self.serve(child_end, *self.args)
                status = 0
            finally:
                os._exit(status)
        child_end.close()
        self.pid, self.sock = pid, parent_end

    def send(self, send):
        """`send(sock)` to a live worker: one is forked first if it is gone, and again if it died
        since the check (BrokenPipeError: nothing ran, so it runs anew)."""
        if not self.alive():
            self.start()
        try:
            send(self.sock)
        except BrokenPipeError:
            self.stop()
            self.start()
            send(self.sock)

    def alive(self):
        if self.pid is None:
            return False
        if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            return True
        self.pid = None  # reaped just now
        self.stop()
        return False

    def stop(self):
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# -- commands: the launcher starts them --------------------------------------------------------

LAUNCH_DEADLINE_S = 10.0  # the launcher is replaced when it has not started a command by then
LAUNCHER_KILLED_NOTE = b"\n[the process that started this command was killed, and the command with it]\n"


class LaunchedCommand:
    """A command the launcher started: the read ends of its stdout, stderr and status pipe.

    On the status pipe the command writes `pid N` first thing (COMMAND_PREFIX; its pid is also
    its process group), and the launcher writes `status N` (the wait status) once it has reaped
    it, or `error ERRNO MESSAGE` when it could not start it, then closes the pipe. The end of the
    status pipe is the end of the command, on every kernel; an end without a status means the
    launcher died."""

    def __init__(self, launcher_pid, stdout, stderr, status):
        self.launcher_pid = launcher_pid
        self.stdout, self.stderr, self.status = stdout, stderr, status
        self.pid = None
        self.wait_status = None
        self.error = None
        self.ended = False
        self.unread = b""

    def read_status(self):
        chunk = os.read(self.status, 64)
        self.ended = not chunk
        *lines, self.unread = (self.unread + chunk).split(b"\n")
        for line in lines:
            kind, _, value = line.decode(errors="replace").partition(" ")
            if kind == "pid" and value.isdigit():
                self.pid = int(value)
            elif kind == "status" and value.isdigit():
                self.wait_status = int(value)
            elif kind == "error":
                self.error = value

    @property
    def started(self):
        """Whether the start is known: it ran, failed, or ended at once (nobody left to say)."""
        return self.pid is not None or self.wait_status is not None or self.error is not None or self.ended

    def read_status_until(self, known, deadline):
        """Read the status pipe until `known(self)` or the `deadline` (monotonic); whether it is known."""
        while not known(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not wait_readable(self.status, remaining):
                return False
            self.read_status()
        return True

    def close(self):
        for fd in (self.stdout, self.stderr, self.status):
            os.close(fd)


def wait_readable(fd, timeout):
    """True once `fd` is readable (or at its end), False when `timeout` seconds pass first.
    `poll`, not an epoll selector: no descriptor to make and close per wait."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


class CommandLauncher(ForkedWorker):
    """The worker that starts every command, already the agent's identity.

    A command must run as the agent, but dropping the identity in the supervisor costs a
    process: `Popen(user=...)` forks the whole supervisor, and an identity-changing program
    (`setpriv`) is one more exec, about 1 ms of CPU on a VM where every program start pays for
    trapped CPUID instructions. The launcher is the agent already, so it starts a command with
    posix_spawn (a vfork) and nothing else. The agent may kill or stop it, as the file worker:
    the command in flight is then killed (reported as SIGKILL, with a note on its stderr) and the
    next command starts a new launcher.

    Per command the supervisor sends the argv and environment as one frame, with three fds:
    the write ends of the command's stdout, stderr and status pipes (LaunchedCommand says what
    travels on the last)."""

    def __init__(self, run_as):
        super().__init__(serve_commands, run_as)
        self.lock = threading.Lock()

    def launch(self, argv, env, executable=None):
        """Start `argv` with `env` in a new session, from `executable` if given (else `argv[0]` on `env`'s PATH);
        the started command (OSError if it could not start)."""
        request = json.dumps({"argv": argv, "env": env, "executable": executable}).encode()
        pipes = [os.pipe() for _ in range(3)]
        stdout, stderr, status = (read_end for read_end, _ in pipes)
        try:
            with self.lock:
                self.send(lambda sock: send_command(sock, request, [write_end for _, write_end in pipes]))
                launcher_pid = self.pid
        except BaseException:
            for pair in pipes:
                os.close(pair[0])
                os.close(pair[1])
            raise
        for _, write_end in pipes:
            os.close(write_end)
        command = LaunchedCommand(launcher_pid, stdout, stderr, status)
        try:
            self.await_start(command)
            if command.error is not None:
                number, _, message = command.error.partition(" ")
                raise OSError(int(number) if number.isdigit() else 0, message)
        except BaseException:
            command.close()
            raise
        return command

    def replace(self, pid):
        """Kill and reap the launcher `pid` if it is still the current one: the next command forks a new one."""
        with self.lock:
            if self.pid == pid:
                self.stop()

    def await_start(self, command):
        """Until `command` has started, failed to start, or ended (killed at once); a launcher that
        says nothing within LAUNCH_DEADLINE_S is replaced and the start fails."""
        if not command.read_status_until(lambda c: c.started, time.monotonic() + LAUNCH_DEADLINE_S):
            self.replace(command.launcher_pid)
            raise RuntimeError(f"the command launcher did not start the command within {LAUNCH_DEADLINE_S:.0f} s (it was stopped)")


def send_command(sock, request, fds):
    """One frame (`request`) with `fds` attached to its first byte."""
    frame = len(request).to_bytes(FRAME_HEADER, "big") + request
    sent = socket.send_fds(sock, [frame], fds)
    sock.sendall(frame[sent:])


def serve_commands(sock):
    """The launcher's loop: start each command that arrives, and report each one's wait status
    when it ends (SIGCHLD wakes the loop), until the supervisor is gone."""
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    status_of = {}  # pid -> the write end of its status pipe
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == sock.fileno():
                received = recv_command(sock)
                if received is None:
                    return
                request, (stdout, stderr, status) = received
                try:
                    pid = spawn_command(request["argv"], request["env"], stdout, stderr, status, request.get("executable"))
                except OSError as exc:
                    report(status, f"error {exc.errno or 0} {exc.strerror or exc}")
                    os.close(status)
                else:
                    status_of[pid] = status
                finally:
                    os.close(stdout)
                    os.close(stderr)
            else:
                while os.read(wake_read, 256) == 256:
                    pass
                reap_commands(status_of)


def recv_command(sock):
    """A frame and the three fds sent with it; None when the supervisor is gone."""
    header, fds, _, _ = socket.recv_fds(sock, FRAME_HEADER, 3)
    for fd in fds:
        os.set_inheritable(fd, False)  # no command may hold another's pipes
    if not header:
        return None
    rest = recv_exactly(sock, FRAME_HEADER - len(header), None) if len(header) < FRAME_HEADER else b""
    body = recv_exactly(sock, int.from_bytes(header + rest, "big"), None)
    if body is None or len(fds) != 3:
        return None
    return json.loads(body), fds


def spawn_command(argv, env, stdout, stderr, status, executable=None):
    """posix_spawn `executable` (default: `argv[0]`, looked up on `env`'s PATH) with `argv` in a new
    session, stdin /dev/null, `status` as fd 3 (the command reports its pid there and closes it),
    with the signals Python ignores back at their defaults (as `Popen` does)."""
    executable = executable or argv[0]
    if "/" not in executable:
        found = (os.path.join(directory, executable) for directory in os.get_exec_path(env))
        executable = next((path for path in found if os.access(path, os.X_OK)), executable)
    return os.posix_spawn(
        executable, argv, env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, stdout, 1),
            (os.POSIX_SPAWN_DUP2, stderr, 2),
            (os.POSIX_SPAWN_DUP2, status, 3),
        ],
        setsid=True,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )


def reap_commands(status_of):
    """Report and forget every command that has ended."""
    while status_of:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = status_of.pop(pid, None)
        if status is not None:
            report(status, f"status {wait_status}")
            os.close(status)


def report(fd, line):
    try:
        os.write(fd, line.encode() + b"\n")
    except OSError:
        pass  # the supervisor gave up on this command


# -- file operations: they run in the file worker, a child with the agent's rights ----------


class FileWorker(ForkedWorker):
    """The worker that runs the file operations: whatever the workspace holds (FIFO, deep tree,
    huge file) can crash or hang only the worker. An operation past its deadline gets it killed:
    then that operation fails and the next one forks a new worker. One operation at a time."""

    def __init__(self, workdir, run_as):
        super().__init__(serve_file_operations, run_as, workdir)
        self.lock = threading.Lock()

    def run(self, request_line, payload):
        """The reply of the request in `request_line` with its `payload`: the reply's fields
        (one JSON object, as bytes) and its own payload."""

        def send(sock):
            sock.settimeout(FILE_OP_DEADLINE_S)
            send_frames(sock, request_line, payload)

        with self.lock:
            try:
                self.send(send)
                deadline = time.monotonic() + FILE_OP_DEADLINE_S
                try:
                    fields = recv_frame(self.sock, deadline)
                except ConnectionResetError:
                    # The worker died with the request unread (a socket closed over unread data resets its
                    # peer; one that read it all ends it). A kill can land after `alive()`: SIGKILL takes
                    # effect when the worker next runs. Nothing ran, so it runs on a new worker.
                    self.stop()
                    self.send(send)
                    fields = recv_frame(self.sock, deadline)
                result = None if fields is None else recv_frame(self.sock, deadline)
            except BaseException:
                self.stop()
                raise
            if result is None:
                self.stop()
                raise RuntimeError("the file worker died during the operation")
        if not fields.startswith(b'{"ok": ') or not fields.endswith(b"}") or b"\n" in fields:
            raise RuntimeError("the file worker answered garbage")
        return fields, result


def serve_file_operations(sock, workdir):
    """The worker's loop: a request's two frames (JSON, payload) in, the reply's two frames out,
    until the supervisor is gone."""
    import tarfile  # noqa: F401  (loaded, and tar looked up, before the first archive needs them)

    gnu_tar()
    while (request_line := recv_frame(sock, None)) is not None:
        payload = recv_frame(sock, None)
        if payload is None:
            return
        try:
            request = json.loads(request_line)
            fields, result = FILE_OPS[request["op"]](workdir, request, payload)
            fields = {"ok": True, **fields}
        except Exception as exc:
            fields, result = error_reply(exc), b""
        send_frames(sock, json.dumps(fields).encode(), result)


FRAME_HEADER = 8  # bytes of big-endian length before each frame between supervisor and worker


def send_frames(sock, *frames):
    for data in frames:
        sock.sendall(len(data).to_bytes(FRAME_HEADER, "big"))
        sock.sendall(data)


def recv_frame(sock, deadline):
    """One frame, or None at end of stream; TimeoutError when `deadline` (monotonic) passes."""
    header = recv_exactly(sock, FRAME_HEADER, deadline)
    return None if header is None else recv_exactly(sock, int.from_bytes(header, "big"), deadline)


def recv_exactly(sock, size, deadline):
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"file operation did not finish within {FILE_OP_DEADLINE_S:.0f} s")
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except socket.timeout:
            raise TimeoutError(f"file operation did not finish within {FILE_OP_DEADLINE_S:.0f} s") from None
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


SEALED_ROOTS = ("/dev/shm",)
"""Where sealed directories may be made: a sticky, world-writable directory, where commands can
make names of their own but never remove or rename the supervisor's."""


class SealingUnavailable(Exception):
    """`put_sealed_archive` where commands share the supervisor's uid (the host's class of that name)."""


def sealed_members(archive):
    """The archive's members as (relative path parts, member), in order; ValueError for anything but
    a regular file or a directory at a plain relative path (no link, device, FIFO, absolute path
    or `..`), before anything is written."""
    members = []
    for member in archive.getmembers():
        parts = [part for part in member.name.split("/") if part not in ("", ".")]
        if member.name.startswith("/") or ".." in parts:
            raise ValueError(f"sealed archive member {member.name!r}: not a plain relative path")
        if not (member.isreg() or member.isdir()) or (member.isreg() and not parts):
            raise ValueError(f"sealed archive member {member.name!r}: only regular files and directories")
        members.append((parts, member))
    return members


def extract_sealed(payload, dest):
    """Make `dest` (a new directory right under one of `SEALED_ROOTS`) and extract the uncompressed
    tar `payload` into it: files 0444 and directories 0555, owned by this process.

    Nothing is followed and nothing that existed is written to: `dest` is made with mkdir (it
    fails if the name exists), and everything below it is created relative to descriptors of
    directories made here, with O_EXCL and O_NOFOLLOW, while they are still 0700."""
    import tarfile

    parent, name = os.path.split(os.path.normpath(dest))
    if parent not in SEALED_ROOTS or name in ("", ".", "..") or dest != os.path.join(parent, name):
        raise ValueError(f"a sealed directory must be new and right under one of {SEALED_ROOTS}, not {dest!r}")
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as archive:
        members = sealed_members(archive)
        os.mkdir(dest, 0o700)
        root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        directories = {(): root}  # relative path parts -> descriptor, every one made here
        try:
            if os.fstat(root).st_uid != os.geteuid():
                raise PermissionError(errno.EPERM, "the new sealed directory is not ours", dest)
            for parts, member in members:
                depth = len(parts) if member.isdir() else len(parts) - 1
                for level in range(1, depth + 1):
                    if tuple(parts[:level]) not in directories:
                        above = directories[tuple(parts[: level - 1])]
                        os.mkdir(parts[level - 1], 0o700, dir_fd=above)
                        directories[tuple(parts[:level])] = os.open(
                            parts[level - 1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=above
                        )
                if member.isreg():
                    fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400, dir_fd=directories[tuple(parts[:-1])])
                    try:
                        write_all(fd, archive.extractfile(member).read())
                        os.fchmod(fd, 0o444)
                    finally:
                        os.close(fd)
            for fd in directories.values():
                os.fchmod(fd, 0o555)
        finally:
            for fd in directories.values():
                os.close(fd)


def resolve(workdir, path):
    return os.path.join(workdir, path)


def write_new_file(path, data):
    """Write `data` to a file that must not exist yet, as the supervisor: that is how an archive
    reaches the host through a sandbox's inbox, where the agent's uid cannot write (decision 012)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def open_regular(path, flags):
    """Open `path` without blocking on a FIFO and insist on a regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    raise OSError(errno.EINVAL, "Not a regular file (FIFO, socket or device)", path)


def read_at_most(fd, size):
    """The file's bytes, but never more than `size` of them (it may grow while we read)."""
    chunks, left = [], size
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def file_read(workdir, request, payload):
    path, limit = resolve(workdir, request["path"]), int(request["max_bytes"])
    fd = open_regular(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise TooLarge("FileTooLarge", f"{request['path']} is {size} bytes, over the {limit}-byte bound")
        data = read_at_most(fd, limit + 1)
        if len(data) > limit:
            raise TooLarge("FileTooLarge", f"{request['path']} grew past the {limit}-byte bound while it was read")
    finally:
        os.close(fd)
    return {}, data


def file_write(workdir, request, payload):
    path = resolve(workdir, request["path"])
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        write_all(fd, payload)
        os.fchmod(fd, int(request.get("mode", 0o644)))
    finally:
        os.close(fd)
    return {}, b""


def archive_put(workdir, request, payload):
    import subprocess
    import tarfile

    dest = resolve(workdir, request.get("dest", "."))
    os.makedirs(dest, exist_ok=True)
    # Archives come from the host (a task's files, or a copy of this agent's own workspace),
    # and extraction runs with the agent's own rights inside the sandbox, so members are not
    # filtered further. -p keeps modes exactly, as tarfile does. `from_file` names an archive
    # the host placed in this sandbox's read-only inbox (decision 012) instead of sending it.
    source = request.get("from_file")
    # A small archive (a task's files at reset) unpacks in this process: starting tar would cost
    # more (about 2 ms) than tarfile's extraction (0.3 ms).
    if (tar := gnu_tar()) is None or (not source and len(payload) <= SMALL_ARCHIVE_BYTES):
        with tarfile.open(source, mode="r:") if source else tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as archive:
            archive.extractall(dest)
        return {}, b""
    stdin = subprocess.DEVNULL if source else subprocess.PIPE
    process, errors = start_tar([tar, "-x", "-p", "-f", source or "-", "-C", dest], stdin, subprocess.DEVNULL)
    with errors:
        if not source:
            try:
                # One write, not communicate(), which feeds a pipe 4 KB per poll.
                with process.stdin:
                    process.stdin.write(payload)
            except BrokenPipeError:
                pass  # tar gave up early: its status and complaint say why
        check_tar(process.wait(FILE_OP_DEADLINE_S), errors)
    return {}, b""


@functools.cache
def gnu_tar():
    """Path of GNU tar, or None (e.g. busybox): archives then go through `tarfile`, 4-5x slower
    for a workspace of a few hundred files, which every fork and grading copies. Looked up once
    per file worker."""
    import subprocess

    for path in ("/usr/bin/tar", "/bin/tar"):
        try:
            if subprocess.run([path, "--version"], capture_output=True, timeout=10).stdout.startswith(b"tar (GNU tar)"):
                return path
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def start_tar(argv, stdin, stdout):
    """Start tar with its complaints in an anonymous memory file: a full stderr pipe could block
    it, and a file in /tmp could fail where the agent filled /tmp."""
    import subprocess

    errors = os.fdopen(os.memfd_create("tar-errors"), "w+b")
    return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=errors, close_fds=True), errors


TAR_ERRNOS = {"Permission denied": errno.EACCES, "No such file or directory": errno.ENOENT, "No space left on device": errno.ENOSPC}
"""tar's complaints that become the OSError the host maps by errno, as tarfile's would have."""


def check_tar(status, errors, tolerated=(0,)):
    if status in tolerated:
        return
    errors.seek(0)
    complaint = errors.read().decode(errors="replace").strip()
    for message, code in TAR_ERRNOS.items():
        if message in complaint:
            # "/usr/bin/tar: ./NAME: Cannot open: Permission denied"
            line = next(line for line in complaint.splitlines() if message in line)
            raise OSError(code, message, line.split(": ")[1] if line.count(": ") >= 2 else None)
    raise RuntimeError(f"tar exited {status}: {complaint[-500:]}")


def walk_tree(root):
    """(path, arcname, lstat) of `root` and everything under it, depth-first, without
    recursion (1,200 nested directories are fine) and without following symlinks."""
    top = os.lstat(root)
    if not stat.S_ISDIR(top.st_mode):
        yield root, os.path.basename(root), top
        return
    stack = [(root, ".", top)]
    while stack:
        path, arcname, info = stack.pop()
        yield path, arcname, info
        if stat.S_ISDIR(info.st_mode):
            with os.scandir(path) as entries:
                children = sorted(((entry.name, entry.stat(follow_symlinks=False)) for entry in entries), key=lambda child: child[0])
            for name, child in reversed(children):
                stack.append((os.path.join(path, name), arcname + "/" + name, child))


def archive_get(workdir, request, payload):
    """Tar of a path, sized from lstat before any file is read: ArchiveTooLarge over the bound.

    Regular files, directories, symlinks and FIFOs are archived; sockets and devices are left
    out."""
    import subprocess

    root, limit = os.path.normpath(resolve(workdir, request.get("path", "."))), int(request["max_bytes"])
    members = list(walk_tree(root))
    total = sum(TAR_MEMBER_OVERHEAD + len(arcname) + (info.st_size if stat.S_ISREG(info.st_mode) else 0) for _, arcname, info in members)
    if total > limit:
        raise TooLarge("ArchiveTooLarge", f"{request.get('path', '.')} holds about {total} bytes in {len(members)} entries, over the {limit}-byte bound")
    kept = [member for member in members if stat.S_ISREG(member[2].st_mode) or stat.S_ISDIR(member[2].st_mode) or stat.S_ISLNK(member[2].st_mode) or stat.S_ISFIFO(member[2].st_mode)]
    if (tar := gnu_tar()) is None:
        return {}, tarfile_archive(kept)
    # tar archives exactly the listed members (symlinks and FIFOs as such, never opened); what
    # grew since they were counted is caught by the cap on its output (a record of slack).
    listing = os.fdopen(os.memfd_create("tar-names"), "w+b")
    listing.write(b"".join(os.fsencode(arcname) + b"\0" for _, arcname, _ in kept))
    listing.seek(0)
    cwd = root if stat.S_ISDIR(members[0][2].st_mode) else os.path.dirname(root)
    argv = [tar, "-c", "-f", "-", "--numeric-owner", "--no-recursion", "-C", cwd, "--null", "-T", "-"]
    with listing:
        process, errors = start_tar(argv, listing, subprocess.PIPE)
    with errors, process.stdout:
        data = read_at_most(process.stdout.fileno(), limit + TAR_RECORD + 1)
        if len(data) > limit + TAR_RECORD:
            process.kill()
            process.wait()
            raise TooLarge("ArchiveTooLarge", f"{request.get('path', '.')} grew past the {limit}-byte bound while it was archived")
        process.stdout.close()
        check_tar(process.wait(FILE_OP_DEADLINE_S), errors, tolerated=(0, 1))  # 1: a file changed while read
    return {}, data


def tarfile_archive(members):
    """The same archive as GNU tar's, made by `tarfile`: regular files are opened without
    following a symlink or blocking on a FIFO and read no further than their counted size."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for path, arcname, info in members:
            if not stat.S_ISREG(info.st_mode):
                tar.addfile(tar.gettarinfo(path, arcname))
                continue
            with os.fdopen(open_regular(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as file:
                member = tar.gettarinfo(arcname=arcname, fileobj=file)
                if not member.isreg():  # a hard link to a member already stored
                    tar.addfile(member)
                    continue
                data = read_at_most(file.fileno(), info.st_size)  # the size counted above
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


FILE_OPS = {"read_file": file_read, "write_file": file_write, "put_archive": archive_put, "get_archive": archive_get}


def main(argv):
    # `--workdir DIR [--run-as UID:GID]`, exactly as `bootstrap_argv` writes them, parsed by hand:
    # importing argparse (with gettext and locale) cost every cold start about 10 ms here.
    options = dict(zip(argv[::2], argv[1::2]))
    if len(argv) % 2 or not set(options) <= {"--workdir", "--run-as"} or "--workdir" not in options:
        sys.exit(f"usage: supervisor --workdir DIR [--run-as UID:GID] (UID:GID: what commands and file operations drop to), not {argv}")
    workdir, run_as = options["--workdir"], options.get("--run-as")
    run_as = tuple(int(part) for part in run_as.split(":")) if run_as else None
    # The key is the first line after the source, sent before any command can run; it never
    # appears in argv or the environment.
    key = bytes.fromhex(sys.stdin.buffer.readline().decode())
    make_non_dumpable()
    # File operations fork from a threaded process on purpose; the children touch no lock
    # another thread could hold (no logging, no sys.stdout; their imports cannot meet a half-done
    # one of ours, see `Supervisor.serve`) and _exit at once.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
    os.chdir(workdir)
    Supervisor(workdir, key, run_as).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
