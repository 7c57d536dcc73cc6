"""Extract tool calls from a model's raw assistant message, in any family's native format.

Each family is one parser in `env_server.tool_calls` (see docs/tool_calls.md). Reasoning blocks
are removed first; then, unless a family is pinned, the families whose marker appears are
tried in precedence order and the first that yields calls wins: formats framed by special
tokens before generic XML, before generic JSON, because a generic shape can sit inside a
special format's arguments but not the other way round.

Parsing is linear and bounded (docs/decisions/037-bounded-tool-call-parsing.md): every family
reads a message in forward scans, and one budget per message (size, time, characters given to
the lenient readers) ends a pathological message with `ToolCallBudgetError`, a
`ToolCallParseError` the service answers as `json_decode`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from typing import Any

from env_server.tool_calls import arguments, registry
from env_server.tool_calls.arguments import load_json_object
from env_server.tool_calls.budget import ToolCallBudgetError, parse_budget
from env_server.tool_calls.reasoning import strip_reasoning
from env_server.tool_calls.registry import ParsedCall, ToolCallParseError

_BY_PRECEDENCE = tuple(sorted(registry.FAMILIES.values(), key=lambda f: f.precedence))

TOOL_CALL_FAMILIES: tuple[str, ...] = tuple(f.name for f in _BY_PRECEDENCE)
"""The registered families, in detection order."""

__all__ = [
    "TOOL_CALL_FAMILIES",
    "ParsedCall",
    "ToolCallBudgetError",
    "ToolCallParseError",
    "load_json_object",
    "parse_arguments",
    "parse_tool_calls",
]


def parse_tool_calls(
    text: str, params: Mapping[str, Sequence[str]] | None = None, family: str | None = None
) -> list[ParsedCall]:
    """All tool calls in `text`, in order; [] if it holds none.

    `params` maps known tool names to their parameter names; it enables the name-as-key
    nesting repair, the raw-text fallback for values JSON repair got wrong, and positional
    arguments in pythonic calls. `family` pins one format (others are then plain text);
    None detects it. Raises ValueError for an unknown family, ToolCallParseError when a
    call marker is present but nothing usable follows it, and its subclass ToolCallBudgetError
    when the message is over the parse budget (too long, or too slow to read).
    """
    if family is not None and family not in registry.FAMILIES:
        raise ValueError(f"unknown tool-call family {family!r}; known: {', '.join(TOOL_CALL_FAMILIES)}")
    params = params or {}
    with parse_budget(text):
        text = strip_reasoning(text)
        candidates = [registry.FAMILIES[family]] if family is not None else _BY_PRECEDENCE
        announced = False
        for candidate in candidates:
            if not candidate.marker(text):
                continue
            announced = True
            calls = candidate.parse(text, params)
            if calls:
                return calls
    if announced:
        raise ToolCallParseError(f"could not parse the tool call in: {text[:200]!r}")
    return []


def parse_arguments(text: str, params: Sequence[str] | None = None) -> dict[str, Any] | None:
    """A call's raw `arguments` text as a dict; None if nothing usable, or if reading it went
    over the parse budget. See `env_server.tool_calls.arguments.parse_arguments`."""
    try:
        with parse_budget(text):
            return arguments.parse_arguments(text, params)
    except ToolCallBudgetError:
        return None
