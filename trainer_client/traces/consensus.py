"""When do two actions count as the same, and what do the teachers agree on.

A tool-calling action is the multiset of its calls, each a tool name plus canonical JSON
arguments (key order and whitespace never matter). A text action is its whitespace-collapsed
text, and two texts match when difflib's ratio reaches a threshold. Text that ends in an
XML-style call (`<function=...>`) is read as that call, so a teacher that answers in the
trace's own text format still compares with tool calls.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from trainer_client.traces.messages import canonical_json, flatten_text, parse_arguments, split_xml_function_call

ToolCallsKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ActionKey:
    """The comparable part of an assistant message: its calls, or else its text."""

    calls: ToolCallsKey
    text: str

    def matches(self, other: ActionKey, text_similarity: float) -> bool:
        if self.calls or other.calls:
            return self.calls == other.calls
        if self.text == other.text:
            return True
        return difflib.SequenceMatcher(None, self.text, other.text, autojunk=False).ratio() >= text_similarity


def action_key(message: dict[str, Any]) -> ActionKey:
    """Normalise an assistant message for comparison (thinking is never part of it)."""
    text = flatten_text(message.get("content"))
    calls = [
        (str(call["function"]["name"]), canonical_json(parse_arguments(call["function"].get("arguments", "{}"))))
        for call in message.get("tool_calls") or []
        if isinstance(call, dict) and isinstance(call.get("function"), dict)
    ]
    if not calls and (parsed := split_xml_function_call(text)):
        _, name, arguments = parsed
        calls = [(name, canonical_json(arguments))]
    return ActionKey(calls=tuple(sorted(calls)), text=" ".join(text.split()))


@dataclass(frozen=True)
class Consensus:
    """The action at least k teachers gave."""

    message: dict[str, Any]
    """The answer of the first (most preferred) teacher in the agreeing group."""
    teachers: list[str]
    """Names of the agreeing teachers, in configuration order."""
    agreement: float
    """Agreeing teachers over teachers queried (errors count as queried, not agreeing)."""


def find_consensus(
    answers: list[tuple[str, dict[str, Any]]], queried: int, min_agreement: int, text_similarity: float
) -> Consensus | None:
    """The k-of-N consensus of `(teacher, message)` answers, or None.

    Answers are grouped by matching a group's first answer. The largest group wins if it has
    at least `min_agreement` members and no other group is as large (a tie is no consensus).
    """
    groups: list[tuple[ActionKey, list[tuple[str, dict[str, Any]]]]] = []
    for name, message in answers:
        key = action_key(message)
        for representative, members in groups:
            if representative.matches(key, text_similarity):
                members.append((name, message))
                break
        else:
            groups.append((key, [(name, message)]))
    sizes = sorted((len(members) for _, members in groups), reverse=True)
    if not sizes or sizes[0] < min_agreement or (len(sizes) > 1 and sizes[1] == sizes[0]):
        return None
    members = next(members for _, members in groups if len(members) == sizes[0])
    return Consensus(
        message=members[0][1],
        teachers=[name for name, _ in members],
        agreement=len(members) / queried,
    )
