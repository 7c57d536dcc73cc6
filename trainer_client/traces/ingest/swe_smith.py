"""SWE-smith trajectories (SWE-agent runs), one row per JSONL line.

A row is `{messages, instance_id, resolved, model, traj_id, patch}` where `messages` is the
chat (a list, or that list serialised as a JSON string). The three published splits differ
in how an assistant message names its action:

- `tool`: OpenAI `tool_calls`, answered by `tool` messages;
- `xml`: the message ends in `<function=NAME><parameter=P>V</parameter></function>`;
- `ticks`: the message ends in a fenced block holding one shell command.

The text styles are turned into tool calls (`ticks` into `bash(command)`) and the user
message that reports the observation into the matching tool message, so every state
reaches the teachers as a tool-calling conversation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer_client.records import TraceState
from trainer_client.traces.ingest.base import TraceIngester
from trainer_client.traces.messages import (
    REASONING_KEY,
    ToolSchemaCollector,
    assistant_message,
    flatten_text,
    split_xml_function_call,
    tool_call,
    tool_message,
    with_system_prompt,
    without_reasoning,
)

_FENCED_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)


class SweSmithIngester(TraceIngester):
    """One state per assistant message."""

    format = "swe_smith"

    def _states_in_file(self, file: Path) -> Iterator[TraceState]:
        for number, row in enumerate(self._json_lines(file)):
            messages = row.get("messages")
            if isinstance(messages, str):
                try:
                    messages = json.loads(messages)
                except json.JSONDecodeError:
                    messages = None
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                self.skip(f"{file}: row {number} has no message list")
                continue
            trace_id = str(row.get("traj_id") or row.get("instance_id") or f"{file.stem}:{number}")
            yield from self._trace_states(messages, row, trace_id, file)

    def _trace_states(
        self, messages: list[dict[str, Any]], row: dict[str, Any], trace_id: str, file: Path
    ) -> Iterator[TraceState]:
        style = detect_style(messages)
        history: list[dict[str, Any]] = []
        states: list[TraceState] = []
        tools = ToolSchemaCollector()
        awaiting_observation: str | None = None  # call id a text-style observation answers
        for message in messages:
            role, content = message.get("role"), flatten_text(message.get("content"))
            if role == "system":
                history.append({"role": "system", "content": content})
            elif role == "tool":
                history.append(tool_message(str(message.get("tool_call_id")), content))
            elif role == "user" and awaiting_observation:
                history.append(tool_message(awaiting_observation, content))
                awaiting_observation = None
            elif role == "user":
                history.append({"role": "user", "content": content})
            elif role == "assistant":
                turn = _assistant_turn(message, content, style, call_id=f"call_{len(states)}")
                tools.observe_message(turn)
                states.append(
                    self._state(
                        trace_id,
                        len(states),
                        with_system_prompt(history),
                        turn,
                        row.get("model"),
                        {
                            "trace_id": trace_id,
                            "file": str(file),
                            "turn": len(states),
                            "style": style,
                            "instance_id": row.get("instance_id"),
                            "resolved": row.get("resolved"),
                        },
                    )
                )
                history.append(without_reasoning(turn))
                if style != "tool" and turn.get("tool_calls"):
                    awaiting_observation = turn["tool_calls"][0]["id"]
            else:
                self.unknown(f"role:{role}")
        schemas = tools.schemas()
        for state in states:
            state.meta["tools"] = schemas
            yield state


def detect_style(messages: list[dict[str, Any]]) -> str:
    """`tool`, `xml` or `ticks`: which of SWE-smith's action styles a trajectory uses."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    if any(m.get("tool_calls") for m in assistant):
        return "tool"
    if any("<function=" in flatten_text(m.get("content")) for m in assistant):
        return "xml"
    return "ticks"


def _assistant_turn(message: dict[str, Any], content: str, style: str, call_id: str) -> dict[str, Any]:
    reasoning = message.get(REASONING_KEY)
    if style == "tool":
        calls = [
            tool_call(str(call.get("id") or call_id), call["function"]["name"], call["function"].get("arguments", "{}"))
            for call in message.get("tool_calls") or []
        ]
        return assistant_message(content, calls, reasoning)
    if style == "xml":
        parsed = split_xml_function_call(content)
        if parsed:
            thought, name, arguments = parsed
            return assistant_message(thought, [tool_call(call_id, name, arguments)], reasoning)
    else:
        blocks = list(_FENCED_BLOCK.finditer(content))
        if blocks:
            last = blocks[-1]
            command = {"command": last.group(1).strip()}
            return assistant_message(content[: last.start()].strip(), [tool_call(call_id, "bash", command)], reasoning)
    return assistant_message(content, reasoning=reasoning)
