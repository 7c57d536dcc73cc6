"""A real HTTP server speaking the OpenAI chat completions API, for teacher-replay tests.

Each model name the test registers answers through a `Teacher`: a function from the request
body to an assistant message, plus scripted misbehaviour (statuses to return before the
answer, a body that is not JSON, or a request that hangs until the server closes). Every
request is recorded, so tests can assert what was asked and what was paid for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROMPT_TOKENS = 100
COMPLETION_TOKENS = 10


def tool_answer(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_t", "type": "function", "function": {"name": name, "arguments": text}}],
    }


def text_answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def case_of(body: dict[str, Any]) -> str:
    """The `case=NAME` marker tests put in a state's first user message."""
    for message in body["messages"]:
        if message["role"] == "user" and "case=" in (message.get("content") or ""):
            return message["content"].split("case=", 1)[1].split()[0]
    raise AssertionError("request without a case marker")


@dataclass
class Teacher:
    answer: Callable[[dict[str, Any]], dict[str, Any]]
    failures_before_answer: list[int] = field(default_factory=list)
    """HTTP statuses returned, in order, to the first attempts of each distinct request."""
    malformed: bool = False
    """Answer 200 with a body that is not JSON."""
    hang: bool = False
    """Never answer (until the server closes): exercises the client's timeout."""


@dataclass
class Request:
    model: str
    body: dict[str, Any]
    digest: str
    """Hash of the request body: equal for a retry or a repeat of the same question."""
    status: int | None = None
    """Status sent back; None when the connection was dropped unanswered."""


class StubOpenAI:
    """The server; `base_url` goes into a teacher config. Use as a context manager."""

    def __init__(self, teachers: dict[str, Teacher], block_at_request: int | None = None) -> None:
        self.teachers = teachers
        self.requests: list[Request] = []
        self.block_at_request = block_at_request
        """1-based number of a request held unanswered until `release()`; then dropped."""
        self.blocked = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._attempts: dict[str, int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def answered(self, model: str | None = None) -> list[Request]:
        """Requests answered 200 with a chat completion (the ones a provider bills)."""
        return [
            r for r in self.requests
            if r.status == 200 and (model is None or r.model == model) and not self.teachers[r.model].malformed
        ]

    def release(self) -> None:
        self._release.set()

    def __enter__(self) -> StubOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                body = json.loads(raw)
                request = Request(model=body["model"], body=body, digest=hashlib.sha256(raw).hexdigest())
                with stub._lock:
                    stub.requests.append(request)
                    number = len(stub.requests)
                    attempt = stub._attempts.get(request.digest, 0)
                    stub._attempts[request.digest] = attempt + 1
                teacher = stub.teachers[body["model"]]
                if number == stub.block_at_request:
                    stub.blocked.set()
                    stub._release.wait()
                    return  # dropped: the client was killed meanwhile
                if teacher.hang:
                    stub._release.wait()
                    return
                if attempt < len(teacher.failures_before_answer):
                    status = teacher.failures_before_answer[attempt]
                    self._send(status, json.dumps({"error": {"message": "scripted failure"}}).encode(), request)
                elif teacher.malformed:
                    self._send(200, b'{"choices": [{"message": ', request)
                else:
                    completion = {
                        "id": f"chatcmpl-{number}",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [{"index": 0, "message": teacher.answer(body), "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS},
                    }
                    self._send(200, json.dumps(completion).encode(), request)

            def _send(self, status: int, payload: bytes, request: Request) -> None:
                # Recorded before the client can read the answer: a client that counts the answer it got
                # must never see the stub count one fewer.
                request.status = status
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                if status == 429:
                    self.send_header("retry-after", "0")
                self.end_headers()
                self.wfile.write(payload)

        return Handler
