"""Request guards in front of every route: bearer-token auth, the request body size limit, and
a typed 500 for an unhandled error.

Pure ASGI (not Starlette's BaseHTTPMiddleware) so the same code covers WebSocket handshakes and
adds no per-request task.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Awaitable, Callable

from env_server.models import ApiError, ApiErrorCode
from env_server.service_errors import HTTP_STATUS

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/viewer/login"})
"""Routes that answer without a token: liveness probes, and the form that asks for one."""

VIEWER_COOKIE = "coding_env_viewer"
"""The cookie `/viewer/login` sets: the token, for the episode viewer's pages (a browser sends no header)."""
VIEWER_PATH = "/viewer"

# 4401 mirrors HTTP 401 in the private WebSocket close-code range (4000-4999).
WS_UNAUTHORIZED_CLOSE = 4401


def _error_body(code: ApiErrorCode, message: str) -> bytes:
    return ApiError(code=code, message=message).model_dump_json().encode()


class RequestGuard:
    """Refuses unauthenticated requests (401) and oversized bodies (413) before routing, and
    answers an error no route handled with a typed 500 (`internal_error`).

    The 500 is answered here, not by a FastAPI `Exception` handler: Starlette runs that handler in
    its outermost middleware and then re-raises, so the server closes the keep-alive connection
    under the client. Answered here, the exception ends with the response and the connection lives."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int) -> None:
        self._app = app
        self._token = token.encode() if token else None
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self._app(scope, receive, send)
        if not self._authorized(scope):
            if scope["type"] == "websocket":
                return await self._deny_websocket(scope, send)
            return await _respond(send, ApiErrorCode.UNAUTHORIZED, "missing or wrong bearer token", ((b"www-authenticate", b"Bearer"),))
        if scope["type"] == "http":
            return await self._limited_http(scope, receive, send)
        await self._app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        if self._token is None or scope["path"] in OPEN_PATHS:
            return True
        headers = dict(scope["headers"])
        scheme, _, presented = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(presented.strip(), self._token):
            return True
        # The viewer's cookie opens its read-only pages and nothing else: no action, no other route.
        viewer_page = scope["type"] == "http" and scope.get("method") == "GET" and (
            scope["path"] == VIEWER_PATH or scope["path"].startswith(VIEWER_PATH + "/"))
        return viewer_page and hmac.compare_digest(_cookie(headers.get(b"cookie", b""), VIEWER_COOKIE), self._token)

    async def _deny_websocket(self, scope: Scope, send: Send) -> None:
        if "websocket.http.response" in scope.get("extensions", {}):
            body = _error_body(ApiErrorCode.UNAUTHORIZED, "missing or wrong bearer token")
            headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": WS_UNAUTHORIZED_CLOSE})

    async def _limited_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            return await self._too_large(send)
        # Read the body up front (it is small by construction) so a chunked upload is bounded too.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body_bytes:
                return await self._too_large(send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        replay = replaying({"type": "http.request", "body": b"".join(chunks), "more_body": False}, receive)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, replay, tracking_send)
        except Exception as exc:
            if started:
                raise  # half a response is out: only closing the connection can signal the error
            log.exception("unhandled error on %s %s", scope.get("method"), scope["path"])
            await _respond(send, ApiErrorCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")

    async def _too_large(self, send: Send) -> None:
        await _respond(send, ApiErrorCode.BODY_TOO_LARGE, f"request body exceeds {self._max_body_bytes} bytes")


def replaying(first: Message, receive: Receive) -> Receive:
    """`receive`, after handing out `first` (a message already read from it) once more."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return first

    return replay


def _cookie(header: bytes, name: str) -> bytes:
    """The value of cookie `name` in a `Cookie` header (empty when absent)."""
    for pair in header.split(b";"):
        key, _, value = pair.strip().partition(b"=")
        if key.decode("latin-1") == name:
            return value
    return b""


async def _respond(send: Send, code: ApiErrorCode, message: str, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = _error_body(code, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": HTTP_STATUS[code], "headers": headers})
    await send({"type": "http.response.body", "body": body})

