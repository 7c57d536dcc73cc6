"""OpenEnv's WebSocket (`/ws`): one connection = one session = one sandbox. Each text frame is an
OpenEnv message (`reset`, `step`, `state`, `mcp`, `close`, and our `fork`) answered by one frame; a refused
frame is answered by an error frame and the connection stays usable."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcRequest
from openenv.core.env_server.types import WSErrorCode
from pydantic import ValidationError

from env_server.admission import ClientGone
from env_server.models import ApiErrorCode
from env_server.routes.mcp import handle_rpc, rpc_error
from env_server.service import Service, observation_reply, parse_fork, parse_reset, service_of
from env_server.service_errors import ServiceError
from env_server.sessions import Session

router = APIRouter()

OPENENV_WS_CODES: dict[ApiErrorCode, WSErrorCode] = {
    ApiErrorCode.INVALID_JSON: WSErrorCode.INVALID_JSON,
    ApiErrorCode.INVALID_REQUEST: WSErrorCode.VALIDATION_ERROR,
    ApiErrorCode.CAPACITY_REACHED: WSErrorCode.CAPACITY_REACHED,
    ApiErrorCode.SESSION_NOT_FOUND: WSErrorCode.SESSION_ERROR,
}
"""Our refusal codes as OpenEnv's WebSocket error codes (the rest are EXECUTION_ERROR)."""


def _ws_error(exc: ServiceError) -> str:
    code = OPENENV_WS_CODES.get(exc.code, WSErrorCode.EXECUTION_ERROR)
    return json.dumps({"type": "error", "data": {"message": exc.message, "code": code.value, "error": exc.body().model_dump(mode="json")}})


async def _ws_reply(service: Service, session: Session, raw: str) -> str | None:
    """The answer to one WebSocket frame (OpenEnv message types); None for `close`."""
    try:
        message = json.loads(raw)
    except ValueError:
        raise ServiceError(ApiErrorCode.INVALID_JSON, "frame is not valid JSON") from None
    if not isinstance(message, dict):
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, "frame must be a JSON object with a 'type'")
    kind, data = message.get("type"), message.get("data") or {}
    if not isinstance(data, dict):
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, "'data' must be an object")
    if kind == "reset":
        return observation_reply(await service.reset(session, parse_reset(data)), frame=True).decode()
    if kind == "step":
        return observation_reply(await service.step(session, data, "ws"), frame=True).decode()
    if kind == "state":
        state = await service.sessions.run(session, lambda: session.env.state)
        return json.dumps({"type": "state", "data": state.model_dump(mode="json")})
    if kind == "mcp":
        try:
            rpc = JsonRpcRequest.model_validate(data)
        except ValidationError:
            response = rpc_error(JsonRpcErrorCode.INVALID_REQUEST, "invalid JSON-RPC request")
        else:
            response = await handle_rpc(service, rpc, bound=session)
        return json.dumps({"type": "mcp", "data": response.model_dump()})
    if kind == "fork":
        return json.dumps({"type": "fork", "data": (await service.fork(session, parse_fork(data))).model_dump()})
    if kind == "close":
        return None
    raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"unknown message type {kind!r}; expected reset, step, state, mcp, fork or close")


@router.websocket("/ws")
async def websocket_session(websocket: WebSocket) -> None:
    """One connection = one session = one sandbox, freed the moment the connection drops.
    `?session_id=` attaches to an existing (HTTP/MCP) session instead, which then outlives it.
    At the session cap the connection is accepted and waits in the admission queue; a frame the
    client sends meanwhile is answered once it is admitted, a close ends its wait."""
    service = service_of(websocket)
    await websocket.accept()
    attach = websocket.query_params.get("session_id")
    first_frame = asyncio.ensure_future(websocket.receive())
    try:
        session = service.sessions.get(attach) if attach else await service.open_session(lambda: _disconnect_in(first_frame))
    except ClientGone:
        return
    except ServiceError as exc:
        first_frame.cancel()
        await websocket.send_text(_ws_error(exc))
        await websocket.close()
        return
    try:
        frame = await first_frame
        while frame["type"] != "websocket.disconnect":
            raw = frame.get("text") if frame.get("text") is not None else (frame.get("bytes") or b"").decode("utf-8", "replace")
            try:
                reply = await _ws_reply(service, session, raw)
            except ServiceError as exc:
                reply = _ws_error(exc)
            if reply is None:
                break
            await websocket.send_text(reply)
            frame = await websocket.receive()
    except WebSocketDisconnect:
        pass
    finally:
        if not attach:
            try:
                await service.sessions.close(session.id)
            except ServiceError:
                pass  # already closed (idle reaper)
    try:
        await websocket.close()
    except (RuntimeError, WebSocketDisconnect):
        pass  # the client has gone (OpenEnv's `EnvClient` closes first)


async def _disconnect_in(first_frame: asyncio.Future[dict]) -> None:
    """Returns if the client's first frame is its disconnect; otherwise never (that frame is kept
    for the session to answer)."""
    frame = await asyncio.shield(first_frame)
    if frame["type"] != "websocket.disconnect":
        await asyncio.Future()  # a real frame: the client is still there; wait until cancelled
