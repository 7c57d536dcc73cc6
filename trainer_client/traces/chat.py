"""One teacher request over the OpenAI chat completions API, with retries.

Retried: 429, 5xx, timeouts and connection errors, after a jittered exponential wait (or
the server's `Retry-After`). Not retried: other 4xx (the request is wrong) and a 200 whose
body is not a chat completion (a retry would likely pay again for the same garbage).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from trainer_client.traces.config import ReplayConfig, TeacherConfig
from trainer_client.traces.messages import pair_tool_results


class TeacherError(Exception):
    """A teacher gave no usable answer. `kind` names why, for the run report."""

    def __init__(self, kind: str, detail: str, maybe_billed: bool) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.maybe_billed = maybe_billed
        """True when the provider may have charged for the request (it was answered, or
        timed out after being sent); the budget then counts its reserved worst case."""


@dataclass(frozen=True)
class TeacherReply:
    """A teacher's answer and what it cost."""

    message: dict[str, Any]
    """The assistant message (`content`, `tool_calls`)."""
    prompt_tokens: int | None
    """None when the server reported no usage (the budget then charges the reserved worst case)."""
    completion_tokens: int | None
    latency_s: float
    """Wall time of the successful request."""
    retries: int


def request_body(teacher: TeacherConfig, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completions request for one state; also what the reply cache is keyed on."""
    body: dict[str, Any] = {
        "model": teacher.model,
        "messages": pair_tool_results(messages),
        "max_tokens": teacher.max_tokens,
        "temperature": teacher.temperature,
    }
    if tools:
        body["tools"] = tools
    return body


async def ask_teacher(
    http: httpx.AsyncClient, teacher: TeacherConfig, body: dict[str, Any], config: ReplayConfig
) -> TeacherReply:
    """POST `body` to the teacher until it answers, a non-retryable error, or retries run out."""
    headers = {}
    key = teacher.api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = teacher.base_url.rstrip("/") + "/chat/completions"
    attempt = 0
    while True:
        started = time.monotonic()
        retry_after: float | None = None
        try:
            response = await http.post(url, json=body, headers=headers, timeout=config.timeout_s)
        except httpx.TimeoutException as error:
            failure = TeacherError("timeout", str(error) or type(error).__name__, maybe_billed=True)
        except httpx.TransportError as error:
            failure = TeacherError("connection", str(error) or type(error).__name__, maybe_billed=False)
        else:
            if response.status_code == 200:
                return _parse_reply(response, time.monotonic() - started, attempt)
            failure = TeacherError(f"http_{response.status_code}", response.text[:200], maybe_billed=False)
            if response.status_code != 429 and response.status_code < 500:
                raise failure
            retry_after = _retry_after(response)
        if attempt == config.max_retries:
            raise failure
        ceiling = min(config.backoff_max_s, config.backoff_s * 2**attempt)
        wait = retry_after if retry_after is not None else random.uniform(0, ceiling)
        await asyncio.sleep(min(wait, config.backoff_max_s))
        attempt += 1


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _parse_reply(response: httpx.Response, latency_s: float, retries: int) -> TeacherReply:
    try:
        document = response.json()
        message = document["choices"][0]["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
        usage = document.get("usage") or {}
        prompt_tokens = _optional_int(usage.get("prompt_tokens"))
        completion_tokens = _optional_int(usage.get("completion_tokens"))
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise TeacherError("malformed_response", f"{type(error).__name__}: {error}", maybe_billed=True) from error
    return TeacherReply(
        message={key: message[key] for key in ("role", "content", "tool_calls") if message.get(key) is not None},
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency_s,
        retries=retries,
    )
