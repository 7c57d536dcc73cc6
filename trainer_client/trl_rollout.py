"""How TRL 1.16's `GRPOTrainer` runs and renders one tool round with `environment_factory`, for code
that must produce the same conversations outside the trainer (the warm-start demos, the eval).

Mirrors `GRPOTrainer.__init__` (which environment methods become tools), `_tool_call_loop` (how a
call is dispatched and its result turned into a `tool` message) and `_get_tool_suffix_ids` (the
tokens between a finished assistant turn and the next one). `tests/trainer/test_demos.py` checks
these against a real `GRPOTrainer`, so a TRL upgrade that changes them fails there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_NOT_TOOLS = ("reset", "get_reward")


def environment_methods(environment: Any) -> list[Callable[..., Any]]:
    """The environment's public methods TRL offers as tools, in TRL's order (sorted by name)."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]


def dispatch(tools: dict[str, Callable[..., Any]], call: dict[str, Any]) -> tuple[str, Any, bool]:
    """Run one parsed tool call as TRL does: `(name, result, failed)`; a failure's result is `{"error": ...}`."""
    if call.get("type") != "function":
        return call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"}, True
    function = call["function"]
    name = function["name"]
    try:
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        return name, tools[name](**function["arguments"]), False
    except Exception as error:  # TRL answers any exception of a tool with its text
        return name, {"error": str(error)}, True


def tool_message(name: str, result: Any) -> dict[str, Any]:
    """The `tool` message TRL appends for one result."""
    return {"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}


def tool_suffix_ids(tokenizer: Any, tool_messages: list[dict[str, Any]], chat_template: str | None = None) -> list[int]:
    """Token ids TRL appends after an assistant turn (ending in EOS): the tool messages and the next
    assistant header. Cut out of two renders of a dummy conversation, as TRL does."""
    dummy = [
        {"role": "user", "content": "dummy"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}],
        },
    ]
    render = dict(tokenize=True, chat_template=chat_template, return_dict=False)
    prefix = list(tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **render))
    full = list(tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, **render))
    eos = [i for i, token in enumerate(prefix) if token == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template does not render the dummy turn as a prefix of the turn with its tool result")
    return full[len(prefix) :]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any], *, add_generation_prompt: bool) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
    )


def assistant_turn_ids(tokenizer: Any, context: list[dict[str, Any]], turn: dict[str, Any], tools: list[Any]) -> list[int]:
    """The tokens a model emits for `turn` after `context`: what the template puts after the assistant
    header, up to and including EOS (generation stops there, so nothing after it is the model's)."""
    before = _render(tokenizer, context, tools, add_generation_prompt=True)
    after = _render(tokenizer, [*context, turn], tools, add_generation_prompt=False)
    if after[: len(before)] != before:
        raise ValueError("the chat template does not render the context as a prefix of the context with the turn")
    ids = after[len(before) :]
    eos = [i for i, token in enumerate(ids) if token == tokenizer.eos_token_id]
    return ids[: eos[-1] + 1] if eos else ids


def rollout_token_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any]) -> tuple[list[int], list[int]]:
    """A finished conversation as TRL's tool loop lays it out: `(ids, model_mask)`, where the ids are
    the prompt (with the generation prompt), then each assistant turn followed by the tool suffix,
    and `model_mask` is 1 exactly on the tokens the model generated (TRL's `tool_mask` within the
    completion). The first message(s) up to the first assistant turn are the prompt."""
    first = next(i for i, message in enumerate(messages) if message["role"] == "assistant")
    ids = _render(tokenizer, messages[:first], tools, add_generation_prompt=True)
    mask = [0] * len(ids)
    index = first
    while index < len(messages):
        turn = assistant_turn_ids(tokenizer, messages[:index], messages[index], tools)
        ids += turn
        mask += [1] * len(turn)
        index += 1
        results = []
        while index < len(messages) and messages[index]["role"] == "tool":
            results.append(messages[index])
            index += 1
        if results:
            suffix = tool_suffix_ids(tokenizer, results)
            ids += suffix
            mask += [0] * len(suffix)
    return ids, mask
