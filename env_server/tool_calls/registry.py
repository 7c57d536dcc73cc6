"""The registry of tool-call families: one parser function per native format, tried in precedence order."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

Params = Mapping[str, Sequence[str]]
"""Known tool names to their parameter names (may be empty)."""


@dataclass(frozen=True)
class ParsedCall:
    """One tool call recovered from text."""

    name: str
    arguments: dict[str, Any]


class ToolCallParseError(ValueError):
    """The text announces a tool call but none could be recovered from it."""


FamilyParser = Callable[[str, Params], list[ParsedCall]]


@dataclass(frozen=True)
class Family:
    """One native tool-call format."""

    name: str
    marker: Callable[[str], object]
    """Truthy for a message that claims to hold a call in this format; the family is tried only then."""
    precedence: int
    """Lower is tried first: formats framed by special tokens before the generic XML and JSON shapes
    that could appear inside their arguments."""
    parse: FamilyParser
    """All calls in the message, in order; [] when the marker is there but nothing usable follows."""


FAMILIES: dict[str, Family] = {}


def tool_call_family(name: str, marker: str | Callable[[str], object], precedence: int) -> Callable[[FamilyParser], FamilyParser]:
    """Register the decorated function as the parser of family `name`; `marker` is a regular
    expression searched for in the message, or a function of the message (where no regular
    expression finds the marker in linear time)."""

    def register(parse: FamilyParser) -> FamilyParser:
        if name in FAMILIES:
            raise ValueError(f"tool-call family {name!r} is registered twice")
        FAMILIES[name] = Family(name, re.compile(marker).search if isinstance(marker, str) else marker, precedence, parse)
        return parse

    return register
