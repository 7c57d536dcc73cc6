"""Host side of the supervisor protocol: JSON-lines requests over any pair of byte streams.

Both backends hand this class two callables, one that reads the next chunk of the
supervisor's stdout and one that writes to its stdin; everything above them (request ids,
concurrent callers, error mapping, reply authentication) is shared.

Every reply line is `MAC JSON`: the hex keyed BLAKE2b of the JSON bytes under a per-sandbox key
that the host sends once over stdin at start-up, before any command runs (decision 006). A line
that does not authenticate or parse fails at most the one request whose id it names, with a
`SandboxError`; the reader thread itself never dies of a bad line.

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
from concurrent.futures import Future
from typing import Any

from sandbox.base import ArchiveTooLarge, FailureReport, FileTooLarge, SandboxError, SealingUnavailable

KEY_BYTES = 32
MAC_BYTES = 16
MAX_PAYLOAD_BYTES = 4 * 2**30
"""Bound on one reply's announced payload; beyond it the channel counts as broken."""


def reply_mac(key: bytes, body: bytes) -> bytes:
    """Hex MAC of one reply's JSON body (the supervisor computes the same)."""
    return hashlib.blake2b(body, key=key, digest_size=MAC_BYTES).hexdigest().encode()


class SupervisorChannel:
    """A request/reply client of one supervisor; thread-safe, replies matched by id."""

    def __init__(self, read_chunk: Callable[[], bytes], write: Callable[[bytes], None], describe_failure: Callable[[], FailureReport]):
        """`read_chunk` returns b"" at end of stream; `describe_failure` explains a dead channel."""
        self._write = write
        self._describe_failure = describe_failure
        self.key = os.urandom(KEY_BYTES)
        """Authenticates replies; the backend sends it to the supervisor (`send_raw`) at start-up."""
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed: SandboxError | None = None
        """Why the channel died; each request after that raises a copy (one traceback each)."""
        self._reader = threading.Thread(target=self._read_replies, args=(read_chunk,), name="supervisor-reader", daemon=True)
        self._reader.start()

    @property
    def is_open(self) -> bool:
        return self._closed is None

    def send_raw(self, data: bytes) -> None:
        """Write bytes that are not a request (the supervisor's source and key at start-up)."""
        with self._write_lock:
            self._write(data)

    def request(self, op: str, reply_timeout_s: float, payload: bytes = b"", **params: Any) -> dict[str, Any]:
        """Send one request (with `payload` as raw bytes after its line) and wait for its reply;
        raises SandboxError if none comes. The reply's own payload, if any, is its `"payload"`.

        A failure reply is raised as the `OSError` subclass of its errno, as `ArchiveTooLarge` or
        `FileTooLarge` or `SealingUnavailable` when it names one of them, else as `SandboxError`.
        """
        request_id, future = self._send(op, payload, params)
        try:
            reply = future.result(timeout=reply_timeout_s)
        except TimeoutError:
            raise _no_reply(op, reply_timeout_s) from None
        finally:
            self._forget(request_id)
        return _succeeded(op, reply)

    async def request_async(self, op: str, reply_timeout_s: float, **params: Any) -> dict[str, Any]:
        """`request` for a caller on an event loop: the reader thread hands the reply to the loop, so no
        thread of the caller's waits for it (an exec from a worker thread took 0.065 ms longer). Without a
        payload: writing one could hold the loop until the supervisor had read it."""
        request_id, future = self._send(op, b"", params)
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(future), reply_timeout_s)
        except TimeoutError:
            raise _no_reply(op, reply_timeout_s) from None
        finally:
            self._forget(request_id)
        return _succeeded(op, reply)

    def _send(self, op: str, payload: bytes, params: dict[str, Any]) -> tuple[int, Future[dict[str, Any]]]:
        """Write one request; returns its id and the future its reply (or the channel's failure) completes."""
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self._closed is not None:
                raise self._closed_error()
            request_id = next(self._ids)
            self._pending[request_id] = future
        header = {"id": request_id, "op": op, **params, **({"payload_bytes": len(payload)} if payload else {})}
        try:
            with self._write_lock:
                self._write(json.dumps(header).encode() + b"\n")
                if payload:
                    self._write(payload)
        except OSError as exc:
            self._forget(request_id)
            raise SandboxError(f"cannot write to the supervisor: {exc}") from exc
        return request_id, future

    def _forget(self, request_id: int) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def _read_replies(self, read_chunk: Callable[[], bytes]) -> None:
        stream = _ReplyStream(read_chunk)
        try:
            while (line := stream.line()) is not None:
                if not self._dispatch(line, stream):
                    break
        except (OSError, ValueError) as exc:
            self._fail(f"supervisor channel broke: {exc}")
        self._fail("supervisor channel closed")

    def _dispatch(self, line: bytes, stream: _ReplyStream) -> bool:
        """Hand an authenticated, well-formed reply (and its payload) to its caller; fail the
        caller of a bad one. False when the stream ended inside a payload."""
        mac, _, body = line.partition(b" ")
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        request_id = reply.get("id") if isinstance(reply, dict) else None
        authentic = hmac.compare_digest(mac, reply_mac(self.key, body))
        failure = None
        if authentic and isinstance(reply, dict) and "payload_bytes" in reply:
            size, payload_mac = reply.pop("payload_bytes"), reply.pop("payload_mac", None)
            if not isinstance(size, int) or not 0 <= size <= MAX_PAYLOAD_BYTES or not isinstance(payload_mac, str):
                raise ValueError(f"reply to request {request_id} announces a malformed payload")
            payload = stream.exactly(size)
            if payload is None:
                return False
            if hmac.compare_digest(payload_mac.encode(), reply_mac(self.key, payload)):
                reply["payload"] = payload
            else:
                failure = f"the payload of the reply to request {request_id} failed authentication (corrupted)"
        with self._lock:
            future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is None or future.done():
            return True  # belongs to no waiting request (forged, late or garbage): nothing to fail
        if not authentic:
            failure = f"reply to request {request_id} failed authentication (forged or corrupted)"
        elif not isinstance(reply.get("ok"), bool):
            failure = f"malformed reply to request {request_id}: no boolean 'ok'"
        if failure is None:
            future.set_result(reply)
        else:
            future.set_exception(SandboxError(failure))
        return True

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._closed is not None:
                return
            report = self._describe_failure()
            self._closed = SandboxError(f"{reason}{': ' + report.detail if report.detail else ''}", oom_killed=report.oom_killed)
            pending = list(self._pending.values())
        for future in pending:
            if not future.done():
                future.set_exception(self._closed_error())

    def _closed_error(self) -> SandboxError:
        assert self._closed is not None
        return SandboxError(str(self._closed), oom_killed=self._closed.oom_killed)


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


class _ReplyStream:
    """The supervisor's stdout as lines and exact byte counts, over chunks of any size."""

    def __init__(self, read_chunk: Callable[[], bytes]):
        self._read_chunk = read_chunk
        self._buffer = bytearray()

    def line(self) -> bytes | None:
        """The next line without its newline; None at end of stream."""
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) == -1:
            searched = len(self._buffer)
            if not (chunk := self._read_chunk()):
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    def exactly(self, size: int) -> bytes | None:
        """The next `size` bytes; None if the stream ends first."""
        while len(self._buffer) < size:
            if not (chunk := self._read_chunk()):
                return None
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data
