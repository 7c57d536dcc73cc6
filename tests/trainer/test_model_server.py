"""`coding-train serve-model` as OpenAI's own client sees it: tool calls the policy writes come back as
`tool_calls`, a conversation sent back in OpenAI's wire format reaches the chat template as the
template expects it, refusals are OpenAI errors, and the command serves `tiny-random` on a port.

The reply tests script the policy's tokens (a random model writes no tool call); the tokenizer, the
chat template, TRL's parser, the HTTP server and the OpenAI client are the real ones."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
import torch

from tests.support.model_server import serving
from tests.trainer.conftest import TOOLS, tool_call_text
from trainer_client.model_server import ChatModel, make_server

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 300


class ScriptedPolicy:
    """Stands where the transformers model stands: `generate` appends the next scripted reply to
    the prompt, and records each prompt it was given."""

    def __init__(self, tokenizer: Any, replies: list[str], context: int = 4096) -> None:
        self.replies = [tokenizer.encode(reply, add_special_tokens=False) for reply in replies]
        self.prompts: list[list[int]] = []
        self.config = SimpleNamespace(max_position_embeddings=context)

    def eval(self) -> ScriptedPolicy:
        return self

    def generate(self, input_ids: torch.Tensor, *, max_new_tokens: int, **_: Any) -> torch.Tensor:
        self.prompts.append(input_ids[0].tolist())
        reply = self.replies[min(len(self.prompts), len(self.replies)) - 1][:max_new_tokens]
        return torch.cat([input_ids, torch.tensor([reply])], dim=1)


@contextmanager
def client_of(chat: ChatModel) -> Iterator[openai.OpenAI]:
    """OpenAI's client of `chat`, served on a free port of 127.0.0.1 until the block ends."""
    with make_server(chat, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="unused", max_retries=0)
        finally:
            server.shutdown()
            thread.join()


def test_a_tool_call_comes_back_as_an_openai_tool_call_and_goes_back_to_the_template(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, [tool_call_text("ls -la"), "All done.<|im_end|>"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    with client_of(ChatModel("scripted", policy, tokenizer)) as client:
        first = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, temperature=0)
        choice = first.choices[0]
        [call] = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls"
        assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
        assert call.id.startswith("call_") and first.usage.completion_tokens == len(policy.replies[0])

        # Back as OpenAI sends it: arguments a JSON string, content null, the answer a tool message.
        messages += [choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "a.txt"}]
        second = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, temperature=0)
    assert second.choices[0].message.content == "All done." and second.choices[0].finish_reason == "stop"
    prompt = tokenizer.decode(policy.prompts[1])
    # The template wrote the call as the policy wrote it, not its arguments quoted as a string.
    assert '{"name": "bash", "arguments": {"command": "ls -la"}}' in prompt
    assert "<tool_response>\na.txt\n</tool_response>" in prompt


def test_a_reply_cut_at_max_tokens_is_text_with_finish_reason_length(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, [tool_call_text("cat a.txt")])
    with client_of(ChatModel("scripted", policy, tokenizer)) as client:
        reply = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "go"}], tools=TOOLS, max_tokens=3)
        assert [model.id for model in client.models.list().data] == ["scripted"]
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.tool_calls
    assert reply.usage.completion_tokens == 3


def test_what_it_cannot_answer_is_an_openai_error(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, ["unused"], context=64)
    messages = [{"role": "user", "content": "hi"}]
    with client_of(ChatModel("scripted", policy, tokenizer, default_max_tokens=16)) as client:
        with pytest.raises(openai.NotFoundError, match="model_not_found"):
            client.chat.completions.create(model="gpt-4o", messages=messages)
        with pytest.raises(openai.BadRequestError, match="context_length_exceeded"):
            client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
        with pytest.raises(openai.BadRequestError, match="unsupported"):
            client.chat.completions.create(model="scripted", messages=messages, n=2)
        with pytest.raises(openai.BadRequestError, match="invalid_request"):
            client.chat.completions.create(model="scripted", messages=[])
    assert policy.prompts == []


@pytest.fixture(scope="module")
def served_tiny_random() -> Iterator[str]:
    """`coding-train serve-model --model tiny-random --port 0` running; yields the URL it printed."""
    command = [str(BIN / "coding-train"), "serve-model", "--model", "tiny-random", "--port", "0", "--max-tokens", "8"]
    with serving(command, "tiny-random") as url:
        yield url


@pytest.mark.slow
def test_the_command_serves_tiny_random(served_tiny_random: str) -> None:
    client = openai.OpenAI(base_url=served_tiny_random, api_key="unused", max_retries=0, timeout=START_TIMEOUT_S)
    assert [model.id for model in client.models.list().data] == ["tiny-random"]
    reply = client.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, seed=0)
    assert reply.choices[0].message.role == "assistant"
    assert 1 <= reply.usage.completion_tokens <= 8  # the server's --max-tokens, as the request set none
