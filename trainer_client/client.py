"""Client of the coding-env service: one session, sync (`CodingEnvClient`) or async (`AsyncCodingEnvClient`).

Two transports speak the same protocol: `http` (the stateful `/sessions` routes) and `ws`
(OpenEnv's WebSocket, one connection = one session). Connecting retries with exponential backoff;
a full service (503) raises `CapacityError` and a refused token (401) `AuthError` at once, since
waiting would not change either. Leaving the `with` block closes the session (and its sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Literal

import httpx
import websockets
from pydantic import BaseModel, ConfigDict, Field
from websockets.asyncio.client import connect as ws_connect_async
from websockets.sync.client import connect as ws_connect

from env_server.models import ApiErrorCode, ResetInfo, ToolResult


class ServiceError(RuntimeError):
    """The service refused a request; `code` says why (`ApiErrorCode` value, or a transport failure)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.code = code
        self.status = status


class CapacityError(ServiceError):
    """The service is at its session limit (HTTP 503); retry later or raise its `max_sessions`."""


class AuthError(ServiceError):
    """The service wants a valid bearer token (HTTP 401): set `api_token` (CODING_ENV_API_TOKEN on the server)."""


class ClientSettings(BaseModel):
    """Where the service is and how to talk to it."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = "http://127.0.0.1:8000"
    """Service root URL (http or https; the WebSocket URL is derived from it)."""

    api_token: str | None = None
    """Bearer token, when the service requires one."""

    transport: Literal["http", "ws"] = "http"
    """`http`: stateful `/sessions` routes; `ws`: OpenEnv's WebSocket."""

    timeout_s: float = Field(default=300.0, gt=0)
    """Timeout of one request (a step may run tests)."""

    connect_attempts: int = Field(default=5, ge=1)
    """Tries to open the session before giving up on connection errors."""

    backoff_s: float = Field(default=0.5, ge=0)
    """First wait between connection attempts; doubles each time."""

    show_hints: bool = False
    """Ask the service to append hints to the tool output the policy sees."""


class StepResult(BaseModel):
    """One tool call's answer."""

    observation: ToolResult
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Grading facts after `submit` (`tests_passed`, `tests_total`, ...) and anything else the tool reports."""
    reward: float | None = None
    done: bool = False


# ------------------------------------------------------------------ protocol (transport-independent)


def _headers(settings: ClientSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}


def _ws_url(settings: ClientSettings) -> str:
    root = settings.base_url.rstrip("/")
    return ("wss://" + root[len("https://") :] if root.startswith("https://") else "ws://" + root.split("://", 1)[-1]) + "/ws"


def _refusal(status: int | None, body: Any) -> ServiceError:
    error = body.get("error", body) if isinstance(body, dict) else {}
    code = str(error.get("code", "http_error")) if isinstance(error, dict) else "http_error"
    message = str(error.get("message", body)) if isinstance(error, dict) else str(body)
    if status == 503 or code in (ApiErrorCode.CAPACITY_REACHED.value, "CAPACITY_REACHED"):
        return CapacityError(code, message, status)
    if status == 401 or code == ApiErrorCode.UNAUTHORIZED.value:
        return AuthError(code, message, status)
    return ServiceError(code, message, status)


def _http_payload(response: httpx.Response) -> Any:
    body = response.json() if response.content else None
    if response.status_code >= 400:
        raise _refusal(response.status_code, body)
    return body


def _ws_payload(raw: str | bytes) -> dict[str, Any]:
    frame = json.loads(raw)
    if frame.get("type") == "error":
        raise _refusal(None, frame.get("data", {}))
    return frame.get("data", {})


def _reset_body(settings: ClientSettings, task_id: str | None, seed: int | None, task: dict | None) -> dict[str, Any]:
    body: dict[str, Any] = {"show_hints": settings.show_hints}
    for key, value in (("task_id", task_id), ("seed", seed), ("task", task)):
        if value is not None:
            body[key] = value
    return body


def _step_action(tool_name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    return {"type": "call_tool", "tool_name": tool_name, "arguments": arguments}


def _reset_info(payload: dict[str, Any]) -> ResetInfo:
    return ResetInfo.model_validate(payload["observation"])


def _step_result(payload: dict[str, Any]) -> StepResult:
    observation = payload["observation"]
    return StepResult(
        observation=ToolResult.model_validate(observation),
        metadata=observation.get("metadata") or {},
        reward=payload.get("reward"),
        done=bool(payload.get("done")),
    )


def _function_schemas(rpc_reply: dict[str, Any]) -> list[dict[str, Any]]:
    """MCP `tools/list` entries as OpenAI function schemas (what chat templates and TRL use)."""
    if rpc_reply.get("error"):
        raise ServiceError("mcp_error", str(rpc_reply["error"]))
    return [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["inputSchema"]}}
        for t in rpc_reply["result"]["tools"]
    ]


_LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
_CONNECT_ERRORS = (httpx.TransportError, OSError, websockets.exceptions.InvalidHandshake)


def _handshake_refusal(error: Exception) -> ServiceError | None:
    response = getattr(error, "response", None)
    if response is not None and getattr(response, "status_code", None) in (401, 503):
        return _refusal(response.status_code, {"message": "WebSocket handshake refused"})
    return None


# ------------------------------------------------------------------ sync


class CodingEnvClient:
    """One session of the service (sync). Use as a context manager, or call `close()`."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        self.settings = settings or ClientSettings()
        self._http = httpx.Client(base_url=self.settings.base_url, headers=_headers(self.settings), timeout=self.settings.timeout_s)
        self._session_id: str | None = None
        self._ws: Any = None
        self._ws_stack = contextlib.ExitStack()

    def __enter__(self) -> CodingEnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_tools(self) -> list[dict[str, Any]]:
        """The service's tools as OpenAI function schemas (needs no session)."""
        return _function_schemas(_http_payload(self._http.post("/mcp", json=_LIST_TOOLS)))

    def _open(self) -> None:
        delay = self.settings.backoff_s
        for attempt in range(self.settings.connect_attempts):
            try:
                if self.settings.transport == "ws":
                    self._ws = self._ws_stack.enter_context(
                        ws_connect(_ws_url(self.settings), additional_headers=_headers(self.settings), open_timeout=self.settings.timeout_s, max_size=None)
                    )
                else:
                    self._session_id = _http_payload(self._http.post("/sessions"))["session_id"]
                return
            except _CONNECT_ERRORS as error:
                if (refusal := _handshake_refusal(error)) is not None:
                    raise refusal from error
                if attempt + 1 == self.settings.connect_attempts:
                    raise ServiceError("unreachable", f"{self.settings.base_url}: {error}") from error
                time.sleep(delay)  # backoff before the next connection attempt
                delay *= 2

    def _call(self, ws_type: str, data: dict[str, Any], http_path: str) -> dict[str, Any]:
        if self._ws is None and self._session_id is None:
            self._open()
        if self._ws is not None:
            self._ws.send(json.dumps({"type": ws_type, "data": data}))
            return _ws_payload(self._ws.recv(timeout=self.settings.timeout_s))
        body = {"action": data} if ws_type == "step" else data
        return _http_payload(self._http.post(f"/sessions/{self._session_id}/{http_path}", json=body))

    def reset(self, task_id: str | None = None, *, seed: int | None = None, task: dict[str, Any] | None = None) -> ResetInfo:
        """Start an episode on a registered task (`task_id`), an inline spec (`task`), or a seeded pick."""
        return _reset_info(self._call("reset", _reset_body(self.settings, task_id, seed, task), "reset"))

    def step(self, tool_name: str, arguments: dict[str, Any] | str | None = None) -> StepResult:
        """Call one tool; `arguments` may be the model's raw JSON text."""
        return _step_result(self._call("step", _step_action(tool_name, arguments or {}), "step"))

    def close(self) -> None:
        """End the session (frees its sandbox); safe to call twice."""
        try:
            if self._ws is not None:
                self._ws_stack.close()
            elif self._session_id is not None:
                self._http.delete(f"/sessions/{self._session_id}")
        except _CONNECT_ERRORS:
            pass  # the service is gone; its idle timeout frees the sandbox
        finally:
            self._ws = self._session_id = None
            self._http.close()


# ------------------------------------------------------------------ async


class AsyncCodingEnvClient:
    """One session of the service (asyncio). Use with `async with`, or await `close()`."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        self.settings = settings or ClientSettings()
        self._http = httpx.AsyncClient(base_url=self.settings.base_url, headers=_headers(self.settings), timeout=self.settings.timeout_s)
        self._session_id: str | None = None
        self._ws: Any = None
        self._ws_stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> AsyncCodingEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def list_tools(self) -> list[dict[str, Any]]:
        """The service's tools as OpenAI function schemas (needs no session)."""
        return _function_schemas(_http_payload(await self._http.post("/mcp", json=_LIST_TOOLS)))

    async def _open(self) -> None:
        delay = self.settings.backoff_s
        for attempt in range(self.settings.connect_attempts):
            try:
                if self.settings.transport == "ws":
                    self._ws = await self._ws_stack.enter_async_context(
                        ws_connect_async(_ws_url(self.settings), additional_headers=_headers(self.settings), open_timeout=self.settings.timeout_s, max_size=None)
                    )
                else:
                    self._session_id = _http_payload(await self._http.post("/sessions"))["session_id"]
                return
            except _CONNECT_ERRORS as error:
                if (refusal := _handshake_refusal(error)) is not None:
                    raise refusal from error
                if attempt + 1 == self.settings.connect_attempts:
                    raise ServiceError("unreachable", f"{self.settings.base_url}: {error}") from error
                await asyncio.sleep(delay)  # backoff before the next connection attempt
                delay *= 2

    async def _call(self, ws_type: str, data: dict[str, Any], http_path: str) -> dict[str, Any]:
        if self._ws is None and self._session_id is None:
            await self._open()
        if self._ws is not None:
            await self._ws.send(json.dumps({"type": ws_type, "data": data}))
            return _ws_payload(await asyncio.wait_for(self._ws.recv(), self.settings.timeout_s))
        body = {"action": data} if ws_type == "step" else data
        return _http_payload(await self._http.post(f"/sessions/{self._session_id}/{http_path}", json=body))

    async def reset(self, task_id: str | None = None, *, seed: int | None = None, task: dict[str, Any] | None = None) -> ResetInfo:
        """Start an episode on a registered task (`task_id`), an inline spec (`task`), or a seeded pick."""
        return _reset_info(await self._call("reset", _reset_body(self.settings, task_id, seed, task), "reset"))

    async def step(self, tool_name: str, arguments: dict[str, Any] | str | None = None) -> StepResult:
        """Call one tool; `arguments` may be the model's raw JSON text."""
        return _step_result(await self._call("step", _step_action(tool_name, arguments or {}), "step"))

    async def close(self) -> None:
        """End the session (frees its sandbox); safe to call twice."""
        try:
            if self._ws is not None:
                await self._ws_stack.aclose()
            elif self._session_id is not None:
                await self._http.delete(f"/sessions/{self._session_id}")
        except _CONNECT_ERRORS:
            pass  # the service is gone; its idle timeout frees the sandbox
        finally:
            self._ws = self._session_id = None
            await self._http.aclose()
