"""Client of the coding-env service: one session, sync (`CodingEnvClient`) or async (`AsyncCodingEnvClient`).

Two transports speak the same protocol: `http` (the stateful `/sessions` routes) and `ws`
(OpenEnv's WebSocket, one connection = one session). Connecting retries with exponential backoff;
a full service (503) raises `CapacityError` and a refused token (401) `AuthError` at once, since
waiting would not change either. Leaving the `with` block closes the session (and its sandbox).

Given several base URLs (replicas, `ClientSettings.base_urls`), a new session goes to the one with
the fewest sessions this process has open there, passing over one that refuses (503, 502) or is down
(`trainer_client.replica_choice`). A session that is gone mid-episode (its replica died or
restarted) raises one typed error, `SessionLostError`; the client then holds no session, and its
next `reset()` opens a new one (decision 111).

Everything but the I/O is written once, in `_SessionCore`: the requests of both transports, the
parsing of replies into typed results or errors, and the retry policy. The two clients are thin
shells around it that send, receive and wait, each in its own style.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar

import httpx
import websockets
from pydantic import BaseModel, ConfigDict, Field, field_validator
from websockets.asyncio.client import connect as ws_connect_async
from websockets.sync.client import connect as ws_connect

from env_server.models import (
    PROTOCOL_VERSION,
    ApiErrorCode,
    ResetInfo,
    SessionsForked,
    StepObservation,
    TaskPage,
    TaskReference,
)
from trainer_client.replica_choice import replica_choice


class ClientError(RuntimeError):
    """The service refused a request; `code` says why (`ApiErrorCode` value, or a transport failure)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.code = code
        self.status = status


class CapacityError(ClientError):
    """The service is at its session limit (HTTP 503); retry later or raise its `max_sessions`."""


class AuthError(ClientError):
    """The service wants a valid bearer token (HTTP 401): set `api_token` (CODING_ENV_API_TOKEN on the server)."""


class SessionLostError(ClientError):
    """The session is gone mid-episode (code `session_lost`): its replica died or restarted (the
    connection broke, the proxy answered `session_lost`, or the service no longer knows the session).
    The episode cannot go on; the client holds no session any more and `reset()` opens a new one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(ApiErrorCode.SESSION_LOST.value, message, status)


class ClientSettings(BaseModel):
    """Where the service is and how to talk to it."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = "http://127.0.0.1:8000"
    """Service root URL (http or https; the WebSocket URL is derived from it)."""

    base_urls: list[str] = Field(default_factory=list)
    """Several replicas of the service (or several proxies): new sessions are spread across them and
    skip one that refuses or is down (decision 111). Empty: `base_url` alone."""

    refused_cooldown_s: float = Field(default=10.0, ge=0)
    """How long a base URL that refused a new session (503/502) or could not be reached is tried only
    after every other one."""

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

    privileged_token: str | None = Field(default=None, min_length=1, repr=False)
    """The service's `privileged_token`, for `task_reference` (a reference solution, read only by the SDPO
    teacher's `reference` hint source; decision 129). None: that source is unavailable."""

    tools: list[str] | None = None
    """The tools of every episode, by name (`submit` is added: it ends an episode); None: every tool
    the service has. A smaller set is a shorter prompt for a small model."""

    @field_validator("tools")
    @classmethod
    def _tools_end_with_submit(cls, tools: list[str] | None) -> list[str] | None:
        return tools if tools is None or "submit" in tools else [*tools, "submit"]

    @property
    def urls(self) -> list[str]:
        """The base URLs new sessions may go to."""
        return self.base_urls or [self.base_url]


class StepResult(BaseModel):
    """What the service answers a step (OpenEnv's name for it): the step's typed observation, its
    reward and whether the episode is done."""

    observation: StepObservation
    """The typed result: output, `error_kind` and hint, every call's result, and after grading
    `tests_passed`, `tests_total`, `end_reason`, the step's and the episode's monitor flags."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Extensions only, what has no typed field (`failing_tests`, `grading_ms`, `auto_reset`): this
    client resets onto `PROTOCOL_VERSION`, which repeats no typed field here."""
    reward: float | None = None
    """The episode's reward on the step that ended it; None before (and for an aborted episode)."""
    done: bool = False
    """The episode is over: graded, failed or aborted."""


# ------------------------------------------------------------------ the core (no I/O)


def _refusal(status: int | None, body: Any) -> ClientError:
    error = body.get("error", body) if isinstance(body, dict) else {}
    code = str(error.get("code", "http_error")) if isinstance(error, dict) else "http_error"
    message = str(error.get("message", body)) if isinstance(error, dict) else str(body)
    if status == 503 or code in (ApiErrorCode.CAPACITY_REACHED.value, "CAPACITY_REACHED"):
        return CapacityError(code, message, status)
    if status == 401 or code == ApiErrorCode.UNAUTHORIZED.value:
        return AuthError(code, message, status)
    if code == ApiErrorCode.SESSION_LOST.value:
        return SessionLostError(message, status)
    return ClientError(code, message, status)


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


def _reset_info(payload: dict[str, Any]) -> ResetInfo:
    return ResetInfo.model_validate(payload["observation"])


def _step_result(payload: dict[str, Any]) -> StepResult:
    observation = payload["observation"]
    return StepResult(
        observation=StepObservation.model_validate(observation),
        metadata=observation.get("metadata") or {},
        reward=payload.get("reward"),
        done=bool(payload.get("done")),
    )


def _function_schemas(rpc_reply: dict[str, Any]) -> list[dict[str, Any]]:
    """MCP `tools/list` entries as OpenAI function schemas (what chat templates and TRL use)."""
    if rpc_reply.get("error"):
        raise ClientError("mcp_error", str(rpc_reply["error"]))
    return [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["inputSchema"]}}
        for t in rpc_reply["result"]["tools"]
    ]


def _handshake_refusal(error: Exception) -> ClientError | None:
    response = getattr(error, "response", None)
    if response is not None and getattr(response, "status_code", None) in (401, 503):
        return _refusal(response.status_code, {"message": "WebSocket handshake refused"})
    return None


_LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
_CONNECT_ERRORS = (httpx.TransportError, OSError, websockets.exceptions.InvalidHandshake)
_TASK_PAGE = 1000
"""Task ids per `GET /tasks` page (the route's largest)."""
_Answer = TypeVar("_Answer")
_LOST_CONNECTION_ERRORS = (httpx.NetworkError, httpx.RemoteProtocolError, OSError, websockets.exceptions.ConnectionClosed)
"""A request on an open session failing with one of these: the connection to its replica broke
(timeouts are not among them: a long step is not a lost session)."""
_REFUSING_STATUSES = (502, 503)
"""A new session refused with one of these is tried at the next base URL (full; no replica behind a proxy)."""


@dataclass(frozen=True)
class _Request:
    """One session request, in the form of either transport."""

    kind: Literal["reset", "step", "fork"]
    data: dict[str, Any]

    def ws_frame(self) -> str:
        return json.dumps({"type": self.kind, "data": self.data})

    def http_path(self, session_id: str) -> str:
        return f"/sessions/{session_id}/{self.kind}"

    def http_body(self) -> dict[str, Any]:
        return {"action": self.data} if self.kind == "step" else self.data


class _SessionCore:
    """What both clients share: the settings, the session's handle, the requests they send and
    when to retry a connection. The subclasses add the I/O."""

    _http: Any
    """The shell's httpx client; its `base_url` is the session's base URL once one is open."""

    def __init__(self, settings: ClientSettings | None) -> None:
        self.settings = settings or ClientSettings()
        self._replicas = replica_choice(self.settings.urls, self.settings.refused_cooldown_s)
        self._base_url: str | None = None
        """The base URL the session was opened at."""
        self._session_id: str | None = None
        """The `/sessions` id (http transport), once opened."""
        self._ws: Any = None
        """The WebSocket connection (ws transport), once opened."""
        self._lost = False
        """The session was lost; only a reset (which opens a new one) is accepted."""

    @property
    def _opened(self) -> bool:
        return self._ws is not None or self._session_id is not None

    def _http_options(self) -> dict[str, Any]:
        return {"base_url": self.settings.urls[0], "headers": self._headers(), "timeout": self.settings.timeout_s}

    def _ws_options(self, base_url: str) -> dict[str, Any]:
        root = base_url.rstrip("/")
        url = "wss://" + root[len("https://") :] if root.startswith("https://") else "ws://" + root.split("://", 1)[-1]
        return {"uri": url + "/ws", "additional_headers": self._headers(), "open_timeout": self.settings.timeout_s, "max_size": None}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.api_token}"} if self.settings.api_token else {}

    def _reset_request(self, task_id: str | None, seed: int | None, task: dict[str, Any] | None) -> _Request:
        body: dict[str, Any] = {"show_hints": self.settings.show_hints, "protocol": PROTOCOL_VERSION}
        for key, value in (("task_id", task_id), ("seed", seed), ("task", task), ("tools", self.settings.tools)):
            if value is not None:
                body[key] = value
        return _Request("reset", body)

    @staticmethod
    def _step_request(tool_name: str, arguments: dict[str, Any] | str | None) -> _Request:
        return _Request("step", {"type": "call_tool", "tool_name": tool_name, "arguments": arguments or {}})

    @staticmethod
    def _message_request(content: str) -> _Request:
        return _Request("step", {"type": "assistant_message", "content": content})

    @staticmethod
    def _fork_request(n: int) -> _Request:
        return _Request("fork", {"n": n})

    def _bound_to(self, payload: dict[str, Any]) -> list[Self]:
        """Clients of the sessions a fork answered with, one each, at this session's base URL (its
        replica made them). A fork is a `/sessions` session whatever this client's transport, so
        they speak HTTP; each closes its own session."""
        settings = self.settings.model_copy(update={"transport": "http"})
        clients = []
        for session_id in SessionsForked.model_validate(payload).session_ids:
            client = type(self)(settings)
            client._session_id = session_id
            client._opened_at(self._base_url or self.settings.urls[0])
            clients.append(client)
        return clients

    def _opened_at(self, base_url: str) -> None:
        """A session was opened at `base_url`: requests on it go there."""
        self._base_url = self._http.base_url = base_url
        self._replicas.opened(base_url)
        self._lost = False

    def _ended(self) -> None:
        """The session ended (closed or lost): its base URL has one session fewer."""
        if self._opened and self._base_url is not None:
            self._replicas.closed(self._base_url)
        self._ws = self._session_id = None

    def _check_not_lost(self, request: _Request) -> None:
        """After a lost session only a reset goes on (it opens a new session)."""
        if self._lost and request.kind != "reset":
            raise SessionLostError("this client's session was lost; reset() opens a new one")

    def _loss(self, error: Exception) -> SessionLostError | None:
        """`error` of a request on the open session as a `SessionLostError` when it means the session
        is gone (None when it does not); the session is then forgotten."""
        if isinstance(error, TimeoutError):  # an OSError, yet only a slow answer
            return None
        if isinstance(error, SessionLostError):
            lost = error
        elif isinstance(error, ClientError) and error.code == ApiErrorCode.SESSION_NOT_FOUND.value:
            lost = SessionLostError(f"the service at {self._base_url} no longer knows this session (restarted?): {error}", error.status)
        elif isinstance(error, _LOST_CONNECTION_ERRORS):
            lost = SessionLostError(f"the connection to {self._base_url} broke mid-session: {error!r}")
            if self._base_url is not None:
                self._replicas.refused(self._base_url)
        else:
            return None
        self._ended()
        self._lost = True
        return lost

    def _open_failure(self, base_url: str, error: Exception) -> ClientError | Exception:
        """What a failed try to open a session at `base_url` amounts to; `base_url` is then passed over
        for a while. Raises what no other base URL would change (a refused token, a bad request)."""
        refusal = _handshake_refusal(error) or error
        if isinstance(refusal, ClientError) and (isinstance(refusal, AuthError) or refusal.status not in _REFUSING_STATUSES):
            raise refusal from error
        self._replicas.refused(base_url)
        return refusal

    def _wait_after_round(self, failures: list[Exception], attempt: int) -> float:
        """Seconds to wait after round `attempt` (from 0) of trying every base URL failed with
        `failures`; raises instead when waiting cannot help: every URL is full, or the last round."""
        full = [f for f in failures if isinstance(f, CapacityError)]
        if full and (len(full) == len(failures) or attempt + 1 == self.settings.connect_attempts):
            raise full[-1]
        if attempt + 1 == self.settings.connect_attempts:
            raise ClientError("unreachable", f"{', '.join(self.settings.urls)}: {failures[-1]}") from failures[-1]
        return self.settings.backoff_s * 2**attempt

    def _tools_urls(self) -> list[str]:
        """Where to ask for the tool list: the session's base URL, else every one in choice order."""
        return [self._base_url] if self._base_url is not None and self._opened else self._replicas.candidates()


# ------------------------------------------------------------------ the shells


class CodingEnvClient(_SessionCore):
    """One session of the service (sync). Use as a context manager, or call `close()`."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        super().__init__(settings)
        self._http = httpx.Client(**self._http_options())
        self._ws_stack = contextlib.ExitStack()

    def __enter__(self) -> CodingEnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_tools(self) -> list[dict[str, Any]]:
        """The service's tools as OpenAI function schemas (needs no session; any replica answers)."""
        return self._from_any_replica(lambda url: _function_schemas(_http_payload(self._http.post(url + "/mcp", json=_LIST_TOOLS))))

    def task_ids(self, suite: str | None = None, split: str | None = None) -> list[str]:
        """Every task id the service serves (one suite's, one split's: `train` or `held_out`, if given), in its
        order: `GET /tasks` page by page (needs no session; any replica answers: all serve the same suites)."""
        filters = {name: value for name, value in (("suite", suite), ("split", split)) if value is not None}

        def pages(url: str) -> list[str]:
            ids: list[str] = []
            while True:
                params = {"offset": len(ids), "limit": _TASK_PAGE, **filters}
                page = TaskPage.model_validate(_http_payload(self._http.get(url + "/tasks", params=params)))
                ids.extend(page.task_ids)
                if not page.task_ids or len(ids) >= page.total:
                    return ids

        return self._from_any_replica(pages)

    def task_reference(self, task_id: str) -> TaskReference:
        """The task's reference solution as a diff (`GET /references/{task_id}`, privileged; decision 129):
        for the teacher only, never for the policy's context. Raises `ClientError` `forbidden` without
        `privileged_token`, `no_reference` for a task that has none."""
        headers = {"X-Privileged-Token": self.settings.privileged_token} if self.settings.privileged_token else {}
        return self._from_any_replica(
            lambda url: TaskReference.model_validate(_http_payload(self._http.get(f"{url}/references/{task_id}", headers=headers)))
        )

    def _from_any_replica(self, ask: Callable[[str], _Answer]) -> _Answer:
        """`ask(base_url)` of the first replica that can be reached, for a request that needs no session."""
        for base_url in self._tools_urls():
            try:
                return ask(base_url.rstrip("/"))
            except _CONNECT_ERRORS as error:
                last = error
        raise ClientError("unreachable", f"{', '.join(self.settings.urls)}: {last}") from last

    def reset(self, task_id: str | None = None, *, seed: int | None = None, task: dict[str, Any] | None = None) -> ResetInfo:
        """Start an episode on a registered task (`task_id`), an inline spec (`task`), or a seeded pick."""
        return _reset_info(self._send(self._reset_request(task_id, seed, task)))

    def step(self, tool_name: str, arguments: dict[str, Any] | str | None = None) -> StepResult:
        """Call one tool; `arguments` may be the model's raw JSON text."""
        return _step_result(self._send(self._step_request(tool_name, arguments)))

    def step_message(self, content: str) -> StepResult:
        """Send the model's whole assistant text: the service parses every tool call in it (any
        model family) and runs them in order; `observation.calls` has one result per call."""
        return _step_result(self._send(self._message_request(content)))

    def fork(self, n: int) -> list[CodingEnvClient]:
        """`n` new sessions continuing this episode from where it stands (workspace, steps so far,
        task, hint setting), each in a client of its own: step and close each independently."""
        return self._bound_to(self._send(self._fork_request(n)))

    def close(self) -> None:
        """End the session (frees its sandbox); safe to call twice."""
        try:
            self._end_session()
        finally:
            self._http.close()

    def _end_session(self) -> None:
        try:
            if self._ws is not None:
                self._ws_stack.close()
            elif self._session_id is not None:
                self._http.delete(f"/sessions/{self._session_id}")
        except (*_CONNECT_ERRORS, websockets.exceptions.ConnectionClosed):
            pass  # the service is gone; its idle timeout frees the sandbox
        finally:
            self._ended()

    def _send(self, request: _Request) -> dict[str, Any]:
        self._check_not_lost(request)
        if not self._opened:
            self._open()
        try:
            if self._ws is not None:
                self._ws.send(request.ws_frame())
                return _ws_payload(self._ws.recv(timeout=self.settings.timeout_s))
            return _http_payload(self._http.post(request.http_path(self._session_id), json=request.http_body()))
        except Exception as error:
            if (lost := self._loss(error)) is None:
                raise
            with contextlib.suppress(Exception):
                self._ws_stack.close()  # a broken WebSocket's remains
            raise lost from error

    def _open(self) -> None:
        for attempt in range(self.settings.connect_attempts):
            failures: list[Exception] = []
            for base_url in self._replicas.candidates():
                try:
                    if self.settings.transport == "ws":
                        self._ws = self._ws_stack.enter_context(ws_connect(**self._ws_options(base_url)))
                    else:
                        self._session_id = _http_payload(self._http.post(base_url.rstrip("/") + "/sessions"))["session_id"]
                except (*_CONNECT_ERRORS, ClientError) as error:
                    failures.append(self._open_failure(base_url, error))
                    continue
                self._opened_at(base_url)
                return
            time.sleep(self._wait_after_round(failures, attempt))  # backoff before the next round


class AsyncCodingEnvClient(_SessionCore):
    """One session of the service (asyncio). Use with `async with`, or await `close()`."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        super().__init__(settings)
        self._http = httpx.AsyncClient(**self._http_options())
        self._ws_stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> AsyncCodingEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def list_tools(self) -> list[dict[str, Any]]:
        """The service's tools as OpenAI function schemas (needs no session; any replica answers)."""
        for base_url in self._tools_urls():
            try:
                return _function_schemas(_http_payload(await self._http.post(base_url.rstrip("/") + "/mcp", json=_LIST_TOOLS)))
            except _CONNECT_ERRORS as error:
                last = error
        raise ClientError("unreachable", f"{', '.join(self.settings.urls)}: {last}") from last

    async def reset(self, task_id: str | None = None, *, seed: int | None = None, task: dict[str, Any] | None = None) -> ResetInfo:
        """Start an episode on a registered task (`task_id`), an inline spec (`task`), or a seeded pick."""
        return _reset_info(await self._send(self._reset_request(task_id, seed, task)))

    async def step(self, tool_name: str, arguments: dict[str, Any] | str | None = None) -> StepResult:
        """Call one tool; `arguments` may be the model's raw JSON text."""
        return _step_result(await self._send(self._step_request(tool_name, arguments)))

    async def step_message(self, content: str) -> StepResult:
        """Send the model's whole assistant text: the service parses every tool call in it (any
        model family) and runs them in order; `observation.calls` has one result per call."""
        return _step_result(await self._send(self._message_request(content)))

    async def fork(self, n: int) -> list[AsyncCodingEnvClient]:
        """`n` new sessions continuing this episode from where it stands (workspace, steps so far,
        task, hint setting), each in a client of its own: step and close each independently."""
        return self._bound_to(await self._send(self._fork_request(n)))

    async def close(self) -> None:
        """End the session (frees its sandbox); safe to call twice."""
        try:
            await self._end_session()
        finally:
            await self._http.aclose()

    async def _end_session(self) -> None:
        try:
            if self._ws is not None:
                await self._ws_stack.aclose()
            elif self._session_id is not None:
                await self._http.delete(f"/sessions/{self._session_id}")
        except (*_CONNECT_ERRORS, websockets.exceptions.ConnectionClosed):
            pass  # the service is gone; its idle timeout frees the sandbox
        finally:
            self._ended()

    async def _send(self, request: _Request) -> dict[str, Any]:
        self._check_not_lost(request)
        if not self._opened:
            await self._open()
        try:
            if self._ws is not None:
                await self._ws.send(request.ws_frame())
                return _ws_payload(await asyncio.wait_for(self._ws.recv(), self.settings.timeout_s))
            return _http_payload(await self._http.post(request.http_path(self._session_id), json=request.http_body()))
        except Exception as error:
            if (lost := self._loss(error)) is None:
                raise
            with contextlib.suppress(Exception):
                await self._ws_stack.aclose()  # a broken WebSocket's remains
            raise lost from error

    async def _open(self) -> None:
        for attempt in range(self.settings.connect_attempts):
            failures: list[Exception] = []
            for base_url in self._replicas.candidates():
                try:
                    if self.settings.transport == "ws":
                        self._ws = await self._ws_stack.enter_async_context(ws_connect_async(**self._ws_options(base_url)))
                    else:
                        self._session_id = _http_payload(await self._http.post(base_url.rstrip("/") + "/sessions"))["session_id"]
                except (*_CONNECT_ERRORS, ClientError) as error:
                    failures.append(self._open_failure(base_url, error))
                    continue
                self._opened_at(base_url)
                return
            await asyncio.sleep(self._wait_after_round(failures, attempt))  # backoff before the next round
