"""In-sandbox supervisor: runs commands and moves files for the host, over JSON lines.

Standard library only: it runs on whatever `python3` the sandbox has. The host sends this
file's source over stdin at start-up (see `sandbox.supervisor.bootstrap_argv`), then one JSON
request per line; every request carries an `id` and every reply echoes it, so requests may be
served concurrently (one thread each) and a slow command never blocks a `ping`.

Request:  {"id": 7, "op": "exec", "cmd": "pytest -q", "timeout_s": 30, "env": {}, "output_cap": 65536}
Reply:    {"id": 7, "ok": true, "exit_code": 0, "signal": null, "stdout": "...", ...}
Failure:  {"id": 7, "ok": false, "error": "FileNotFoundError", "message": "..."}

When stdin reaches EOF (the host closed the channel or died) every running command's
process group is killed and the supervisor exits, which ends the sandbox.
"""

import argparse
import base64
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import tarfile
import threading
import time

PROTOCOL_VERSION = 1
READ_CHUNK = 65536

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


def oom_kill_count():
    """Number of OOM kills in this sandbox's memory cgroup so far (None if not readable)."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"), ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except OSError:
            continue
    return None


GROUP_EXIT_WAIT_S = 2.0  # bound on waiting for killed processes to be reaped


def kill_group(pgid):
    """SIGKILL every process of the group and wait (boundedly) until init has reaped them all,
    so that when a command returns none of its processes is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    give_up = time.monotonic() + GROUP_EXIT_WAIT_S
    while time.monotonic() < give_up:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.002)


class Supervisor:
    def __init__(self, workdir):
        self.workdir = workdir
        self.write_lock = threading.Lock()
        self.running = set()  # process group ids of commands in flight
        self.running_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------

    def reply(self, message):
        line = json.dumps(message).encode() + b"\n"
        with self.write_lock:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def serve(self):
        for line in sys.stdin.buffer:
            if line.strip():
                threading.Thread(target=self.handle, args=(line,), daemon=True).start()
        # The host is gone: nothing may outlive the channel.
        with self.running_lock:
            for pgid in self.running:
                kill_group(pgid)

    def handle(self, line):
        request_id = None
        try:
            request = json.loads(line)
            request_id = request.get("id")
            op = getattr(self, "op_" + str(request.get("op")), None)
            if op is None:
                raise ValueError(f"unknown op {request.get('op')!r}")
            result = op(request)
            self.reply({"id": request_id, "ok": True, **result})
        except Exception as exc:  # every failure becomes a typed reply; the loop must survive
            error = {"error": type(exc).__name__, "message": str(exc)}
            if isinstance(exc, OSError) and exc.errno is not None:
                # The host rebuilds the same OSError subclass from the errno.
                error.update(errno=exc.errno, message=exc.strerror, filename=exc.filename)
            self.reply({"id": request_id, "ok": False, **error})

    def resolve(self, path):
        return os.path.join(self.workdir, path)

    # -- operations -----------------------------------------------------------------------

    def op_ping(self, request):
        return {"protocol": PROTOCOL_VERSION, "pid": os.getpid()}

    def op_exec(self, request):
        cap = int(request.get("output_cap", 65536))
        timeout_s = float(request["timeout_s"])
        env = {**os.environ, **COMMAND_ENV, **request.get("env", {})}
        oom_before = oom_kill_count()
        started = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "-c", request["cmd"]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            env=env,
            start_new_session=True,
        )
        with self.running_lock:
            self.running.add(proc.pid)
        try:
            # Make the command, not the supervisor, the OOM killer's first choice (raising needs no privilege).
            with open(f"/proc/{proc.pid}/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        try:
            stdout, stderr, timed_out = self.collect(proc, timeout_s, cap)
        finally:
            with self.running_lock:
                self.running.discard(proc.pid)
        duration_ms = (time.monotonic() - started) * 1000
        oom_after = oom_kill_count()
        code = proc.returncode
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

    def collect(self, proc, timeout_s, cap):
        """Drain both pipes until the leader exits, enforcing the timeout on the whole group.

        The group is killed when its leader exits, so background children (`sleep 1000 &`)
        never outlive the command; a daemon must `setsid` and redirect its output to survive.
        """
        stdout, stderr = CappedOutput(cap), CappedOutput(cap)
        outputs = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
        selector = selectors.DefaultSelector()
        for fd in outputs:
            selector.register(fd, selectors.EVENT_READ)
        try:
            pidfd = os.pidfd_open(proc.pid)
            selector.register(pidfd, selectors.EVENT_READ)
            poll_s = None
        except OSError:  # no pidfd (gVisor, kernels before 5.3): notice the leader's exit by polling,
            pidfd, poll_s = None, 0.0005  # often at first (most commands are short), then backing off
        deadline = time.monotonic() + timeout_s
        timed_out = False

        def read_ready(timeout):
            events = selector.select(timeout)
            for key, _ in events:
                if key.fd == pidfd:
                    continue
                chunk = os.read(key.fd, READ_CHUNK)
                if chunk:
                    outputs[key.fd].feed(chunk)
                else:
                    selector.unregister(key.fd)
            return events

        try:
            while proc.poll() is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    # Reap the leader before waiting on the group: as our child it stays a
                    # zombie until then, and a zombie leader keeps the group alive to killpg.
                    proc.wait()
                    break
                if poll_s is None:
                    read_ready(remaining)
                else:
                    read_ready(min(remaining, poll_s))
                    poll_s = min(poll_s * 2, 0.05)
            kill_group(proc.pid)
            if pidfd is not None:
                selector.unregister(pidfd)
            # What the group wrote before it died is still in the pipes; a writer that escaped
            # the group (setsid) may hold them open, so read only what is there now.
            while len(selector.get_map()) and read_ready(0):
                pass
        finally:
            selector.close()
            if pidfd is not None:
                os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
        return stdout, stderr, timed_out

    def op_read_file(self, request):
        with open(self.resolve(request["path"]), "rb") as f:
            return {"data": base64.b64encode(f.read()).decode()}

    def op_write_file(self, request):
        path = self.resolve(request["path"])
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(request["data"]))
        os.chmod(path, int(request.get("mode", 0o644)))
        return {}

    def op_put_archive(self, request):
        dest = self.resolve(request.get("dest", "."))
        os.makedirs(dest, exist_ok=True)
        # Archives come from the host, never from the agent, and extraction runs with the
        # agent's own rights inside the sandbox, so members are not filtered further.
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(request["data"])), mode="r:") as tar:
            tar.extractall(dest)
        return {}

    def op_get_archive(self, request):
        path = os.path.normpath(self.resolve(request.get("path", ".")))
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such file or directory: {request.get('path', '.')}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:") as tar:
            # A directory's members are relative to it, a file is stored under its own name.
            tar.add(path, arcname="." if os.path.isdir(path) else os.path.basename(path))
        return {"data": base64.b64encode(buffer.getvalue()).decode()}


def main(argv):
    parser = argparse.ArgumentParser(prog="supervisor")
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args(argv)
    os.chdir(args.workdir)
    Supervisor(args.workdir).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
