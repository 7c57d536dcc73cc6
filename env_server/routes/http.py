"""OpenEnv's stateless HTTP routes (`/health`, `/metadata`, `/schema`, `/reset`, `/step`, `/state`)
and the operations routes (`/metrics`, `/tasks`, and the privileged `/references`).

Observation routes return the JSON `observation_reply` writes (`observation_response`): their
`response_model` documents the shape, without FastAPI validating or serializing it again.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Request, Response
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    HealthResponse,
    HealthStatus,
    Observation,
    ResetResponse,
    SchemaResponse,
    StepRequest,
    StepResponse,
)
from pydantic import Field

from env_server.http_errors import BODY_ERRORS, errors
from env_server.models import ApiErrorCode, ResetRequestBody, TaskPage, TaskReference
from env_server.openenv_models import ACTIONS, AnyAction, CodingObservation, CodingResetObservation, CodingState
from env_server.package_docs import with_absolute_links
from env_server.service import observation_reply, request_gone, service_of
from env_server.service_errors import ServiceError
from env_server.tasks.references import task_reference
from env_server.tasks.splits import Split

router = APIRouter()


class StepBody(StepRequest):
    """Body of `POST /step` and `POST /sessions/{id}/step`: OpenEnv's `StepRequest` whose
    `action` is one of the action types (a union on `type`), so the schema says what is accepted."""

    action: Annotated[AnyAction, Field(discriminator="type")]  # type: ignore[assignment]


def observation_response(observation: Observation) -> Response:
    """An observation route's answer: OpenEnv's reply, as `observation_reply` writes it."""
    return Response(observation_reply(observation), media_type="application/json")


@router.get("/health", response_model=HealthResponse, tags=["OpenEnv"])
async def health() -> HealthResponse:
    return HealthResponse(status=HealthStatus.HEALTHY)


@router.get("/metadata", response_model=EnvironmentMetadata, responses=errors(), tags=["OpenEnv"])
async def metadata(request: Request) -> EnvironmentMetadata:
    return with_absolute_links(service_of(request).new_environment(None).get_metadata(), str(request.base_url))


@router.get("/schema", response_model=SchemaResponse, responses=errors(), tags=["OpenEnv"])
async def schema() -> SchemaResponse:
    return SchemaResponse(
        action=ACTIONS.json_schema(),
        observation=CodingObservation.model_json_schema(),
        reset_observation=CodingResetObservation.model_json_schema(),
        state=CodingState.model_json_schema(),
    )


@router.post("/reset", response_model=ResetResponse, responses=errors(*BODY_ERRORS, 404, 503), tags=["OpenEnv"])
async def reset(request: Request, body: ResetRequestBody = Body(default_factory=ResetRequestBody)) -> Response:
    """Stateless reset, as OpenEnv's HTTP route: a sandbox is prepared, reported on and freed.
    Use `/sessions` or `/ws` to act on the episode."""
    service = service_of(request)
    session = await service.open_session(lambda: request_gone(request))
    try:
        return observation_response(await service.reset(session, body))
    finally:
        await service.sessions.close(session.id)


@router.post("/step", response_model=StepResponse, responses=errors(*BODY_ERRORS, 409, 503), tags=["OpenEnv"])
async def step(request: Request, body: StepBody) -> Response:
    """Stateless step, as OpenEnv's HTTP route: only `list_tools` can succeed (no episode exists);
    a tool call answers 409 `episode_not_started` (no auto-reset: the episode would end with the request)."""
    service = service_of(request)
    session = await service.open_session(lambda: request_gone(request))
    try:
        return observation_response(await service.step(session, body.action, "http", auto_reset=False))
    finally:
        await service.sessions.close(session.id)


@router.get("/state", response_model=CodingState, responses=errors(), tags=["OpenEnv"])
async def state() -> CodingState:
    """Stateless state (a fresh environment's): sessions have their own `/sessions/{id}/state`."""
    return CodingState()


@router.get("/metrics", tags=["Operations"], response_class=Response, responses=errors())
async def prometheus_metrics(request: Request) -> Response:
    return Response(service_of(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/tasks", response_model=TaskPage, responses=errors(404, 422), tags=["Operations"])
async def list_tasks(
    request: Request,
    suite: str | None = Query(default=None, description="Only this suite's tasks."),
    split: Split | None = Query(default=None, description="Only the fixed train or held-out split (a hash of each id)."),
    offset: int = Query(default=0, ge=0),
    limit: int = Query(default=100, ge=1, le=1000),
) -> TaskPage:
    tasks = service_of(request).tasks
    try:
        ids = await asyncio.get_running_loop().run_in_executor(None, tasks.ids, suite, split)
    except KeyError as exc:
        raise ServiceError(ApiErrorCode.TASK_NOT_FOUND, str(exc.args[0])) from exc
    return TaskPage(task_ids=ids[offset : offset + limit], total=len(ids), offset=offset, limit=limit)


@router.get("/references/{task_id:path}", response_model=TaskReference, responses=errors(403, 404), tags=["Operations"])
async def reference(
    request: Request, task_id: str, x_privileged_token: str | None = Header(default=None)
) -> TaskReference:
    """A task's reference solution as a diff, for a trainer's privileged teacher (decision 129). Needs the
    service's `privileged_token` in `X-Privileged-Token` (besides the bearer token where one is set): an
    agent's sandbox has no network, and a client that drives agents under evaluation must not hold it."""
    configured = service_of(request).settings.privileged_token
    if configured is None:
        raise ServiceError(ApiErrorCode.FORBIDDEN, "this service serves no references: it was started without a privileged_token")
    if x_privileged_token is None or not hmac.compare_digest(x_privileged_token.encode(), configured.get_secret_value().encode()):
        raise ServiceError(ApiErrorCode.FORBIDDEN, "missing or wrong X-Privileged-Token")
    try:
        task = await asyncio.get_running_loop().run_in_executor(None, service_of(request).tasks.get, task_id)
    except KeyError as exc:
        raise ServiceError(ApiErrorCode.TASK_NOT_FOUND, str(exc.args[0])) from exc
    found = task_reference(task)
    if found is None:
        raise ServiceError(ApiErrorCode.NO_REFERENCE, f"task {task_id!r} carries no reference solution")
    return found
