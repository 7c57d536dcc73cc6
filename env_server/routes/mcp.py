"""MCP JSON-RPC 2.0 (`POST /mcp`, and the `mcp` frames of `/ws`): `tools/list`, `tools/call`,
`openenv/session/create|close`. A tool call steps the same session any other transport would."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, Request
from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcRequest, JsonRpcResponse, McpMethod
from pydantic import ValidationError

from env_server.http_errors import errors
from env_server.service import Service, request_gone, service_of
from env_server.service_errors import ServiceError
from env_server.sessions import Session
from env_server.tools import TOOLS

router = APIRouter()


def rpc_error(code: JsonRpcErrorCode, message: str, request_id: Any = None, data: Any = None) -> JsonRpcResponse:
    return JsonRpcResponse.error_response(code, message, data=data, request_id=request_id)


async def handle_rpc(
    service: Service, rpc: JsonRpcRequest, bound: Session | None = None, client_gone: Callable[[], Awaitable[object]] | None = None
) -> JsonRpcResponse:
    """One MCP JSON-RPC call; `bound` is the session of the WebSocket it arrived on, if any;
    `client_gone()` completes when an HTTP caller leaves (ends a wait in the admission queue)."""
    params = rpc.params
    try:
        if rpc.method == "openenv/session/create":
            session = bound or await service.open_session(client_gone)
            return JsonRpcResponse.success({"session_id": session.id}, rpc.id)
        if rpc.method == "openenv/session/close":
            target = params.get("session_id")
            if not isinstance(target, str):
                return rpc_error(JsonRpcErrorCode.INVALID_PARAMS, "'session_id' is required", rpc.id)
            await service.sessions.close(target)
            return JsonRpcResponse.success({"session_id": target, "closed": True}, rpc.id)
        if rpc.method == McpMethod.TOOLS_LIST:
            return JsonRpcResponse.success({"tools": [t.mcp_schema() for t in TOOLS.values()]}, rpc.id)
        if rpc.method == McpMethod.TOOLS_CALL:
            name, target = params.get("name"), params.get("session_id")
            if not isinstance(name, str) or not name:
                return rpc_error(JsonRpcErrorCode.INVALID_PARAMS, "'name' is required", rpc.id)
            if bound is None and not isinstance(target, str):
                return rpc_error(
                    JsonRpcErrorCode.INVALID_PARAMS, "'session_id' is required: open one with openenv/session/create", rpc.id
                )
            session = bound or service.sessions.get(target)
            action = {"type": "call_tool", "tool_name": name, "arguments": params.get("arguments") or {}}
            observation = await service.step(session, action, "mcp")
            result = observation.model_dump(mode="json", exclude={"reward", "done"})
            return JsonRpcResponse.success({**result, "reward": observation.reward, "done": observation.done}, rpc.id)
        return rpc_error(JsonRpcErrorCode.METHOD_NOT_FOUND, f"method not found: {rpc.method}", rpc.id)
    except ServiceError as exc:
        return rpc_error(JsonRpcErrorCode.SERVER_ERROR, exc.message, rpc.id, exc.body().model_dump(mode="json"))


@router.post("/mcp", responses=errors(413), tags=["OpenEnv"])
async def mcp(request: Request) -> dict[str, Any]:
    """MCP JSON-RPC 2.0: `tools/list`, `tools/call` (with `session_id`), `openenv/session/create|close`."""
    try:
        payload = json.loads(await request.body())
    except ValueError:
        return rpc_error(JsonRpcErrorCode.PARSE_ERROR, "parse error").model_dump()
    try:
        rpc = JsonRpcRequest.model_validate(payload)
    except ValidationError as exc:
        return rpc_error(JsonRpcErrorCode.INVALID_REQUEST, f"invalid request: {exc.error_count()} errors").model_dump()
    return (await handle_rpc(service_of(request), rpc, client_gone=lambda: request_gone(request))).model_dump()
