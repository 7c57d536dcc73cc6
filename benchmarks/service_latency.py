"""Service latency: what the HTTP/WebSocket layer adds to a sandbox exec, reset time, and load.

    python benchmarks/service_latency.py [--steps 300] [--resets 40] [--sessions 64] [--load-steps 50] [--tiny]

Starts `coding-env serve` in a child process (Docker backend) and measures, in one run:
1. the baseline: `sandbox.exec("true")` on a sandbox opened in this process;
2. one `bash true` step round trip over WebSocket and over an HTTP session (p50, p99), each from a thin
   client (no thread, no connection pool: the figure is the service's, not a client library's), and
   the service overhead = step p50 - baseline p50; the three are timed in turns (exec, WebSocket step,
   HTTP step, the order rotating), so that the VM's drift falls on all three alike; beside each, the CPU it
   cost (user + system, all threads): the service process's per step, this process's per baseline exec (a
   busy VM inflates CPU time too, by the same factor for all when measured together, so compare ratios);
3. reset from the warm pool (checkout + workspace preparation) over an HTTP session;
4. N concurrent WebSocket sessions x M steps each: steps/s, p99, errors (the steps alone: after the warm
   pool has refilled, before any session closes).
Every timed reply is checked: a refused or failed step, reset or exec fails the run. `--tiny`: a few
of each, 2 sessions under load (CI's run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import httptools
import httpx
import websockets
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from samples import checked_exec, checked_step, percentile, timed_in_turns
from sandbox import SandboxSpec, open_sandbox
from sandbox.docker_backend import OWNER_LABEL, SERVICE_LABEL, SERVICE_VALUE

BASH_TRUE = {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "true"}}
# An inline task with room for every step the benchmark takes (builtin tasks stop at 30).
MAX_STEPS = 1000
"""The most steps a task allows (`TaskLimits.max_steps`); every timed step of one episode must fit in it."""
TASK = {"task": {"id": "bench/noop", "prompt": "Benchmark.", "files": {"main.py": "print(1)\n"}, "limits": {"max_steps": MAX_STEPS}}}


def report(name: str, samples_ms: list[float], cpu_ms: float | None = None) -> float:
    p50 = statistics.median(samples_ms)
    cpu = "" if cpu_ms is None else f"  CPU {cpu_ms:.2f} ms each"
    print(f"{name:<38} n={len(samples_ms):<5} p50={p50:8.2f} ms  p99={percentile(samples_ms, 0.99):8.2f} ms{cpu}")
    return p50


def start_service(pool_size: int, max_sessions: int | None = None, **settings: str) -> tuple[subprocess.Popen[str], str]:
    """`coding-env serve` on a free loopback port, once it is ready; returns it and its address.

    `settings` are further variables of its environment (e.g. `CODING_ENV_GRADING_POOL_SIZE="2"`)."""
    # Bound and listening here, handed over with --fd: uvicorn logs its start-up complete before it
    # binds a --port itself, so a client that waited for that line could be refused.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    env = {**os.environ, "CODING_ENV_POOL_SIZE": str(pool_size), "CODING_ENV_LOG_LEVEL": "info", **settings}
    if max_sessions is not None:
        env["CODING_ENV_MAX_SESSIONS"] = str(max_sessions)
    with listener:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("coding-env")), "serve", "--fd", str(listener.fileno())],
            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, pass_fds=[listener.fileno()],
        )
    assert process.stderr is not None
    for line in process.stderr:
        if "Application startup complete" in line:
            break
    else:
        raise SystemExit(f"service exited with {process.wait()}")
    threading.Thread(target=process.stderr.read, daemon=True).start()  # keep draining the pipe
    return process, f"127.0.0.1:{port}"


def service_container_ids(pid: int) -> set[str]:
    """Sandbox containers whose owner label names the service process `pid`."""
    owner_prefix = f"{socket.gethostname()}:{pid}:"
    listed = docker.from_env().api.containers(all=True, filters={"label": f"{SERVICE_LABEL}={SERVICE_VALUE}"})
    return {c["Id"] for c in listed if c["Labels"].get(OWNER_LABEL, "").startswith(owner_prefix)}


def wait_pool(http: httpx.Client, ready: int) -> None:
    """Block until the warm pool reports `ready` sandboxes (so resets measure checkouts, not starts)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("coding_env_pool_ready_sandboxes ") and float(line.split()[1]) >= ready:
                return
        time.sleep(0.2)
    raise SystemExit("warm pool did not fill")


@contextmanager
def exec_baseline() -> Iterator[Callable[[], object]]:
    """`sandbox.exec("true")` on a sandbox opened in this process: what a step wraps."""
    with open_sandbox(SandboxSpec()) as sandbox:
        yield lambda: checked_exec(sandbox, "true")


class ThinWebSocket:
    """A blocking WebSocket client over a plain socket, without a thread: websockets' sans-I/O protocol opens the
    connection; then each frame is written by websockets' `Frame` and read here. `websockets.sync`'s client hands
    every frame from a reader thread (0.07-0.09 ms a step on a 2-core VM), and the sans-I/O protocol's own framing
    cost about 0.1-0.15 ms a step more than this (docs/benchmarks.md): both timed as if the service spent them. A
    ping is answered; a fragmented message, a close or any other frame fails the run."""

    def __init__(self, url: str) -> None:
        uri = parse_uri(url)
        protocol = ClientProtocol(uri)
        self._socket = socket.create_connection((uri.host, uri.port))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        protocol.send_request(protocol.connect())
        while protocol.state is State.CONNECTING:
            self._socket.sendall(b"".join(protocol.data_to_send()))
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the service closed the connection during the WebSocket handshake")
            protocol.receive_data(data)
        if protocol.handshake_exc is not None:
            raise protocol.handshake_exc
        self._unread = bytearray()  # the service sends nothing before the first message, so nothing is left over

    def send(self, text: str) -> None:
        self._socket.sendall(Frame(Opcode.TEXT, text.encode()).serialize(mask=True))

    def recv(self) -> str:
        """The next text message."""
        while True:
            opcode, payload = self._frame()
            if opcode is Opcode.TEXT:
                return payload.decode()
            if opcode is Opcode.PING:
                self._socket.sendall(Frame(Opcode.PONG, payload).serialize(mask=True))
            elif opcode is not Opcode.PONG:
                raise ConnectionError(f"the service sent a {opcode.name} frame: {payload[:200]!r}")

    def close(self) -> None:
        try:
            self._socket.sendall(Frame(Opcode.CLOSE, (1000).to_bytes(2, "big")).serialize(mask=True))
        finally:
            self._socket.close()

    def _frame(self) -> tuple[Opcode, bytes]:
        """The next frame's opcode and payload (a server's frames are not masked; RFC 6455, 5.2)."""
        first, second = self._read(2)
        if not first & 0x80:
            raise RuntimeError("the service fragmented a message; this client reads whole frames only")
        size = second & 0x7F
        if size >= 126:
            size = int.from_bytes(self._read(2 if size == 126 else 8), "big")
        return Opcode(first & 0x0F), self._read(size)

    def _read(self, size: int) -> bytes:
        while len(self._unread) < size:
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the service closed the WebSocket")
            self._unread += data
        chunk = bytes(self._unread[:size])
        del self._unread[:size]
        return chunk


class ThinHttp:
    """A blocking keep-alive HTTP/1.1 client over a plain socket, its replies read by httptools' C parser (the one
    uvicorn serves with). `http.client` sends a request's head and body as two segments with Nagle's algorithm on,
    so the body waits for the head's ACK, and parses every reply's headers with the `email` package: 0.67-0.80 ms a
    step on a 2-core VM (docs/benchmarks.md), timed as if the service spent it."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self._head = f"Host: {address}\r\nContent-Type: application/json\r\n"
        self._socket = socket.create_connection((host, int(port)))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post_json(self, path: str, body: bytes) -> tuple[int, bytes]:
        """The status and body of the reply to a JSON `POST` (one `send`: the head and body in one segment)."""
        head = f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
        self._socket.sendall(head.encode() + body)
        reply = _Reply()
        parser = httptools.HttpResponseParser(reply)
        while not reply.complete:
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the service closed the connection")
            parser.feed_data(data)
        return parser.get_status_code(), b"".join(reply.body)

    def close(self) -> None:
        self._socket.close()


class _Reply:
    """What httptools' parser calls back with: the body's parts, and the end of the message."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


@contextmanager
def websocket_step(address: str) -> Iterator[Callable[[], object]]:
    """One `bash true` step over a WebSocket session, its reply checked, over a thin client (`ThinWebSocket`)."""
    ws = ThinWebSocket(f"ws://{address}/ws")
    try:
        ws.send(json.dumps({"type": "reset", "data": TASK}))
        if json.loads(ws.recv())["type"] != "observation":
            raise RuntimeError("the WebSocket reset was refused")

        def step() -> None:
            ws.send(json.dumps({"type": "step", "data": BASH_TRUE}))
            frame = json.loads(ws.recv())
            if frame["type"] != "observation":
                raise RuntimeError(f"a timed step was refused: {json.dumps(frame)[:500]}")
            checked_step(frame["data"])

        yield step
    finally:
        ws.close()


@contextmanager
def http_step(address: str, session_id: str) -> Iterator[Callable[[], object]]:
    """One `bash true` step of HTTP session `session_id`, its reply checked, over a keep-alive connection of a
    thin client (`ThinHttp`), so the figure is the service's, not a client library's."""
    connection = ThinHttp(address)
    path, body = f"/sessions/{session_id}/step", json.dumps({"action": BASH_TRUE}).encode()

    def step() -> None:
        status, answer = connection.post_json(path, body)
        if status != 200:
            raise RuntimeError(f"a timed step answered {status}: {answer[:500]!r}")
        checked_step(json.loads(answer))

    try:
        yield step
    finally:
        connection.close()


def bench_steps(address: str, session_id: str, steps: int, warm_up: int, service_pid: int) -> None:
    """The baseline exec and a step over each transport, timed in turns; the service's overhead is a step's p50
    less the baseline's."""
    with exec_baseline() as baseline, websocket_step(address) as over_websocket, http_step(address, session_id) as over_http:
        series = {
            "sandbox exec `true` (baseline)": (baseline, os.getpid()),
            "step `bash true` via WebSocket": (over_websocket, service_pid),
            "step `bash true` via HTTP session": (over_http, service_pid),
        }
        timed_in_turns(series, warm_up)
        p50 = {name: report(name, samples, cpu_ms) for name, (samples, cpu_ms) in timed_in_turns(series, steps).items()}
    exec_p50, ws_p50, http_p50 = p50.values()
    print(f"service overhead over raw exec (p50): WebSocket {ws_p50 - exec_p50:+.2f} ms "
          f"({ws_p50 / exec_p50:.2f}x), HTTP {http_p50 - exec_p50:+.2f} ms ({http_p50 / exec_p50:.2f}x)")


def bench_resets(http: httpx.Client, session_id: str, resets: int) -> None:
    samples = []
    for _ in range(resets):
        wait_pool(http, 2)
        start = time.perf_counter()
        http.post(f"/sessions/{session_id}/reset", json=TASK).raise_for_status()
        samples.append((time.perf_counter() - start) * 1000)
    report("reset from the warm pool (HTTP)", samples)


async def bench_load(address: str, sessions: int, steps: int, pool_size: int) -> None:
    """`sessions` WebSocket sessions reset at once, then `steps` steps each, all at once. The steps are timed
    alone: from when the warm pool has refilled after the resets' burst until the last step's reply, every
    session still open (a closed session's container removal, like the pool's container starts, would share
    the machine with the others' steps; resets are timed on their own above)."""
    latencies: list[float] = []
    errors = 0
    first_error = ""
    all_reset = asyncio.Barrier(sessions + 1)
    all_stepped = asyncio.Barrier(sessions + 1)
    go = asyncio.Event()

    async def one_session() -> None:
        nonlocal errors, first_error
        try:
            async with websockets.connect(f"ws://{address}/ws", open_timeout=120, ping_timeout=None) as ws:
                await ws.send(json.dumps({"type": "reset", "data": TASK}))
                if json.loads(await ws.recv())["type"] != "observation":
                    raise RuntimeError("a WebSocket reset under load was refused")
                await all_reset.wait()
                await go.wait()
                for _ in range(steps):
                    start = time.perf_counter()
                    await ws.send(json.dumps({"type": "step", "data": BASH_TRUE}))
                    reply = json.loads(await ws.recv())
                    latencies.append((time.perf_counter() - start) * 1000)
                    try:
                        if reply["type"] != "observation":
                            raise RuntimeError(f"a step under load was refused: {json.dumps(reply)[:500]}")
                        checked_step(reply["data"])
                    except RuntimeError as error:  # counted, and the run fails after the figures
                        errors += 1
                        first_error = first_error or str(error)
                await all_stepped.wait()
        except BaseException:
            all_reset.abort()  # the others fail too rather than wait for this one
            all_stepped.abort()
            raise

    tasks = [asyncio.create_task(one_session()) for _ in range(sessions)]
    try:
        await all_reset.wait()
        with httpx.Client(base_url=f"http://{address}", timeout=30) as http:
            await asyncio.to_thread(wait_pool, http, pool_size)
        start = time.perf_counter()
        go.set()
        await all_stepped.wait()
        elapsed = time.perf_counter() - start
    except asyncio.BrokenBarrierError:
        elapsed = float("nan")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors += sum(isinstance(r, BaseException) for r in results)
    first_error = first_error or next((repr(r) for r in results if isinstance(r, BaseException)), "")
    if not latencies:
        raise SystemExit(f"no step under load was answered (the first error: {first_error})")
    print(
        f"{sessions} sessions x {steps} steps (WebSocket): {len(latencies) / elapsed:7.1f} steps/s  "
        f"p50={statistics.median(latencies):.1f} ms  p99={percentile(latencies, 0.99):.1f} ms  errors={errors}"
    )
    if errors:
        raise SystemExit(f"{errors} of {sessions * steps} steps under load failed (the first: {first_error}): the figures above are not the service's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--resets", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--load-steps", type=int, default=50)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--warm-up", type=int, default=20, help="untimed steps (and execs) before each timed series")
    parser.add_argument("--tiny", action="store_true", help="a few of each, 2 sessions under load: every path and check, in seconds")
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.resets, args.sessions, args.load_steps, args.pool_size, args.warm_up = 3, 2, 2, 2, 2, 2
    if args.steps + args.warm_up > MAX_STEPS:
        parser.error(f"--steps: at most {MAX_STEPS - args.warm_up} (one episode takes them all, and a task allows {MAX_STEPS})")

    process, address = start_service(args.pool_size, max(args.sessions, 8))
    try:
        with httpx.Client(base_url=f"http://{address}", timeout=300) as http:
            wait_pool(http, args.pool_size)
            session_id = http.post("/sessions").raise_for_status().json()["session_id"]
            http.post(f"/sessions/{session_id}/reset", json=TASK).raise_for_status()
            bench_steps(address, session_id, args.steps, args.warm_up, process.pid)
            bench_resets(http, session_id, args.resets)
            http.delete(f"/sessions/{session_id}").raise_for_status()
        if args.sessions:
            asyncio.run(bench_load(address, args.sessions, args.load_steps, args.pool_size))
    finally:
        process.terminate()
        process.wait(120)


if __name__ == "__main__":
    main()
