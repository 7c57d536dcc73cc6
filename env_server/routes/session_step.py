"""The HTTP session's step (`POST /sessions/{id}/step`) answered on plain ASGI, ahead of FastAPI (decision 143).

A trainer that steps over HTTP sends this request more than every other together, and FastAPI's layers around it
(routing through every route, the request object, dependency solving, the body's validation against a field, the
response object, and the middleware those pass through) cost an HTTP step about 0.3 ms more of the service's CPU
than the same step over the WebSocket (docs/benchmarks.md). `SessionStepLane` answers a valid step itself, with
what the FastAPI route would answer (`session_step` and `observation_response`, as the route calls them), and hands every other
request on unchanged, so the FastAPI route still documents the step in OpenAPI and refuses a body that does not
validate with the same status, code and message as before. It sits inside `RequestGuard`, so the token and the
body's size limit apply to it as to every route, and an error it does not expect becomes the guard's typed 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openenv.core.env_server.types import Observation
from pydantic import ValidationError

from env_server.http_errors import error_response
from env_server.middleware import ASGIApp, Message, Receive, Scope, Send, replaying
from env_server.routes.http import StepBody, observation_response
from env_server.service import Service
from env_server.service_errors import ServiceError

STEP_PATH = re.compile(r"/sessions/([^/]+)/step")
"""The route's path, as Starlette matches `/sessions/{session_id}/step` (a path parameter is one segment)."""


async def session_step(service: Service, session_id: str, action: Any) -> Observation:
    """One step of session `session_id`, as the route and the lane run it (or its `ServiceError`)."""
    return await service.step(service.sessions.get(session_id), action, "http")


class SessionStepLane:
    """ASGI: answers a `POST /sessions/{id}/step` whose body is a valid `StepBody`; passes on everything else."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = _session_step(scope)
        if matched is None:
            return await self._app(scope, receive, send)
        message = await receive()  # `RequestGuard` read the whole body: it replays it as one message
        body = _valid_body(scope, message)
        if body is None:
            return await self._app(scope, replaying(message, receive), send)
        try:
            observation = await session_step(scope["app"].state.service, matched, body.action)
        except ServiceError as exc:
            return await error_response(exc)(scope, receive, send)
        await observation_response(observation)(scope, receive, send)


def _session_step(scope: Scope) -> str | None:
    """The session id of a session step request (None for any other request)."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    matched = STEP_PATH.fullmatch(scope["path"])
    return matched.group(1) if matched else None


def _valid_body(scope: Scope, message: Message) -> StepBody | None:
    """The request's body as a `StepBody`, when it is one; None when FastAPI would refuse it (or read it differently)."""
    if message["type"] != "http.request" or message.get("more_body") or not _is_json(scope):
        return None
    try:
        return StepBody.model_validate(json.loads(message.get("body", b"")))
    except (ValueError, ValidationError):  # not JSON (a `ValueError`), or not a step
        return None


def _is_json(scope: Scope) -> bool:
    """Whether the request's content type is `application/json` (any case, any parameters). FastAPI reads a few more
    as JSON (`application/...+json`); those take its route."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.partition(b";")[0].strip().lower() == b"application/json"
    return False
