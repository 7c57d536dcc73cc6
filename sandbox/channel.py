"""Host side of the supervisor protocol: JSON-lines requests over the supervisor's stdin and stdout.

Both backends hand this class the same `SupervisorStreams`: a read of what the supervisor wrote, a
write to it, and the descriptor that polls readable when a read will not block. Everything above them
(request ids, concurrent callers, error mapping, reply authentication) is shared.

Replies are read on a thread of the channel's own, or, given `replies_on`, by that event loop itself
(decision 138): a request awaited on it is then completed where it waits, without waking a thread. The loop
watches a copy of the stream's descriptor that the channel owns and closes once the loop has let it go, so a
backend may close its own at any time.

Every reply line is `MAC JSON`: the hex keyed BLAKE2b of the JSON bytes under a per-sandbox key
that the host sends once over stdin at start-up, before any command runs (decision 006). A line
that does not authenticate or parse fails at most the one request whose id it names, with a
`SandboxError`; the reader itself never dies of a bad line.

Bytes (file contents, archives) travel raw after their line, never inside the JSON (decision
011): the line names their count (`payload_bytes`) and, in a reply, their MAC (`payload_mac`).
Only an authenticated line makes the reader consume a payload, so a forged line cannot make it
swallow honest replies.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from sandbox.base import ArchiveTooLarge, FailureReport, FileTooLarge, SandboxError, SealingUnavailable

KEY_BYTES = 32
MAC_BYTES = 16
MAX_PAYLOAD_BYTES = 4 * 2**30
"""Bound on one reply's announced payload; beyond it the channel counts as broken."""
READ_BYTES = 2**18
"""Most bytes one read of a supervisor's stdout takes (a backend's `SupervisorStreams.read`; an archive comes in
many reads)."""


def reply_mac(key: bytes, body: bytes) -> bytes:
    """Hex MAC of one reply's JSON body (the supervisor computes the same)."""
    return hashlib.blake2b(body, key=key, digest_size=MAC_BYTES).hexdigest().encode()


@dataclass(frozen=True)
class SupervisorStreams:
    """The supervisor's stdin and stdout as a backend hands them to the host's channel."""

    read: Callable[[], bytes | None]
    """One read of the supervisor's stdout, blocking until something came: its bytes (possibly none, when
    what came was only the backend's framing), None at the end of the stream."""
    write: Callable[[bytes], None]
    """Writes all of the bytes to the supervisor's stdin."""
    stdout_fd: int
    """The descriptor `read` reads (Docker: the attach socket); it polls readable when `read` will not block.
    An event loop that watches it may make it non-blocking (libuv does): `read` then returns b"" when nothing
    is there, and `write`, on the same socket, still writes everything."""
    describe_failure: Callable[[], FailureReport]
    """Explains a dead channel (may ask the backend's engine: it blocks)."""


Waiter = Future[dict[str, Any]] | asyncio.Future[dict[str, Any]]
"""A request's future: thread-safe for a blocking caller, an asyncio one on the loop that reads the replies."""


class SupervisorChannel:
    """A request/reply client of one supervisor; thread-safe, replies matched by id."""

    def __init__(self, streams: SupervisorStreams, replies_on: asyncio.AbstractEventLoop | None = None):
        """Starts reading replies: on a thread of its own, or on `replies_on`, an event loop running on another
        thread. There a reply to a request awaited on that loop completes it directly, and a blocking `request`
        must come from another thread."""
        self._streams = streams
        self.key = os.urandom(KEY_BYTES)
        """Authenticates replies; the backend sends it to the supervisor (`send_raw`) at start-up."""
        self._ids = itertools.count(1)
        self._pending: dict[int, Waiter] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed: SandboxError | None = None
        """Why the channel died; each request after that raises a copy (one traceback each)."""
        self._replies = _ReplyParser(self.key, self._dispatch)
        self._loop = replies_on
        self._watched: int | None = None
        """The channel's copy of the stream's descriptor while `replies_on` may watch it; None once let go."""
        if replies_on is None:
            threading.Thread(target=self._read_on_thread, name="supervisor-reader", daemon=True).start()
        else:
            self._watched = os.dup(streams.stdout_fd)
            replies_on.call_soon_threadsafe(self._watch)

    @property
    def is_open(self) -> bool:
        return self._closed is None

    def send_raw(self, data: bytes) -> None:
        """Write bytes that are not a request (the supervisor's source and key at start-up)."""
        with self._write_lock:
            self._streams.write(data)

    def request(self, op: str, reply_timeout_s: float, payload: bytes = b"", **params: Any) -> dict[str, Any]:
        """Send one request (with `payload` as raw bytes after its line) and wait for its reply;
        raises SandboxError if none comes. The reply's own payload, if any, is its `"payload"`.

        A failure reply is raised as the `OSError` subclass of its errno, as `ArchiveTooLarge` or
        `FileTooLarge` or `SealingUnavailable` when it names one of them, else as `SandboxError`.
        """
        if self._loop is not None and runs_here(self._loop):
            raise RuntimeError(f"a blocking {op!r} on the event loop that reads its reply would wait forever; await it or run it on a thread")
        future: Future[dict[str, Any]] = Future()
        request_id = self._send(op, payload, params, future)
        try:
            reply = future.result(timeout=reply_timeout_s)
        except TimeoutError:
            raise _no_reply(op, reply_timeout_s) from None
        finally:
            self._forget(request_id)
        return _succeeded(op, reply)

    async def request_async(self, op: str, reply_timeout_s: float, **params: Any) -> dict[str, Any]:
        """`request` for a caller on an event loop, no thread of the caller's waiting for the reply. On the loop
        that reads replies, the reply completes this request where it waits; on another, the reader hands it over
        (`asyncio.wrap_future`). Without a payload: writing one could hold the loop until the supervisor had read it."""
        loop = asyncio.get_running_loop()
        future: Waiter = loop.create_future() if loop is self._loop else Future()
        request_id = self._send(op, b"", params, future)
        # The deadline fails the request as a failure reply would, by a timer on this loop: the reply then wakes
        # this task directly, with neither `wait_for`'s waiter (one more turn of the loop, 3.11) nor
        # `asyncio.timeout`'s cancellation bookkeeping (about 30 us of a step's profiled time, docs/benchmarks.md).
        deadline = loop.call_later(reply_timeout_s, lambda: _settle(future, error=_no_reply(op, reply_timeout_s)))
        try:
            reply = await (future if isinstance(future, asyncio.Future) else asyncio.wrap_future(future))
        finally:
            deadline.cancel()
            self._forget(request_id)
        return _succeeded(op, reply)

    def close(self) -> None:
        """Stop reading replies, and fail every request still waiting for one. Idempotent."""
        if self._loop is not None:
            _call_on(self._loop, self._unwatch)
        self._fail(FailureReport("sandbox was closed"), reason="supervisor channel closed")

    def _send(self, op: str, payload: bytes, params: dict[str, Any], future: Waiter) -> int:
        """Write one request whose reply (or the channel's failure) completes `future`; returns its id."""
        with self._lock:
            if self._closed is not None:
                raise self._closed_error()
            request_id = next(self._ids)
            self._pending[request_id] = future
        header = {"id": request_id, "op": op, **params, **({"payload_bytes": len(payload)} if payload else {})}
        try:
            with self._write_lock:
                self._streams.write(json.dumps(header).encode() + b"\n")
                if payload:
                    self._streams.write(payload)
        except OSError as exc:
            self._forget(request_id)
            raise SandboxError(f"cannot write to the supervisor: {exc}") from exc
        return request_id

    def _forget(self, request_id: int) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def _read_on_thread(self) -> None:
        """The reader thread: replies dispatched until the stream ends or breaks, then the channel failed."""
        try:
            while (data := self._streams.read()) is not None:
                self._replies.feed(data)
            reason = "supervisor channel closed"
        except (OSError, ValueError) as exc:
            reason = f"supervisor channel broke: {exc}"
        self._fail_described(reason)

    def _watch(self) -> None:
        """On the loop's thread: start watching the stream, unless the channel let it go first."""
        assert self._loop is not None
        with self._lock:
            if self._watched is not None:
                self._loop.add_reader(self._watched, self._read_on_loop)

    def _unwatch(self) -> None:
        """On the loop's thread (or with the loop stopped): stop watching the stream and close the copy of its
        descriptor, in that order (a descriptor closed while a loop polls it is undefined behaviour for libuv)."""
        assert self._loop is not None
        with self._lock:
            watched, self._watched = self._watched, None
        if watched is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(watched)
            os.close(watched)

    def _read_on_loop(self) -> None:
        """The stream polled readable: one read, its replies dispatched. At its end the loop lets the stream go,
        and the failure is described on a thread of its own (a backend may ask its engine, which blocks)."""
        try:
            if (data := self._streams.read()) is not None:
                self._replies.feed(data)
                return
            reason = "supervisor channel closed"
        except (OSError, ValueError) as exc:
            reason = f"supervisor channel broke: {exc}"
        self._unwatch()
        threading.Thread(target=self._fail_described, args=(reason,), name="supervisor-failure", daemon=True).start()

    def _fail_described(self, reason: str) -> None:
        """Fail the channel, whose stream ended or broke, with the backend's account of why (unless the host
        closed it meanwhile: then that is why)."""
        if not self.is_open:
            return
        try:
            report = self._streams.describe_failure()
        except Exception as exc:  # e.g. the engine itself is gone: the waiters must still be failed
            report = FailureReport(f"cannot tell why: {exc}")
        self._fail(report, reason)

    def _dispatch(self, reply: dict[str, Any] | None, request_id: object, failure: str | None) -> None:
        """Complete the request `request_id` names with `reply`, or fail it with `failure`; a reply that
        belongs to no waiting request (forged, late or garbage) fails nothing."""
        with self._lock:
            future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is None:
            return
        if failure is None and reply is not None and isinstance(reply.get("ok"), bool):
            _settle(future, reply)
        else:
            _settle(future, error=SandboxError(failure or f"malformed reply to request {request_id}: no boolean 'ok'"))

    def _fail(self, report: FailureReport, reason: str) -> None:
        with self._lock:
            if self._closed is not None:
                return
            self._closed = SandboxError(f"{reason}{': ' + report.detail if report.detail else ''}", oom_killed=report.oom_killed)
            pending = list(self._pending.values())
        for future in pending:
            _settle_from_any_thread(future, self._closed_error())

    def _closed_error(self) -> SandboxError:
        assert self._closed is not None
        return SandboxError(str(self._closed), oom_killed=self._closed.oom_killed)


def runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` is the event loop running on this thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """`fn()` on `loop`'s thread: now when that is this thread or the loop is not running, else at its next turn."""
    if runs_here(loop) or not loop.is_running():
        fn()
        return
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop closed meanwhile
        fn()


def _settle(future: Waiter, reply: dict[str, Any] | None = None, error: SandboxError | None = None) -> None:
    """Complete a waiting request, on a thread where that is safe for its future; a request completed meanwhile
    (by `close` on another thread) is left as it is."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(reply)
    except (InvalidStateError, asyncio.InvalidStateError):
        pass


def _settle_from_any_thread(future: Waiter, error: SandboxError) -> None:
    """Fail a waiting request from any thread: an asyncio future only on its own loop's thread."""
    if isinstance(future, Future):
        _settle(future, error=error)
        return
    loop = future.get_loop()
    if runs_here(loop):
        _settle(future, error=error)
        return
    try:
        loop.call_soon_threadsafe(_settle, future, None, error)
    except RuntimeError:
        pass  # its loop is closed: nothing awaits it any more


def _no_reply(op: str, reply_timeout_s: float) -> SandboxError:
    return SandboxError(f"supervisor gave no reply to {op!r} within {reply_timeout_s:.0f} s")


def _succeeded(op: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The reply of a request that succeeded; a failure reply raised as its error (`SupervisorChannel.request`)."""
    if reply["ok"] is not True:
        raise _failure(op, reply)
    return reply


_NAMED_ERRORS: dict[str, type[SandboxError]] = {cls.__name__: cls for cls in (ArchiveTooLarge, FileTooLarge, SealingUnavailable)}
"""Supervisor errors that the host raises as their own SandboxError subclass."""


def _failure(op: str, reply: dict[str, Any]) -> Exception:
    error, message, errno = reply.get("error"), reply.get("message"), reply.get("errno")
    if isinstance(errno, int) and isinstance(message, str):
        # OSError(errno, ...) becomes the matching subclass: FileNotFoundError, PermissionError...
        filename = reply.get("filename")
        return OSError(errno, message, filename if isinstance(filename, str) else None)
    if isinstance(error, str) and error in _NAMED_ERRORS:
        return _NAMED_ERRORS[error](str(message))
    return SandboxError(f"supervisor {op!r} failed: {error}: {message}")


@dataclass
class _AwaitedPayload:
    """A signed reply line whose payload has not all come yet."""

    reply: dict[str, Any]
    request_id: object
    size: int
    mac: str


class _ReplyParser:
    """The supervisor's stdout, fed in chunks of any size, read as replies: each line authenticated, a payload
    consumed only after an authenticated line that announces it. Hands every reply to `deliver(reply,
    request_id, failure)`, with `failure` set (and `reply` None) when it did not authenticate."""

    def __init__(self, key: bytes, deliver: Callable[[dict[str, Any] | None, object, str | None], None]):
        self._key = key
        self._deliver = deliver
        self._buffer = bytearray()
        self._searched = 0
        """How much of the buffer holds no newline (a long line comes in many chunks: search each byte once)."""
        self._awaited: _AwaitedPayload | None = None

    def feed(self, data: bytes) -> None:
        """Read what `data` completes. Raises ValueError at a signed line that announces an impossible payload:
        the stream cannot be followed past it."""
        self._buffer += data
        while True:
            if self._awaited is None:
                end = self._buffer.find(b"\n", self._searched)
                if end == -1:
                    self._searched = len(self._buffer)
                    return
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._searched = 0
                self._read_line(line)
            elif len(self._buffer) >= self._awaited.size:
                awaited, self._awaited = self._awaited, None
                payload = bytes(self._buffer[: awaited.size])
                del self._buffer[: awaited.size]
                if hmac.compare_digest(awaited.mac.encode(), reply_mac(self._key, payload)):
                    self._deliver({**awaited.reply, "payload": payload}, awaited.request_id, None)
                else:
                    self._deliver(None, awaited.request_id, f"the payload of the reply to request {awaited.request_id} failed authentication (corrupted)")
            else:
                return

    def _read_line(self, line: bytes) -> None:
        mac, _, body = line.partition(b" ")
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        request_id = reply.get("id") if isinstance(reply, dict) else None
        if not hmac.compare_digest(mac, reply_mac(self._key, body)):
            self._deliver(None, request_id, f"reply to request {request_id} failed authentication (forged or corrupted)")
        elif isinstance(reply, dict) and "payload_bytes" in reply:
            size, payload_mac = reply.pop("payload_bytes"), reply.pop("payload_mac", None)
            if not isinstance(size, int) or not 0 <= size <= MAX_PAYLOAD_BYTES or not isinstance(payload_mac, str):
                raise ValueError(f"reply to request {request_id} announces a malformed payload")
            self._awaited = _AwaitedPayload(reply, request_id, size, payload_mac)
        elif isinstance(reply, dict):
            self._deliver(reply, request_id, None)
