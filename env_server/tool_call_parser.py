"""Extract tool calls from a model's raw assistant message, repairing what can be repaired.

Recognised, in this order:
- XML functions (Qwen3-Coder style): `<function=NAME><parameter=K>V</parameter></function>`;
  values are raw text, so code needs no escaping.
- Hermes/Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
- Fenced JSON: a ```json (or bare ```) block holding such an object.
- A bare JSON object with a `name` in the prose, as a last resort.

JSON is parsed strictly first, then with `json-repair` (trailing commas, single quotes, raw
newlines, truncation). When the tool's parameter names are known and the repaired object does
not fit them (typically unescaped quotes inside code), the values are cut out of the raw text
at the parameter-name boundaries instead.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import json_repair


@dataclass(frozen=True)
class ParsedCall:
    """One tool call recovered from text."""

    name: str
    arguments: dict[str, Any]


class ToolCallParseError(ValueError):
    """The text announces a tool call but none could be recovered from it."""


_FUNCTION = re.compile(r"<function=([^>\s]+)\s*>")
_FUNCTION_END = re.compile(r"</function>|<function=|</tool_call>")
_PARAMETER = re.compile(r"<parameter=([^>\s]+)\s*>")
_PARAMETER_END = re.compile(r"</parameter>|<parameter=|</function>|</tool_call>")
_TOOL_CALL = re.compile(r"<tool_call>")
_TOOL_CALL_END = re.compile(r"</tool_call>|<tool_call>")
_FENCE = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n")
_FENCE_END = re.compile(r"\n?```")
_LENIENT_JSON = json.JSONDecoder(strict=False)
_LAYOUT_TOKENS = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
_NAME_KEYS = ("name", "tool_name", "tool", "function")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input", "params")
_ENVELOPE_KEYS = {"type", "id", "call_id", *_NAME_KEYS, *_ARGUMENT_KEYS}


def parse_tool_calls(text: str, params: Mapping[str, Sequence[str]] | None = None) -> list[ParsedCall]:
    """All tool calls in `text`, in order; [] if it holds none.

    `params` maps known tool names to their parameter names; it enables the name-as-key
    nesting repair and the raw-text fallback for values JSON repair got wrong.
    Raises ToolCallParseError when a call marker is present but nothing usable follows it.
    """
    params = params or {}
    if _FUNCTION.search(text):
        calls = [_xml_call(m, text) for m in _FUNCTION.finditer(text)]
        return _require([c for c in calls if c is not None], text)
    if _TOOL_CALL.search(text):
        calls = [_json_call(_segment(text, m.end(), _TOOL_CALL_END), params) for m in _TOOL_CALL.finditer(text)]
        return _require([c for c in calls if c is not None], text)
    fenced = [_segment(text, m.end(), _FENCE_END) for m in _FENCE.finditer(text)]
    calls = [c for c in (_json_call(block, params) for block in fenced if "{" in block) if c is not None]
    if calls:
        return calls
    start = text.find("{")
    if start >= 0 and re.search(r"[\"'](name|tool_name|function)[\"']\s*:", text[start:]):
        return _require([c for c in [_json_call(text[start:], params)] if c is not None], text)
    return []


def _require(calls: list[ParsedCall], text: str) -> list[ParsedCall]:
    if not calls:
        raise ToolCallParseError(f"could not parse the tool call in: {text[:200]!r}")
    return calls


def _segment(text: str, start: int, end_pattern: re.Pattern[str]) -> str:
    end = end_pattern.search(text, start)
    return text[start : end.start() if end else len(text)]


def _xml_call(match: re.Match[str], text: str) -> ParsedCall | None:
    body = _segment(text, match.end(), _FUNCTION_END)
    arguments = {}
    for p in _PARAMETER.finditer(body):
        value = _segment(body, p.end(), _PARAMETER_END)
        arguments[p.group(1)] = _strip_one_newline(value)
    return ParsedCall(match.group(1), arguments)


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _json_call(raw: str, params: Mapping[str, Sequence[str]]) -> ParsedCall | None:
    obj, exact = _load(raw)
    call = _normalize(obj, params)
    if call is None:
        return None
    expected = params.get(call.name)
    if expected is not None and (not exact or not set(call.arguments) <= set(expected)):
        # json-repair guessed (typically around unescaped quotes in code): slicing the raw text
        # at the parameter names is exact whenever it finds every argument the guess found.
        cut = _cut_by_parameter_names(raw, call.name, expected)
        if cut is not None and set(cut.arguments) >= set(call.arguments) & set(expected):
            return cut
    return call


def load_json_object(raw: str) -> dict[str, Any] | None:
    """Parse (repairing if needed) text that should hold one JSON object; None if it does not."""
    obj, _ = _load(raw)
    return obj if isinstance(obj, dict) else None


def _load(raw: str) -> tuple[Any, bool]:
    """The value in `raw` and whether it was read exactly.

    Lossless readings first; json-repair last, because it guesses, and strips trailing
    whitespace off strings it repairs (a file's final newline, an indented `old_str`).
    """
    raw = raw.strip()
    for text in (raw, _drop_commas_and_close(raw)):
        try:
            # strict=False: raw newlines/tabs inside strings; raw_decode: prose after the value.
            return _LENIENT_JSON.raw_decode(text)[0], True
        except ValueError:
            pass
    try:
        return _python_literal(raw), True  # Python-style dicts: single quotes, None, True
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, tokenize.TokenError):
        pass
    repaired = json_repair.loads(raw)
    # json-repair answers '' (or a bare string) for text it cannot read as JSON.
    return (repaired if isinstance(repaired, (dict, list)) else None), False


def _python_literal(raw: str) -> Any:
    """`ast.literal_eval`, refusing implicit string concatenation: `"split(" ")"` is an unescaped
    quote in JSON, not the two Python literals `"split("` and `")"`."""
    kinds = [t.type for t in tokenize.generate_tokens(io.StringIO(raw).readline) if t.type not in _LAYOUT_TOKENS]
    if any(a == b == tokenize.STRING for a, b in zip(kinds, kinds[1:])):
        raise ValueError("adjacent string literals")
    return ast.literal_eval(raw)


def _drop_commas_and_close(raw: str) -> str:
    """Remove trailing commas and append the closers a truncated text lacks, leaving strings untouched."""
    out: list[str] = []
    closers: list[str] = []
    in_string = escaped = False
    for ch in raw:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]":
            _drop_trailing_comma(out)
            if closers:
                closers.pop()
        out.append(ch)
    if in_string:
        out.append('"')
    _drop_trailing_comma(out)
    return "".join(out) + "".join(reversed(closers))


def _drop_trailing_comma(out: list[str]) -> None:
    i = len(out) - 1
    while i >= 0 and out[i].isspace():
        i -= 1
    if i >= 0 and out[i] == ",":
        del out[i]


def _normalize(obj: Any, params: Mapping[str, Sequence[str]]) -> ParsedCall | None:
    """Accept the shapes models emit: {name, arguments}, OpenAI's {function: {...}}, lists, wrappers."""
    if isinstance(obj, list):
        return next((c for c in (_normalize(item, params) for item in obj) if c is not None), None)
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        return _normalize(obj["function"], params)
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str) and obj[k]), None)
    if name is None:
        if len(obj) == 1:
            (key, value), = obj.items()
            if key in params and isinstance(value, dict):
                return ParsedCall(key, value)
            return _normalize(value, params)
        return None
    arguments: Any = next((obj[k] for k in _ARGUMENT_KEYS if k in obj), None)
    if arguments is None:
        arguments = {k: v for k, v in obj.items() if k not in _ENVELOPE_KEYS}
    if isinstance(arguments, str):
        arguments = _load(arguments)[0] if arguments.strip() else {}
    if isinstance(arguments, dict) and set(arguments) == {"arguments"} and isinstance(arguments["arguments"], dict):
        arguments = arguments["arguments"]
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, arguments)


def _cut_by_parameter_names(raw: str, name: str, expected: Sequence[str]) -> ParsedCall | None:
    """Cut string values out of malformed JSON by locating `"param":` markers in the raw text."""
    marker = re.compile(r"[\"']({})[\"']\s*:\s*".format("|".join(map(re.escape, expected))))
    found = list(marker.finditer(raw))
    if not found:
        return None
    arguments: dict[str, Any] = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(raw)
        value = raw[m.end() : end].rstrip()
        value = re.sub(r"[}\]\s]*$", "", value) if i + 1 == len(found) else value
        value = value.rstrip(",").rstrip()
        arguments[m.group(1)] = _decode_value(value)
    return ParsedCall(name, arguments)


def _decode_value(value: str) -> Any:
    if value[:1] not in "\"'":
        try:
            return json.loads(value)
        except ValueError:
            return value
    quote = value[0]
    body = value[1:-1] if len(value) > 1 and value.endswith(quote) else value[1:]
    if re.search(r'(?<!\\)"', body):
        return body  # the writer did not escape its quotes, so it escaped nothing: take it verbatim
    try:
        return json.loads(f'"{body}"', strict=False)
    except ValueError:
        return body
