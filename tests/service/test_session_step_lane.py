"""The session step's ASGI lane (decision 143) answers only a valid step: every other request reaches FastAPI's
routes as it came, its body intact, so that they refuse it as they always have. (The steps it answers are the
service tests' own, and `test_api_contract.py` compares its answer with the route's.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from env_server.routes.session_step import SessionStepLane

STEP = json.dumps({"action": {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "ls"}}}).encode()
JSON = [(b"content-type", b"application/json")]


def _scope(method: str = "POST", path: str = "/sessions/s1/step", headers: list[tuple[bytes, bytes]] = JSON, **extra: Any) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": headers, "root_path": "", **extra}


PASSED_ON = {
    "another method": (_scope(method="GET"), STEP),
    "another route": (_scope(path="/sessions/s1/reset"), STEP),
    "a path of more segments": (_scope(path="/sessions/s1/x/step"), STEP),
    "a trailing slash": (_scope(path="/sessions/s1/step/"), STEP),
    "a mounted root path": (_scope(root_path="/env"), STEP),
    "no content type (FastAPI refuses it)": (_scope(headers=[]), STEP),
    "a JSON subtype (FastAPI reads it)": (_scope(headers=[(b"content-type", b"application/vnd.api+json")]), STEP),
    "a content type that is not JSON": (_scope(headers=[(b"content-type", b"text/plain")]), STEP),
    "a body that is not JSON": (_scope(), b"{not json"),
    "an empty body": (_scope(), b""),
    "an action that is a string": (_scope(), b'{"action": "bash ls"}'),
    "an unknown action type": (_scope(), b'{"action": {"type": "fly"}}'),
    "an unpaired surrogate's escape in a body that is not a step": (_scope(), b'{"action": "\\ud800"}'),
}


@pytest.mark.parametrize(("scope", "body"), PASSED_ON.values(), ids=PASSED_ON.keys())
def test_a_request_it_does_not_answer_reaches_the_app_as_it_came(scope: dict[str, Any], body: bytes) -> None:
    sent_on: list[dict[str, Any]] = []
    later = {"type": "http.disconnect"}
    messages = iter([{"type": "http.request", "body": body, "more_body": False}, later])

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def app(scope_seen: dict[str, Any], receive_seen: Any, send: Any) -> None:
        sent_on.append({"scope": scope_seen, "first": await receive_seen(), "then": await receive_seen()})

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError(f"the lane answered itself: {message}")

    asyncio.run(SessionStepLane(app)(scope, receive, send))
    assert sent_on == [{"scope": scope, "first": {"type": "http.request", "body": body, "more_body": False}, "then": later}]


def test_a_websocket_reaches_the_app_untouched() -> None:
    scope = {"type": "websocket", "path": "/sessions/s1/step", "headers": [], "root_path": ""}
    seen: list[tuple[object, object]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    async def app(scope_seen: dict[str, Any], receive_seen: Any, send_seen: Any) -> None:
        seen.append((receive_seen, send_seen))

    asyncio.run(SessionStepLane(app)(scope, receive, send))
    assert seen == [(receive, send)]
