"""Short corrective hints for failed tool calls, cheapest source first.

1. A template per error kind (always).
2. The raw error text, for the tool/runtime kinds where the message itself is the lesson.
3. An optional LLM judge (any OpenAI-compatible endpoint), the last and paid layer: asked only
   for the kinds where layers 1-2 say little (`HintSettings.judge_kinds`), answered off the
   step's path (the step waits at most `judge_wait_s`; a later answer replaces the hint in the
   trajectory), cached on disk under a stable hash of the request.

Hints feed the SDPO teacher context; they reach the policy only when reset asked for `show_hints`.
Why the judge is asynchronous and bounded: docs/decisions/025-hint-judge-last-and-bounded.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from env_server.error_kinds import RAW_TEXT_KINDS
from env_server.models import ErrorKind
from env_server.settings import HintSettings

log = logging.getLogger(__name__)

TEMPLATES: dict[ErrorKind, str] = {
    ErrorKind.TOOL_NOT_FOUND: "That tool does not exist. Call one of: {tools}.",
    ErrorKind.JSON_DECODE: "The tool arguments were not valid JSON. Send one JSON object with double-quoted keys and escaped newlines and quotes in strings.",
    ErrorKind.TYPE_ERROR: "The arguments do not match the tool's schema. Check the required parameter names and their types.",
    ErrorKind.RUNTIME_ERROR: "The tool could not do what was asked. Read the message, adjust the arguments and retry.",
    ErrorKind.NONZERO_EXIT: "The command failed. Read the error output before running it again.",
    ErrorKind.COMMAND_NOT_FOUND: "That program is not installed in the sandbox, and there is no network. Use python3, the shell builtins or the file tools instead.",
    ErrorKind.PERMISSION_DENIED: "You may only write inside the workspace (and /tmp); the rest of the filesystem is read-only.",
    ErrorKind.FILE_NOT_FOUND: "That path does not exist. Use list_dir or search to find the right file; paths are relative to the workspace.",
    ErrorKind.SYNTAX_ERROR: "The Python code has a syntax error. Fix the reported line (indentation, brackets, quotes) before running tests.",
    ErrorKind.TIMEOUT: "The command ran out of time. Look for an infinite loop or a blocking read, or run something smaller.",
    ErrorKind.OOM: "The command ran out of memory. Process the data in smaller pieces instead of loading it all at once.",
    ErrorKind.TEST_FAILURE: "Some tests fail. Read the first failing assertion, fix the code it points to, then run the tests again.",
    ErrorKind.REPEATED_FAILURE: "The same error ({underlying}) three or more times in a row. Stop repeating the same approach: re-read the task and the last error, then try something different.",
    ErrorKind.SANDBOX_ERROR: "The sandbox could not carry out the call. Do not kill processes you did not start or exhaust memory or disk: a sandbox that dies ends the episode with reward 0.",
    ErrorKind.NO_TOOL_CALL: "Your reply called no tool. Every turn must call one of: {tools}; call submit when the work is done.",
    ErrorKind.TOO_MANY_CALLS: "Only the first calls of a message run. Make fewer tool calls per message, and send the ones that did not run in your next message.",
    ErrorKind.GRADING_ERROR: "Your workspace could not be graded (unreadable files, a folder where a file belongs, or too much data), so it scored 0. Keep the workspace readable and small.",
}

JUDGE_SYSTEM_PROMPT = (
    "You coach an autonomous coding agent. Given the task, the tool call it made and the error it got, "
    "write ONE short, concrete hint (at most two sentences) that would have avoided the error. "
    "Do not solve the task and do not quote the hidden tests."
)


def clamp(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


@dataclass
class Hint:
    """A step's hint: the text to send now, and the judge's answer if it is still on its way."""

    text: str | None
    later: Future[str | None] | None = None
    """Resolves to the judge's (clamped) hint, or None if it failed; the trajectory takes it."""


class HintCache:
    """The judge's answers on disk, one JSON file per request hash.

    Written atomically (a temp file renamed into place), so a reader never sees half a file;
    read defensively, so a damaged entry (truncated, not JSON, wrong shape) is a miss."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def path(self, request: dict[str, Any]) -> Path:
        key = hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        return self._directory / f"{key}.json"

    def get(self, request: dict[str, Any]) -> str | None:
        try:
            hint = json.loads(self.path(request).read_text(encoding="utf-8"))["hint"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return hint if isinstance(hint, str) and hint.strip() else None

    def put(self, request: dict[str, Any], hint: str) -> None:
        target = self.path(request)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"hint": hint}, out)
            os.replace(temporary, target)
        except OSError as exc:
            log.warning("hint cache write failed: %s", exc)


class HintGenerator:
    """Makes the hint for one failed call; see the module docstring for the layers."""

    def __init__(self, settings: HintSettings, tool_names: list[str]) -> None:
        self._settings = settings
        self._tool_names = ", ".join(tool_names)
        self._client = httpx.Client(timeout=settings.llm_timeout_s) if settings.llm_url else None
        self._cache = HintCache(settings.cache_dir) if settings.cache_dir else None
        self._judges = ThreadPoolExecutor(settings.judge_concurrency, thread_name_prefix="hint-judge") if self._client else None
        self._in_flight = 0
        self._lock = threading.Lock()

    def hint(
        self,
        kind: ErrorKind | None,
        *,
        output: str,
        call: dict[str, Any] | None,
        task_prompt: str,
        underlying: ErrorKind | None = None,
        tools: Sequence[str] | None = None,
    ) -> Hint:
        """The hint for a step whose outcome was `kind` (text None: no hint); `tools`: the episode's
        tools, when it has fewer than every tool."""
        if kind is None:
            return Hint(None)
        tool_names = ", ".join(tools) if tools else self._tool_names
        draft = TEMPLATES[kind].format(tools=tool_names, underlying=(underlying or kind).value)
        if kind in RAW_TEXT_KINDS and output:
            draft += f" Error: {output}"
        draft = clamp(draft, self._settings.max_chars)
        if self._judges is None or kind not in self._settings.judge_kinds:
            return Hint(draft)
        request = self._judge_request(kind, output, call, task_prompt, draft)
        cached = self._cache.get(request) if self._cache else None
        if cached is not None:
            return Hint(clamp(cached, self._settings.max_chars))
        with self._lock:
            if self._in_flight >= self._settings.judge_max_pending:
                return Hint(draft)  # the judge is behind: this step keeps its template hint
            self._in_flight += 1
        later = self._judges.submit(self._ask_judge, request)
        try:
            answer = later.result(timeout=self._settings.judge_wait_s)
        except FutureTimeout:
            return Hint(draft, later)
        return Hint(answer or draft)

    def close(self) -> None:
        if self._judges is not None:
            self._judges.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    @property
    def settle_timeout_s(self) -> float:
        """Longest a judge answer can still take once asked for (its HTTP timeout)."""
        return self._settings.llm_timeout_s

    def _judge_request(self, kind: ErrorKind, output: str, call: dict[str, Any] | None, task_prompt: str, draft: str) -> dict[str, Any]:
        user = json.dumps(
            {
                "task": task_prompt[-2000:],
                "tool_call": call,
                "error_kind": kind.value,
                "error_output": output[-2000:],
                "draft_hint": draft,
            },
            sort_keys=True,
            ensure_ascii=False,
        )
        return {
            "model": self._settings.llm_model,
            "messages": [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}],
            "temperature": 0,
            "max_tokens": 160,
        }

    def _ask_judge(self, request: dict[str, Any]) -> str | None:
        """One judge request (on the judge's thread pool): its clamped answer, or None."""
        try:
            headers = {}
            if self._settings.llm_api_key is not None:
                headers["Authorization"] = f"Bearer {self._settings.llm_api_key.get_secret_value()}"
            try:
                response = self._client.post(f"{self._settings.llm_url.rstrip('/')}/chat/completions", json=request, headers=headers)
                response.raise_for_status()
                answer = response.json()["choices"][0]["message"]["content"]
            except (httpx.HTTPError, RuntimeError, ValueError, KeyError, IndexError, TypeError) as exc:
                # RuntimeError: the client was closed under a request at shutdown.
                log.warning("hint judge failed, keeping the template: %s", exc)
                return None
            if not isinstance(answer, str) or not answer.strip():
                log.warning("hint judge gave no usable text, keeping the template")
                return None
            if self._cache is not None:
                self._cache.put(request, answer)
            return clamp(answer, self._settings.max_chars)
        finally:
            with self._lock:
                self._in_flight -= 1
