"""Stateful HTTP sessions (`/sessions/...`), for frameworks that do not speak WebSocket: open a
session, reset and step it as often as needed, read its state and trajectory, close it.

Observation routes answer with `env_server.routes.http.observation_response`.
"""

from __future__ import annotations

from fastapi import APIRouter, Body, Request, Response
from openenv.core.env_server.types import ResetResponse, StepResponse

from env_server.http_errors import BODY_ERRORS, errors
from env_server.models import EpisodeRecord, ForkRequestBody, ResetRequestBody, SessionCreated, SessionsForked
from env_server.openenv_models import CodingState
from env_server.routes.http import StepBody, observation_response
from env_server.routes.session_step import session_step
from env_server.service import request_gone, service_of

router = APIRouter()


@router.post("/sessions", response_model=SessionCreated, status_code=201, responses=errors(503), tags=["Sessions"])
async def open_session(request: Request) -> SessionCreated:
    """At the session cap the request waits in the admission queue (`admission_timeout_s`)."""
    return SessionCreated(session_id=(await service_of(request).open_session(lambda: request_gone(request))).id)


@router.post("/sessions/{session_id}/reset", response_model=ResetResponse, responses=errors(*BODY_ERRORS, 404, 503), tags=["Sessions"])
async def reset_session(
    request: Request, session_id: str, body: ResetRequestBody = Body(default_factory=ResetRequestBody)
) -> Response:
    service = service_of(request)
    return observation_response(await service.reset(service.sessions.get(session_id), body))


@router.post("/sessions/{session_id}/step", response_model=StepResponse, responses=errors(*BODY_ERRORS, 404, 409, 503), tags=["Sessions"])
async def step_session(request: Request, session_id: str, body: StepBody) -> Response:
    """A valid step is answered ahead of this route, with the same reply (`env_server.routes.session_step`)."""
    return observation_response(await session_step(service_of(request), session_id, body.action))


@router.get("/sessions/{session_id}/state", response_model=CodingState, responses=errors(404, 422), tags=["Sessions"])
async def session_state(request: Request, session_id: str) -> CodingState:
    service = service_of(request)
    session = service.sessions.get(session_id)
    return await service.sessions.run(session, lambda: session.env.state)


@router.get("/sessions/{session_id}/trajectory", response_model=EpisodeRecord, responses=errors(404, 409, 422), tags=["Sessions"])
async def session_trajectory(request: Request, session_id: str) -> EpisodeRecord:
    service = service_of(request)
    session = service.sessions.get(session_id)
    return await service.sessions.run(session, lambda: session.env.trajectory().model_copy(deep=True))


@router.delete("/sessions/{session_id}", status_code=204, responses=errors(404, 422), tags=["Sessions"])
async def close_session(request: Request, session_id: str) -> Response:
    await service_of(request).sessions.close(session_id)
    return Response(status_code=204)


@router.post(
    "/sessions/{session_id}/fork", response_model=SessionsForked, status_code=201, responses=errors(*BODY_ERRORS, 404, 409, 503), tags=["Sessions"]
)
async def fork_session(request: Request, session_id: str, body: ForkRequestBody) -> SessionsForked:
    """`n` new sessions, each continuing this session's episode from where it stands (workspace,
    trajectory, step count, task, hint setting); once a call in flight here has finished."""
    service = service_of(request)
    return await service.fork(service.sessions.get(session_id), body)
