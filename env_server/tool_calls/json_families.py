"""Families whose calls are JSON objects behind a format's own opening token (or none at all)."""

from __future__ import annotations

import re

from env_server.tool_calls.arguments import (
    calls_from_value,
    exact_json_values,
    first_json_object,
    framed_json_calls,
    json_call,
    json_calls,
    parse_arguments,
    python_calls,
)
from env_server.tool_calls.registry import Params, ParsedCall, tool_call_family
from env_server.tool_calls.scanning import MAX_CALLS_PER_MESSAGE, markers, segment

_NAME_KEY = r"[\"'](?:name|tool_name)[\"']\s*:"


def _framed(text: str, opener: re.Pattern[str], closer: re.Pattern[str], params: Params) -> list[ParsedCall]:
    """The calls after each `opener`; an opener inside JSON already read (quoted in code) is text."""
    calls: list[ParsedCall] = []
    read_to = 0
    for m, stop in markers(opener, text):
        if m.start() < read_to:
            continue
        found, read_to = framed_json_calls(text, m.end(), closer, params, stop)
        calls.extend(found)
    return calls[:MAX_CALLS_PER_MESSAGE]


_TOOL_CALL = re.compile(r"<tool_call>")
_TOOL_CALL_END = re.compile(r"</tool_call>|<tool_call>")


@tool_call_family("hermes", marker=r"<tool_call>", precedence=40)
def hermes(text: str, params: Params) -> list[ParsedCall]:
    """Hermes, Qwen2.5, Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one
    object per tag (a ```json fence inside the tag is accepted)."""
    return _framed(text, _TOOL_CALL, _TOOL_CALL_END, params)


# Names hold no `<`: a run of unclosed `<function=` openers costs one look each, not a scan to the end.
_FUNCTION_JSON = re.compile(r"<function=([^<>\s]{1,256})\s*>(?=\s*\{)")
_FUNCTION_END = re.compile(r"</function>")


@tool_call_family("function_tag_json", marker=_FUNCTION_JSON.pattern, precedence=20)
def function_tag_json(text: str, params: Params) -> list[ParsedCall]:
    """Llama 3.1's custom-tool form: `<function=NAME>{"arg": ...}</function>`."""
    calls = []
    for m, stop in markers(_FUNCTION_JSON, text):
        name = m.group(1)
        arguments = first_json_object(text, m.end()) or parse_arguments(segment(text, m.end(), _FUNCTION_END, stop), params.get(name))
        if arguments is not None:
            calls.append(ParsedCall(name, arguments))
    return calls


_PYTHON_TAG = re.compile(r"<\|python_tag\|>")
_LLAMA_END = re.compile(r"<\|eom_id\|>|<\|eot_id\|>|<\|python_tag\|>")
_LEADING_OBJECT = re.compile(r"\A\s*(?=\{)")


_LEADING_CALL = re.compile(r"\s*\{\s*" + _NAME_KEY)


def _llama3_marker(text: str) -> bool:
    # Two checks, not one alternation: a pattern anchored at the start costs one try, not one per position.
    return "<|python_tag|>" in text or _LEADING_CALL.match(text) is not None


@tool_call_family("llama3_json", marker=_llama3_marker, precedence=50)
def llama3_json(text: str, params: Params) -> list[ParsedCall]:
    """Llama 3.1/3.3 JSON calls: the message is `{"name": ..., "parameters": {...}}` (several
    separated by `;`), optionally after `<|python_tag|>`; a tagged built-in such as
    `brave_search.call(query="...")` is read as Python."""
    calls: list[ParsedCall] = []
    leading = _LEADING_OBJECT.match(text)
    for m, stop in [*markers(_PYTHON_TAG, text)] or ([(leading, len(text))] if leading else []):
        body = segment(text, m.end(), _LLAMA_END, stop)
        # After the tag: JSON, a pythonic list (Llama 3.2 may tag it too) or a built-in's call.
        pythonic = None if body.lstrip().startswith("{") else python_calls(body, params)
        calls.extend(pythonic if pythonic is not None else framed_json_calls(text, m.end(), _LLAMA_END, params, stop)[0])
    return calls[:MAX_CALLS_PER_MESSAGE]


_MISTRAL = re.compile(r"\[TOOL_CALLS\]")
_MISTRAL_END = re.compile(r"\[TOOL_CALLS\]|</s>")
# Bounded name and id: on a long run without `[ARGS]` each try stops early.
_MISTRAL_NAMED = re.compile(r"\s{0,64}([^\s\[\]{}]{1,256})\s{0,64}(?:\[CALL_ID\]\s{0,64}\w{0,256}\s{0,64})?\[ARGS\]")


@tool_call_family("mistral", marker=_MISTRAL.pattern, precedence=10)
def mistral(text: str, params: Params) -> list[ParsedCall]:
    """Mistral `[TOOL_CALLS]`: a JSON list of calls (v3 tokenizers) or, from v11 on, one
    `[TOOL_CALLS]NAME[ARGS]{...}` per call (v13 adds `[CALL_ID]id` before `[ARGS]`)."""
    calls: list[ParsedCall] = []
    for m, stop in markers(_MISTRAL, text):
        named = _MISTRAL_NAMED.match(text, m.end(), stop)
        if named is None:
            calls.extend(framed_json_calls(text, m.end(), _MISTRAL_END, params, stop)[0])
            continue
        name = named.group(1)
        arguments = first_json_object(text, named.end()) or parse_arguments(segment(text, named.end(), _MISTRAL_END, stop), params.get(name))
        if arguments is not None:
            calls.append(ParsedCall(name, arguments))
    return calls[:MAX_CALLS_PER_MESSAGE]


_GRANITE = re.compile(r"<\|tool_call\|>")
_GRANITE_END = re.compile(r"<\|/tool_call\|>|<\|tool_call\|>|<\|end_of_text\|>")


@tool_call_family("granite", marker=_GRANITE.pattern, precedence=12)
def granite(text: str, params: Params) -> list[ParsedCall]:
    """IBM Granite 3.x: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`."""
    return _framed(text, _GRANITE, _GRANITE_END, params)


_FUNCTOOLS = re.compile(r"functools(?=\[)")


@tool_call_family("phi4", marker=r"functools\[|<\|/tool_call\|>", precedence=11)
def phi4(text: str, params: Params) -> list[ParsedCall]:
    """Phi-4-mini: `functools[{"name": ..., "arguments": {...}}]`; later Phi-4 models wrap the
    list in `<|tool_call|>...<|/tool_call|>`."""
    return _framed(text, _FUNCTOOLS, _GRANITE_END, params) or _framed(text, _GRANITE, _GRANITE_END, params)


_NEMOTRON = re.compile(r"<TOOLCALL>")
_NEMOTRON_END = re.compile(r"</TOOLCALL>|<TOOLCALL>")


@tool_call_family("nemotron", marker=_NEMOTRON.pattern, precedence=10)
def nemotron(text: str, params: Params) -> list[ParsedCall]:
    """Llama-Nemotron: `<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>`."""
    return _framed(text, _NEMOTRON, _NEMOTRON_END, params)


_TOOL_CALLS_TAG = re.compile(r"<tool_calls>")
_TOOL_CALLS_TAG_END = re.compile(r"</tool_calls>|<tool_calls>")


@tool_call_family("tool_calls_tag", marker=_TOOL_CALLS_TAG.pattern, precedence=10)
def tool_calls_tag(text: str, params: Params) -> list[ParsedCall]:
    """MiniMax-M1, Hunyuan, Jamba: `<tool_calls>` around a JSON list or one object per line."""
    return _framed(text, _TOOL_CALLS_TAG, _TOOL_CALLS_TAG_END, params)


_XLAM = re.compile(r"(?m)^[ \t]*(?=\[\s*\{\s*" + _NAME_KEY + r"|\{\s*[\"']tool_calls[\"']\s*:\s*\[)")
_NOTHING = re.compile(r"(?!)")


@tool_call_family("xlam", marker=_XLAM.pattern, precedence=60)
def xlam(text: str, params: Params) -> list[ParsedCall]:
    """Salesforce xLAM: a bare JSON list of calls, `[{"name": ..., "arguments": {...}}]`, or
    `{"tool_calls": [...]}`, on a line of its own."""
    m = _XLAM.search(text)
    return [] if m is None else framed_json_calls(text, m.end(), _NOTHING, params)[0]


_FENCE = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n")
_FENCE_END = re.compile(r"\n?```")


@tool_call_family("fenced_json", marker=r"```[ \t]*[\w-]*[ \t]*\n\s*[\[{][^`]*?" + _NAME_KEY, precedence=70)
def fenced_json(text: str, params: Params) -> list[ParsedCall]:
    """Generic: a ```json (or bare ```) block holding call objects, one block per call or a list."""
    blocks = [segment(text, m.end(), _FENCE_END, stop) for m, stop in markers(_FENCE, text)]
    return [c for block in blocks if "{" in block for c in json_calls(block, params)][:MAX_CALLS_PER_MESSAGE]


# Anchored at the first brace, so the search is one linear scan.
_BARE = re.compile(r"(?s)\A[^{]*\{.*?" + _NAME_KEY)


# Where a call object can start: a brace opening a quoted key.
_OBJECT_START = re.compile(r"\{\s*[\"']")


@tool_call_family("bare_json", marker=_BARE.pattern, precedence=80)
def bare_json(text: str, params: Params) -> list[ParsedCall]:
    """Last resort: call objects written into the prose; every one that reads exactly, else the
    first `{` on repaired."""
    calls: list[ParsedCall] = []
    end = 0
    for m, _ in markers(_OBJECT_START, text):
        if m.start() < end:
            continue  # inside a call already read
        values, value_end = exact_json_values(text, m.start())
        found = [c for value in values for c in calls_from_value(value, params)]
        calls.extend(found)
        end = value_end if found else end
    if calls:
        return calls[:MAX_CALLS_PER_MESSAGE]
    call = json_call(text[text.find("{") :], params)
    return [] if call is None else [call]
