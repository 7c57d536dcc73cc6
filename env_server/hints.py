"""Short corrective hints for failed tool calls, cheapest source first.

1. A template per error kind (always).
2. The raw error text, for the tool/runtime kinds where the message itself is the lesson.
3. An optional LLM judge (any OpenAI-compatible endpoint) that rewrites the hint with the task
   and the failing call in view; answers are cached on disk under a stable hash of the request.

Hints feed the SDPO teacher context; they reach the policy only when reset asked for `show_hints`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import httpx

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
    ErrorKind.SANDBOX_ERROR: "The sandbox failed; this is not your fault. The episode has to be restarted.",
}

RAW_TEXT_KINDS = frozenset({ErrorKind.TOOL_NOT_FOUND, ErrorKind.JSON_DECODE, ErrorKind.TYPE_ERROR, ErrorKind.RUNTIME_ERROR})
"""Kinds whose error message comes from the service itself and is short and exact."""

JUDGE_SYSTEM_PROMPT = (
    "You coach an autonomous coding agent. Given the task, the tool call it made and the error it got, "
    "write ONE short, concrete hint (at most two sentences) that would have avoided the error. "
    "Do not solve the task and do not quote the hidden tests."
)


def clamp(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


class HintGenerator:
    """Makes the hint for one failed call; see the module docstring for the layers."""

    def __init__(self, settings: HintSettings, tool_names: list[str]) -> None:
        self._settings = settings
        self._tool_names = ", ".join(tool_names)
        self._client = httpx.Client(timeout=settings.llm_timeout_s) if settings.llm_url else None

    def hint(
        self,
        kind: ErrorKind | None,
        *,
        output: str,
        call: dict[str, Any] | None,
        task_prompt: str,
        underlying: ErrorKind | None = None,
    ) -> str | None:
        """The hint for a step whose outcome was `kind` (None: no hint)."""
        if kind is None:
            return None
        hint = TEMPLATES[kind].format(tools=self._tool_names, underlying=(underlying or kind).value)
        if kind in RAW_TEXT_KINDS and output:
            hint += f" Error: {output}"
        if self._client is not None:
            hint = self._judge(kind, output, call, task_prompt, hint) or hint
        return clamp(hint, self._settings.max_chars)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _judge(self, kind: ErrorKind, output: str, call: dict[str, Any] | None, task_prompt: str, draft: str) -> str | None:
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
        request = {
            "model": self._settings.llm_model,
            "messages": [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}],
            "temperature": 0,
            "max_tokens": 160,
        }
        cache_file = self._cache_file(request)
        if cache_file is not None and cache_file.exists():
            return json.loads(cache_file.read_text())["hint"]
        headers = {}
        if self._settings.llm_api_key is not None:
            headers["Authorization"] = f"Bearer {self._settings.llm_api_key.get_secret_value()}"
        try:
            response = self._client.post(f"{self._settings.llm_url.rstrip('/')}/chat/completions", json=request, headers=headers)
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            log.warning("hint judge failed, using the template: %s", exc)
            return None
        if not isinstance(answer, str) or not answer.strip():
            return None
        if cache_file is not None:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps({"hint": answer}))
        return answer

    def _cache_file(self, request: dict[str, Any]) -> Path | None:
        if self._settings.cache_dir is None:
            return None
        key = hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        return self._settings.cache_dir / f"{key}.json"
