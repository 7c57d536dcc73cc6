"""`coding-train serve-model`: a policy the project loads (`load_policy`) behind the two routes of
OpenAI's API that agent frameworks call, `POST /v1/chat/completions` and `GET /v1/models`.

It is the model of the examples and of the tests that drive another framework against the service
(verifiers' `vf-eval`, docs/integrations.md): those frameworks speak to a model only over HTTP, and
`tiny-random` / `smollm2-135m-instruct` load from the installed packages, with no network and no GPU.
It is not an inference server for training or serious evaluation (use vLLM or SGLang there): it
answers one request at a time, one sample per request, without streaming.

A reply is parsed the way `coding-train eval` parses one (TRL's `add_response_schema` and
`parse_response`, with the prompt as prefix and the request's tools as schemas), so a tool call
the policy writes in its template's format comes back as an OpenAI `tool_calls` entry; a reply
that does not parse comes back as text, which the service's own parser reads again.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainer_client.policy import load_policy

# torch and TRL are imported where a reply is generated, as in `policy`: reading this module costs nothing.


class ChatCompletionRequest(BaseModel):
    """The fields of an OpenAI chat-completions request this server honours; other fields (tool
    choice, penalties, logprobs ...) are accepted and ignored, as a client may always send them."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = Field(default=None, ge=0)
    """0: greedy; unset: OpenAI's default, 1."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """OpenAI's newer name of `max_tokens`; `max_tokens` wins when both are sent."""
    seed: int | None = None
    n: int = 1
    stream: bool = False


class RequestRefused(ValueError):
    """A request this server cannot answer as asked; the client gets it as an OpenAI error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ChatModel:
    """A loaded policy and tokenizer that answer chat-completions requests, one at a time."""

    def __init__(self, name: str, model: Any, tokenizer: Any, *, default_max_tokens: int = 256) -> None:
        from trl.chat_template_utils import add_response_schema

        self.name = name
        self._model = model.eval()
        self._tokenizer = add_response_schema(tokenizer)
        self._default_max_tokens = default_max_tokens
        self._context = int(getattr(model.config, "max_position_embeddings", 0)) or None
        # One generation at a time: a CPU model gains nothing from overlapping them, and sampling
        # under a request's seed must not interleave with another request's draws.
        self._lock = threading.Lock()

    def complete(self, request: ChatCompletionRequest) -> dict[str, Any]:
        """One assistant reply to `request`, as an OpenAI `chat.completion` object."""
        import torch
        from trl.chat_template_utils import parse_response

        if request.model != self.name:
            raise RequestRefused(404, "model_not_found", f"this server serves {self.name!r}, not {request.model!r}")
        if request.stream or request.n != 1:
            raise RequestRefused(400, "unsupported", "this server answers one sample per request, without streaming")
        prompt = list(
            self._tokenizer.apply_chat_template(
                template_messages(request.messages), tools=request.tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        max_tokens = request.max_tokens or request.max_completion_tokens or self._default_max_tokens
        if self._context is not None and len(prompt) + max_tokens > self._context:
            raise RequestRefused(
                400,
                "context_length_exceeded",
                f"{len(prompt)} prompt tokens + max_tokens {max_tokens} exceed the model's context of {self._context} tokens",
            )
        temperature = 1.0 if request.temperature is None else request.temperature
        sampling = {"do_sample": True, "temperature": temperature, "top_p": request.top_p or 1.0} if temperature > 0 else {"do_sample": False}
        with self._lock, torch.no_grad():
            if request.seed is not None:
                torch.manual_seed(request.seed)
            output = self._model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=max_tokens,
                pad_token_id=self._tokenizer.pad_token_id,
                eos_token_id=self._tokenizer.eos_token_id,
                **sampling,
            )
        turn = output[0, len(prompt) :].tolist()
        parsed = parse_response(self._tokenizer, turn, prefix=prompt, tools=request.tools)
        calls = [openai_tool_call(call) for call in parsed.get("tool_calls") or []]
        message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        ended = bool(turn) and turn[-1] == self._tokenizer.eos_token_id
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop" if ended else "length"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(turn), "total_tokens": len(prompt) + len(turn)},
        }


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wire messages as a Hugging Face chat template reads them: text parts joined into one
    string, no null content (templates concatenate it), and tool-call arguments as objects (they
    travel as JSON strings; a template writes them with `tojson`, which would quote them again)."""
    converted = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        elif content is None:
            message["content"] = ""
        if message.get("tool_calls"):
            message["tool_calls"] = [_call_with_object_arguments(call) for call in message["tool_calls"]]
        converted.append(message)
    return converted


def _call_with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            pass  # not JSON: shown to the model as the string it was
    return {**call, "function": function}


def openai_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A call as `parse_response` returns it (arguments an object) as an OpenAI `tool_calls` entry
    (arguments a JSON string, and an id the tool's answer refers to)."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


def make_server(chat: ChatModel, host: str = "127.0.0.1", port: int = 8001) -> ThreadingHTTPServer:
    """`chat` behind `POST /v1/chat/completions` and `GET /v1/models`, bound to `host:port` (port 0:
    any free one) and listening, not yet serving (`serve_forever`). The standard library's server:
    it needs nothing the `[train]` extra does not bring, and one request at a time is all it does."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if self.path.rstrip("/") != "/v1/models":
                return self._refuse(RequestRefused(404, "not_found", f"no route GET {self.path}"))
            model = {"id": chat.name, "object": "model", "created": 0, "owned_by": "coding-env"}
            self._send(200, {"object": "list", "data": [model]})

        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._refuse(RequestRefused(404, "not_found", f"no route POST {self.path}"))
            try:
                self._send(200, chat.complete(ChatCompletionRequest.model_validate_json(body)))
            except ValidationError as invalid:
                self._refuse(RequestRefused(400, "invalid_request", str(invalid)))
            except RequestRefused as refused:
                self._refuse(refused)

        def _refuse(self, refused: RequestRefused) -> None:
            self._send(refused.status, {"error": {"message": str(refused), "type": "invalid_request_error", "code": refused.code}})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
            pass  # a line per request would bury the one that says where it serves

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(policy: str, *, host: str = "127.0.0.1", port: int = 8001, max_tokens: int = 256) -> None:
    """Load `policy` (`tiny-random`, `smollm2-135m-instruct`, a hub id or a checkpoint directory) and
    serve it until interrupted. The port is bound after the model has loaded, and the line giving the
    base URL is printed once it listens: a caller may send requests as soon as it reads it (port 0:
    any free port, which that line names)."""
    model, tokenizer = load_policy(policy)
    with make_server(ChatModel(policy, model, tokenizer, default_max_tokens=max_tokens), host, port) as server:
        bound_host, bound_port = server.server_address[:2]
        print(f"serving {policy} at http://{bound_host}:{bound_port}/v1 (OpenAI chat completions)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
