"""Host side of the supervisor protocol: JSON-lines requests over any pair of byte streams.

Both backends hand this class two callables, one that reads the next chunk of the
supervisor's stdout and one that writes to its stdin; everything above them (request ids,
concurrent callers, error mapping) is shared.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sandbox.base import SandboxError


class SupervisorChannel:
    """A request/reply client of one supervisor; thread-safe, replies matched by id."""

    def __init__(self, read_chunk: Callable[[], bytes], write: Callable[[bytes], None], describe_failure: Callable[[], str]):
        """`read_chunk` returns b"" at end of stream; `describe_failure` explains a dead channel."""
        self._write = write
        self._describe_failure = describe_failure
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed_reason: str | None = None
        self._reader = threading.Thread(target=self._read_replies, args=(read_chunk,), name="supervisor-reader", daemon=True)
        self._reader.start()

    @property
    def is_open(self) -> bool:
        return self._closed_reason is None

    def send_raw(self, data: bytes) -> None:
        """Write bytes that are not a request (the supervisor's source at start-up)."""
        with self._write_lock:
            self._write(data)

    def request(self, op: str, reply_timeout_s: float, **params: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; raises SandboxError if none comes."""
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self._closed_reason is not None:
                raise SandboxError(self._closed_reason)
            request_id = next(self._ids)
            self._pending[request_id] = future
        try:
            self.send_raw(json.dumps({"id": request_id, "op": op, **params}).encode() + b"\n")
            reply = future.result(timeout=reply_timeout_s)
        except TimeoutError:
            raise SandboxError(f"supervisor gave no reply to {op!r} within {reply_timeout_s:.0f} s") from None
        except OSError as exc:
            raise SandboxError(f"cannot write to the supervisor: {exc}") from exc
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
        if not reply["ok"]:
            if reply.get("errno") is not None:
                # OSError(errno, ...) becomes the matching subclass: FileNotFoundError, PermissionError...
                raise OSError(reply["errno"], reply["message"], reply.get("filename"))
            raise SandboxError(f"supervisor {op!r} failed: {reply['error']}: {reply['message']}")
        return reply

    def _read_replies(self, read_chunk: Callable[[], bytes]) -> None:
        partial: list[bytes] = []  # pieces of a line split across chunks (large archives)
        try:
            while chunk := read_chunk():
                start = 0
                while (end := chunk.find(b"\n", start)) != -1:
                    partial.append(chunk[start:end])
                    self._dispatch(b"".join(partial))
                    partial.clear()
                    start = end + 1
                partial.append(chunk[start:])
        except (OSError, ValueError) as exc:
            self._fail(f"supervisor channel broke: {exc}")
        self._fail("supervisor channel closed")

    def _dispatch(self, line: bytes) -> None:
        reply = json.loads(line)
        with self._lock:
            future = self._pending.get(reply["id"])
        if future is not None:
            future.set_result(reply)

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._closed_reason is not None:
                return
            detail = self._describe_failure()
            self._closed_reason = f"{reason}{': ' + detail if detail else ''}"
            pending = list(self._pending.values())
        for future in pending:
            future.set_exception(SandboxError(self._closed_reason))


def encode_bytes(data: bytes | str) -> str:
    """Bytes (or UTF-8 text) as the base64 text the protocol carries."""
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def decode_bytes(text: str) -> bytes:
    return base64.b64decode(text)
