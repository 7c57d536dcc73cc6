"""OpenAI chat messages as every ingester and the replay build and read them.

One place decides how a tool call, a tool result and an assistant turn look, so that a
state ingested from Claude Code and one from OpenHands reach the teachers in the same shape
and their actions compare on equal terms.
"""

from __future__ import annotations

import json
import re
from typing import Any

from json_repair import repair_json

CODING_AGENT_SYSTEM_PROMPT = (
    "You are an autonomous coding agent working in a software repository. "
    "Use the available tools to inspect files, run commands and edit code until the task "
    "is solved. Call one or more tools, or answer in text when you are done."
)
"""Opens a state whose trace recorded no system prompt of its own (the real one is unknown)."""

REASONING_KEY = "reasoning_content"
"""Where an assistant message carries its thinking (the field vLLM and DeepSeek use)."""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace: equal values, equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as a value: dicts pass, JSON strings are parsed (repaired if need be).

    A string that is not even repairable JSON is returned stripped, so two identical broken
    argument strings still compare equal.
    """
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        repaired = repair_json(raw, return_objects=True)
        # json-repair answers '' for garbage: keep the text rather than invent an empty call.
        return repaired if isinstance(repaired, (dict, list)) else raw.strip()


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI `tool_calls` entry; `arguments` is stored as a JSON string, as the API does."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def assistant_message(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    reasoning: str | None = None,
) -> dict[str, Any]:
    """An assistant message; `content` is None when the turn is only tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message[REASONING_KEY] = reasoning
    return message


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    """The result of one tool call."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def with_system_prompt(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `history` that opens with a system prompt: its own, or the synthetic one."""
    if history and history[0].get("role") == "system":
        return list(history)
    return [{"role": "system", "content": CODING_AGENT_SYSTEM_PROMPT}, *history]


def without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """The message as a teacher may see it in history: thinking removed."""
    return {key: value for key, value in message.items() if key != REASONING_KEY}


MISSING_RESULT = "[no result recorded]"


def pair_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History every chat API accepts: each tool call answered, no tool message unasked.

    Traces break this when a run was interrupted (a call without result) or history starts
    mid-exchange (a result without call); APIs answer 400 to either. Missing results get a
    placeholder; orphan results become user messages.
    """
    repaired: list[dict[str, Any]] = []
    open_calls: list[str] = []

    def close_open_calls() -> None:
        repaired.extend(tool_message(call_id, MISSING_RESULT) for call_id in open_calls)
        open_calls.clear()

    for message in messages:
        if message.get("role") == "tool":
            if message.get("tool_call_id") in open_calls:
                open_calls.remove(message["tool_call_id"])
                repaired.append(message)
            else:
                repaired.append({"role": "user", "content": f"Tool result:\n{flatten_text(message.get('content'))}"})
            continue
        close_open_calls()
        repaired.append(message)
        open_calls.extend(call["id"] for call in message.get("tool_calls") or [])
    close_open_calls()
    return repaired


def flatten_text(content: Any) -> str:
    """Text of a message content that may be a string or a list of typed blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict) and block.get("type") == "image":
                parts.append("[image]")
        return "\n".join(parts)
    return str(content)


_XML_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*?)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([\w.-]+)>(.*?)</parameter>", re.DOTALL)


def split_xml_function_call(text: str) -> tuple[str, str, dict[str, str]] | None:
    """`(thought, tool name, arguments)` of text ending in an XML-style call, else None.

    The style SWE-agent's XML function-calling parser reads (and Qwen3-Coder emits)::

        thought <function=bash>
        <parameter=command>ls</parameter>
        </function>
    """
    match = _XML_FUNCTION.search(text)
    if match is None:
        return None
    arguments = {name: value.strip("\n") for name, value in _XML_PARAMETER.findall(match.group(2))}
    return text[: match.start()].strip(), match.group(1), arguments


_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}


class ToolSchemaCollector:
    """Function schemas for a trace that recorded calls but no tool definitions.

    Teachers need parameter names to answer in the student's vocabulary; the best evidence
    is the arguments the traced agent actually passed, so each tool's schema lists every
    argument seen with the JSON type of its first value.
    """

    def __init__(self) -> None:
        self._properties: dict[str, dict[str, dict[str, str]]] = {}

    def observe(self, name: str, arguments: Any) -> None:
        properties = self._properties.setdefault(name, {})
        if isinstance(arguments, dict):
            for key, value in arguments.items():
                properties.setdefault(key, {"type": _JSON_TYPES.get(type(value), "string")})

    def observe_message(self, message: dict[str, Any]) -> None:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            self.observe(function["name"], parse_arguments(function["arguments"]))

    def schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "parameters": {"type": "object", "properties": properties},
                },
            }
            for name, properties in sorted(self._properties.items())
        ]
