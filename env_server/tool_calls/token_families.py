"""Families framed by special tokens with the name outside the JSON: DeepSeek, Kimi K2, gpt-oss harmony."""

from __future__ import annotations

import re

from typing import Iterator

from env_server.tool_calls import budget
from env_server.tool_calls.arguments import first_json_object, parse_arguments
from env_server.tool_calls.registry import Params, ParsedCall, tool_call_family
from env_server.tool_calls.scanning import MAX_CALLS_PER_MESSAGE, markers, segment


def _arguments(text: str, start: int, end: re.Pattern[str], stop: int, name: str, params: Params) -> dict | None:
    """Arguments read exactly from `start` (so a closing token quoted in code does not cut them),
    else the text up to `end` (never past `stop`, the next call) repaired."""
    return first_json_object(text, start) or parse_arguments(segment(text, start, end, stop), params.get(name))


# DeepSeek writes fullwidth bars and U+2581 in its tokens; decoded text sometimes has ASCII bars
# (the U+2581 stays, which keeps these apart from Kimi's `<|tool_call_begin|>`).
_BAR, _SEP = "[｜|]", "▁"
_DEEPSEEK_CALL = re.compile(f"<{_BAR}tool{_SEP}call{_SEP}begin{_BAR}>")
_DEEPSEEK_SEP = re.compile(f"<{_BAR}tool{_SEP}sep{_BAR}>")
_DEEPSEEK_END = re.compile(f"<{_BAR}tool{_SEP}call{_SEP}end{_BAR}>|<{_BAR}tool{_SEP}calls{_SEP}end{_BAR}>|<{_BAR}end{_SEP}of{_SEP}sentence{_BAR}>")
_JSON_FENCE = re.compile(r"\s*```(?:json)?[ \t]*\n?")


@tool_call_family("deepseek", marker=_DEEPSEEK_CALL.pattern, precedence=10)
def deepseek(text: str, params: Params) -> list[ParsedCall]:
    """DeepSeek V3 and R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`;
    V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`; both inside
    `<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`."""
    calls = []
    for m, stop in markers(_DEEPSEEK_CALL, text):
        sep = _DEEPSEEK_SEP.search(text, m.end(), stop)
        if sep is None:
            continue
        head = text[m.end() : sep.start()].strip()
        start = sep.end()
        if head == "function":  # V3/R1: the name is the line after the separator, then a fence
            line_end = text.find("\n", start, stop)
            head, start = (text[start:line_end].strip(), line_end) if line_end >= 0 else (text[start:stop].strip(), stop)
            fence = _JSON_FENCE.match(text, start, stop)
            start = fence.end() if fence else start
        arguments = _arguments(text, start, _DEEPSEEK_END, stop, head, params)
        if head and arguments is not None:
            calls.append(ParsedCall(head, arguments))
    return calls


# The name is short and cannot hold `<`: one bounded look per token (stripped by the reader).
_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>([^<]{0,512})<\|tool_call_argument_begin\|>")
_KIMI_END = re.compile(r"<\|tool_call_end\|>|<\|tool_calls_section_end\|>")
_KIMI_INDEX = re.compile(r":\d+\Z")


@tool_call_family("kimi_k2", marker=r"<\|tool_calls_section_begin\|>|<\|tool_call_begin\|>", precedence=10)
def kimi_k2(text: str, params: Params) -> list[ParsedCall]:
    """Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
    <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`."""
    calls = []
    for m, stop in markers(_KIMI_CALL, text):
        name = _KIMI_INDEX.sub("", m.group(1).strip()).removeprefix("functions.")
        arguments = _arguments(text, m.end(), _KIMI_END, stop, name, params)
        if name and arguments is not None:
            calls.append(ParsedCall(name, arguments))
    return calls


_MESSAGE = "<|message|>"
_HEADER_CHARS = 400
"""How far before `<|message|>` its header (recipient, channel, constraint) is looked for."""
_HEADER_BOUNDARIES = ("<|end|>", "<|call|>", "<|return|>", "<|start|>", _MESSAGE)
_RECIPIENT = re.compile(r"to=([^\s<]{1,200})")
_HARMONY_END = re.compile(r"<\|call\|>|<\|end\|>|<\|return\|>|<\|start\|>")


def _harmony_calls(text: str) -> Iterator[tuple[str, int, int]]:
    """Each message addressed to a tool: (recipient, where its body starts, where the next such
    body starts). Found from each `<|message|>` (the first 2 * MAX_CALLS_PER_MESSAGE) by looking
    back over its short header, after the last end-of-message token, so the text is scanned once."""
    found: list[tuple[str, int]] = []
    pos = 0
    for _ in range(2 * MAX_CALLS_PER_MESSAGE):
        i = text.find(_MESSAGE, pos)
        if i < 0:
            break
        budget.check()
        window = max(i - _HEADER_CHARS, pos)
        header_start = max((j + len(b) for b in _HEADER_BOUNDARIES if (j := text.rfind(b, window, i)) >= 0), default=window)
        recipient = _RECIPIENT.search(text, header_start, i)
        if recipient is not None:
            found.append((recipient.group(1), i + len(_MESSAGE)))
        pos = i + len(_MESSAGE)
    for n, (name, start) in enumerate(found[:MAX_CALLS_PER_MESSAGE]):
        yield name, start, found[n + 1][1] if n + 1 < len(found) else len(text)


def _harmony_marker(text: str) -> bool:
    return next(_harmony_calls(text), None) is not None


@tool_call_family("harmony", marker=_harmony_marker, precedence=10)
def harmony(text: str, params: Params) -> list[ParsedCall]:
    """gpt-oss harmony: `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
    <|message|>{...}<|call|>` (the recipient may also stand before `<|channel|>`). Built-in
    tools keep their namespace (`browser.search`); `functions.` is dropped."""
    calls = []
    for recipient, start, stop in _harmony_calls(text):
        name = recipient.removeprefix("functions.")
        arguments = _arguments(text, start, _HARMONY_END, stop, name, params)
        if arguments is not None:
            calls.append(ParsedCall(name, arguments))
    return calls
