"""OpenHands trajectories: the event stream its controller records (`event_to_trajectory`).

Events are actions (`{"action", "source", "args", "tool_call_metadata"?}`) or observations
(`{"observation", "cause", "content", "extras", "tool_call_metadata"?}`). In function-calling
mode an agent action carries `tool_call_metadata` with the LLM response that produced it;
one response with several tool calls yields several actions sharing that response, which
are one turn here. Accepted files: a `.json` list of events (the trajectory export), a
`.json` object with `history`, or `.jsonl` evaluation rows each with `history`.
"""

from __future__ import annotations

import json
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
    tool_call,
    tool_message,
    with_system_prompt,
    without_reasoning,
)

NON_DECISION_ACTIONS = frozenset({"change_agent_state", "recall", "condensation", "null"})
"""Agent-side actions the controller emits itself, not the LLM."""


class OpenHandsIngester(TraceIngester):
    """One state per LLM response of the agent."""

    format = "openhands"
    file_suffixes = (".json", ".jsonl")

    def _states_in_file(self, file: Path) -> Iterator[TraceState]:
        if file.suffix == ".json":
            self.counts.records += 1
            try:
                document = json.loads(file.read_text(encoding="utf-8", errors="replace"))
            except json.JSONDecodeError as error:
                self.skip(f"{file}: {error}")
                return
            rows = [document if isinstance(document, dict) else {"history": document}]
        else:
            rows = list(self._json_lines(file))
        for number, row in enumerate(rows):
            history = row.get("history", row.get("trajectory"))
            if not isinstance(history, list):
                self.skip(f"{file}: row {number} has no event list")
                continue
            trace_id = str(row.get("instance_id") or (file.stem if len(rows) == 1 else f"{file.stem}:{number}"))
            llm_config = (row.get("metadata") or {}).get("llm_config") or {}
            yield from self._trace_states(history, trace_id, llm_config.get("model"), file)

    def _trace_states(
        self, events: list[Any], trace_id: str, model: str | None, file: Path
    ) -> Iterator[TraceState]:
        messages: list[dict[str, Any]] = []
        states: list[TraceState] = []
        tools = ToolSchemaCollector()
        turn_id: str | None = None
        call_of_event: dict[Any, str] = {}  # action event id -> tool_call_id, for calls without metadata
        for event in events:
            self.counts.records += 1
            if not isinstance(event, dict):
                self.skip(f"{file}: event is not an object")
                continue
            metadata = event.get("tool_call_metadata") or {}
            if "observation" in event:
                call_id = metadata.get("tool_call_id") or call_of_event.get(event.get("cause"))
                if call_id:
                    messages.append(tool_message(str(call_id), flatten_text(event.get("content"))))
                else:
                    self.ignore(f"observation:{event['observation']}")
                continue
            if "action" not in event:
                self.unknown(str(event.get("kind") or event.get("type") or "untyped"))
                continue
            action, source, args = event["action"], event.get("source"), event.get("args") or {}
            if action == "system":
                messages.append({"role": "system", "content": flatten_text(args.get("content"))})
            elif action == "message" and source == "user":
                messages.append({"role": "user", "content": flatten_text(args.get("content"))})
            elif source != "agent" or action in NON_DECISION_ACTIONS:
                self.ignore(f"action:{action}")
            else:
                response = metadata.get("model_response") or {}
                this_turn = str(response.get("id") or metadata.get("tool_call_id") or f"event-{event.get('id')}")
                if this_turn == turn_id:
                    continue  # another tool call of the response already taken as a turn
                turn_id = this_turn
                turn = _assistant_turn(event, response, metadata)
                if turn is None:
                    self.skip(f"{file}: agent action {action!r} without usable content")
                    continue
                if not metadata and turn.get("tool_calls"):
                    call_of_event[event.get("id")] = turn["tool_calls"][0]["id"]
                tools.observe_message(turn)
                states.append(
                    self._state(
                        trace_id,
                        this_turn,
                        with_system_prompt(messages),
                        turn,
                        model or response.get("model"),
                        {"trace_id": trace_id, "file": str(file), "event_id": event.get("id")},
                    )
                )
                messages.append(without_reasoning(turn))
        schemas = tools.schemas()
        for state in states:
            state.meta["tools"] = schemas
            yield state


def _assistant_turn(
    event: dict[str, Any], response: dict[str, Any], metadata: dict[str, Any]
) -> dict[str, Any] | None:
    """The LLM output behind an agent action: the recorded response when there is one."""
    choices = response.get("choices") or []
    recorded = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if isinstance(recorded, dict):
        calls = [
            tool_call(str(call["id"]), call["function"]["name"], call["function"].get("arguments", "{}"))
            for call in recorded.get("tool_calls") or []
        ]
        return assistant_message(flatten_text(recorded.get("content")), calls, recorded.get(REASONING_KEY))
    args = dict(event.get("args") or {})
    thought = flatten_text(args.pop("thought", ""))
    if event["action"] == "message":
        text = flatten_text(args.get("content")) or thought
        return assistant_message(text) if text else None
    name = metadata.get("function_name") or event["action"]
    call_id = metadata.get("tool_call_id") or f"call_{event.get('id')}"
    return assistant_message(thought, [tool_call(str(call_id), str(name), args)])
