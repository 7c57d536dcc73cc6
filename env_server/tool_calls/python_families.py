"""Families that write calls as Python: Llama 3.2/4 pythonic lists and Gemma's `tool_code`."""

from __future__ import annotations

import re

from env_server.tool_calls.arguments import python_calls
from env_server.tool_calls.registry import Params, ParsedCall, tool_call_family
from env_server.tool_calls.scanning import MAX_CALLS_PER_MESSAGE, markers

# A list whose first item is a call with keyword arguments (or none), as the format prescribes;
# so a list comprehension like `[f(x) for x in y]` in prose is not taken for calls.
# Only the tag may be followed by line breaks: `\s*` at every line start would rescan a run of blank lines.
_PYTHONIC_LIST = re.compile(r"(?m)^[ \t]*(?:<\|python_(?:start|tag)\|>\s*)?(\[)\s*[A-Za-z_][\w.]*\(\s*(?:\)|[A-Za-z_]\w*\s*=[^=])")


@tool_call_family("llama3_pythonic", marker=_PYTHONIC_LIST.pattern, precedence=50)
def llama3_pythonic(text: str, params: Params) -> list[ParsedCall]:
    """Llama 3.2 and Llama 4: `[get_weather(city="Paris"), get_time(tz="UTC")]` (Llama 4 may wrap
    it in `<|python_start|>...<|python_end|>`)."""
    calls: list[ParsedCall] = []
    for m, stop in markers(_PYTHONIC_LIST, text):
        end = _closing_bracket(text, m.start(1), stop)
        found = python_calls(text[m.start(1) : end], params) if end is not None else None
        calls.extend(found or [])
    return calls


def _closing_bracket(text: str, start: int, stop: int) -> int | None:
    """Where the Python list opened at `start` ends, before `stop` (the next list's line), strings
    and comments skipped so a `]` in an argument does not end it; None if it is not closed by
    then, or nests deeper or holds more brackets than any call (Python refuses 200 levels)."""
    depth = 0
    for count, token in enumerate(_PYTHON_TOKEN.finditer(text, start, stop)):
        if count > _MAX_BRACKETS or depth > _MAX_DEPTH:
            return None
        kind = token.group()
        if kind in ("(", "[", "{"):
            depth += 1
        elif kind in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return token.end()
    return None


# What can hide a bracket, each in one step (strings, triple-quoted or not, and comments), or a
# bracket; unrolled loops, so every match is one linear pass.
_PYTHON_TOKEN = re.compile(
    r"'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
    r"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'"
    r'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
    r"|#[^\n]*|[()\[\]{}]"
)
_MAX_DEPTH = 200
_MAX_BRACKETS = 100_000


_TOOL_CODE = re.compile(r"```[ \t]*tool_code[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@tool_call_family("gemma", marker=r"```[ \t]*tool_code", precedence=10)
def gemma(text: str, params: Params) -> list[ParsedCall]:
    """Gemma: a ```tool_code block of Python calls, `print(...)`-wrapped or not, one per line."""
    return [c for m, _ in markers(_TOOL_CODE, text) for c in python_calls(m.group(1), params) or []][:MAX_CALLS_PER_MESSAGE]
