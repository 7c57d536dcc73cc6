"""Arguments from raw text: JSON (strict, then repaired), Python literals and pythonic calls.

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
from itertools import islice
from typing import Any, Iterator, Sequence

import json_repair

from env_server.tool_calls import budget
from env_server.tool_calls.registry import Params, ParsedCall
from env_server.tool_calls.scanning import MAX_CALLS_PER_MESSAGE, segment

_LENIENT_JSON = json.JSONDecoder(strict=False)
_LAYOUT_TOKENS = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
_NAME_KEYS = ("name", "tool_name", "tool", "function")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input", "params")
_ENVELOPE_KEYS = {"type", "id", "call_id", "tool_call_id", *_NAME_KEYS, *_ARGUMENT_KEYS}
_CALL_LIST_KEYS = ("tool_calls", "calls", "function_calls")
_KWARGS = re.compile(r"\(?\s*[A-Za-z_]\w*\s*=(?!=)")
# What a tool's name can be; anything else under a "name" key is prose json-repair misread.
_TOOL_NAME = re.compile(r"\A[A-Za-z_][\w\-]*(?:[.:][A-Za-z_][\w\-]*)*\Z")
_JSON_WORDS = {"true": True, "false": False, "null": None}
_ARGS_TOKEN = "[ARGS]"
_FENCE_OPEN = re.compile(r"\s*```[ \t]*[\w-]*[ \t]*\n")
_SEPARATORS = re.compile(r"[\s,;]*")
_NAMED_TOOL = re.compile(r"[\"'](?:name|tool_name)[\"']\s*:\s*[\"']([A-Za-z_][\w\-.:]{0,255})[\"']")
# JSON's structure outside strings: a whole string (unrolled, so one linear pass, closed or cut
# off) or one structural character.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[{}\[\],]')
_CLOSED_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_MAX_NESTING = 512
"""Deeper than any call's arguments, and than the JSON decoder reads."""
_MAX_LITERAL_TOKENS = 20_000
"""Tokens of a Python literal checked for implicit concatenation, at most (a call has dozens)."""
_NOT_READ = object()
_MAX_CUT_MARKERS = 256
"""Parameter-name markers the raw-text cut considers, at most."""


def load_json_object(raw: str) -> dict[str, Any] | None:
    """Parse (repairing if needed) text that should hold one JSON object; None if it does not."""
    obj, _ = load_value(raw)
    return obj if isinstance(obj, dict) else None


def parse_arguments(text: str, params: Sequence[str] | None = None) -> dict[str, Any] | None:
    """A call's raw `arguments` text as a dict; None if nothing usable.

    Accepts JSON (repaired when broken), Python literals, pythonic keyword arguments
    (`path="a.py", limit=3`, with or without parentheses) and Mistral's `[ARGS]{...}`.
    `params`, the tool's parameter names, enables cutting values out of JSON that repair misread.
    """
    text = text.strip()
    if text.startswith(_ARGS_TOKEN):
        text = text[len(_ARGS_TOKEN) :].strip()
    if not text:
        return {}
    if _KWARGS.match(text):
        kwargs = _python_kwargs(text if text.startswith("(") else f"({text})", params or ())
        if kwargs is not None:
            return kwargs
    obj, exact = load_value(text)
    if not isinstance(obj, dict):
        return None
    if params and (not exact or not set(obj) <= set(params)):
        cut = cut_by_parameter_names(text, params)
        if cut is not None and set(cut) >= set(obj) & set(params):
            return cut
    return obj


def load_value(raw: str) -> tuple[Any, bool]:
    """The value in `raw` and whether it was read exactly.

    Lossless readings first; json-repair last, because it guesses, and strips trailing
    whitespace off strings it repairs (a file's final newline, an indented `old_str`).
    """
    raw = raw.strip()
    if not raw:
        return None, False
    for text in _lossless_readings(raw):
        budget.check()
        try:
            # strict=False: raw newlines/tabs inside strings; raw_decode: prose after the value.
            return _LENIENT_JSON.raw_decode(text)[0], True
        except (ValueError, RecursionError):
            pass
    # The lenient readers are slow per character, json-repair super-linear on some shapes: the
    # message's budget bounds what they read and how long they run.
    allowance = budget.current()
    if not allowance.allow_lenient(len(raw)):
        return None, False
    literal = allowance.run_lenient(lambda: _python_literal(raw))
    if literal is not _NOT_READ and literal is not None:
        return literal, True
    budget.check()
    repaired = allowance.run_lenient(lambda: _json_repaired(raw))
    # json-repair answers '' (or a bare string) for text it cannot read as JSON.
    return (repaired if isinstance(repaired, (dict, list)) else None), False


def _json_repaired(raw: str) -> Any:
    try:
        return json_repair.loads(raw)
    except (RecursionError, ValueError):  # nesting deeper than any call's arguments
        return None


def _lossless_readings(raw: str) -> Iterator[str]:
    """`raw`, then (only if asked for) `raw` without trailing commas and with the closers it lacks."""
    yield raw
    fixed = _drop_commas_and_close(raw)
    if fixed is not None:
        yield fixed


def json_calls(raw: str, params: Params) -> list[ParsedCall]:
    """Every call in text holding JSON call objects: one, a list, or several in a row (separated
    by whitespace, `,` or `;`, as Llama 3.1 and JSON-lines formats write them); repaired if broken."""
    values, _ = exact_json_values(raw, 0)
    exact = bool(values)
    if not exact:
        value, exact = load_value(raw)
        values = [] if value is None else [value]
    calls = [c for value in values for c in calls_from_value(value, params)][:MAX_CALLS_PER_MESSAGE]
    if not values:
        cut = _cut_call(raw, params)
        return [] if cut is None else [cut]
    return [_refit(calls[0], raw, params, exact)] if len(calls) == 1 else calls


def _cut_call(raw: str, params: Params) -> ParsedCall | None:
    """A call of a known tool that no reader could read (or afford to: past the lenient budget),
    its arguments cut out of the raw text at the tool's parameter names."""
    named = _NAMED_TOOL.search(raw)
    if named is None or named.group(1) not in params:
        return None
    cut = cut_by_parameter_names(raw[named.end() :], params[named.group(1)])
    return None if cut is None else ParsedCall(named.group(1), cut)


def framed_json_calls(
    text: str, start: int, closer: re.Pattern[str], params: Params, stop: int | None = None
) -> tuple[list[ParsedCall], int]:
    """The calls in the JSON that follows a format's opening token at `start`, and where the
    exactly read JSON ends (`start` if none was).

    Read exactly from the opening on first, so a closing token quoted inside an argument (code
    that mentions `</tool_call>`) does not cut the call short; if that fails, the text up to the
    closing token (never past `stop`, the next call's marker) is repaired. A fence around the
    JSON is dropped."""
    stop = len(text) if stop is None else stop
    fence = _FENCE_OPEN.match(text, start, stop)
    start = fence.end() if fence else start
    values, end = exact_json_values(text, start)
    calls = [c for value in values for c in calls_from_value(value, params)][:MAX_CALLS_PER_MESSAGE]
    if calls:
        return [_refit(c, text[start:end], params, exact=True) for c in calls], end
    body = text[start:stop].split("```")[0] if fence else segment(text, start, closer, stop)
    return json_calls(body, params), start


def exact_json_values(text: str, i: int) -> tuple[list[Any], int]:
    """JSON values read exactly from `i` on (MAX_CALLS_PER_MESSAGE at most), separated by
    whitespace, `,` or `;`; and where they end."""
    values: list[Any] = []
    end = i
    while len(values) < MAX_CALLS_PER_MESSAGE:
        budget.check()
        i = _SEPARATORS.match(text, i).end()
        try:
            value, i = _LENIENT_JSON.raw_decode(text, i)
        except (ValueError, RecursionError):
            break
        values.append(value)
        end = i
    return values, end


def first_json_object(text: str, start: int) -> dict[str, Any] | None:
    """The JSON object read exactly from `start` on (after whitespace); None if there is none."""
    values, _ = exact_json_values(text, start)
    return values[0] if values and isinstance(values[0], dict) else None


def json_call(raw: str, params: Params) -> ParsedCall | None:
    """The first call in text holding a JSON call object."""
    calls = json_calls(raw, params)
    return calls[0] if calls else None


def _refit(call: ParsedCall, raw: str, params: Params, exact: bool) -> ParsedCall:
    expected = params.get(call.name)
    if expected is not None and (not exact or not set(call.arguments) <= set(expected)):
        # json-repair guessed (typically around unescaped quotes in code): slicing the raw text
        # at the parameter names is exact whenever it finds every argument the guess found.
        cut = cut_by_parameter_names(raw, expected)
        if cut is not None and set(cut) >= set(call.arguments) & set(expected):
            return ParsedCall(call.name, cut)
    return call


def calls_from_value(obj: Any, params: Params) -> list[ParsedCall]:
    """The calls a decoded JSON value holds: {name, arguments}, OpenAI's {function: {...}},
    Command-R's {tool_name, parameters}, lists of those, and {"tool_calls": [...]} wrappers."""
    if isinstance(obj, list):
        return [c for item in obj for c in calls_from_value(item, params)]
    if not isinstance(obj, dict):
        return []
    for key in _CALL_LIST_KEYS:
        if isinstance(obj.get(key), list):
            return calls_from_value(obj[key], params)
    call = _call_from_object(obj, params)
    return [] if call is None else [call]


def _call_from_object(obj: dict[str, Any], params: Params) -> ParsedCall | None:
    if isinstance(obj.get("function"), dict):
        return _call_from_object(obj["function"], params)
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str) and _TOOL_NAME.match(obj[k])), None)
    if name is None:
        if len(obj) == 1:
            ((key, value),) = obj.items()
            if key in params and isinstance(value, dict):
                return ParsedCall(key, value)
            if isinstance(value, dict):
                return _call_from_object(value, params)
        return None
    arguments: Any = next((obj[k] for k in _ARGUMENT_KEYS if k in obj), None)
    if arguments is None:
        arguments = {k: v for k, v in obj.items() if k not in _ENVELOPE_KEYS}
    if isinstance(arguments, str):
        arguments = parse_arguments(arguments, params.get(name))
    if isinstance(arguments, dict) and set(arguments) == {"arguments"} and isinstance(arguments["arguments"], dict):
        arguments = arguments["arguments"]
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, arguments)


def _python_literal(raw: str) -> Any:
    """`raw` as a Python literal (single-quoted strings, None, True), or _NOT_READ."""
    try:
        return _checked_literal(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, tokenize.TokenError):
        return _NOT_READ


def _checked_literal(raw: str) -> Any:
    """`ast.literal_eval`, refusing implicit string concatenation: `"split(" ")"` is an unescaped
    quote in JSON, not the two Python literals `"split("` and `")"`. The literal is read first
    (the parser is fast and refuses most text at once); only a literal is tokenized, and only
    one of at most _MAX_LITERAL_TOKENS tokens (the tokenizer costs microseconds a token)."""
    value = ast.literal_eval(raw)
    tokens = islice(tokenize.generate_tokens(io.StringIO(raw).readline), _MAX_LITERAL_TOKENS + 1)
    kinds = [t.type for t in tokens if t.type not in _LAYOUT_TOKENS]
    if len(kinds) > _MAX_LITERAL_TOKENS:
        raise ValueError("a literal too long to check")
    if any(a == b == tokenize.STRING for a, b in zip(kinds, kinds[1:])):
        raise ValueError("adjacent string literals")
    return value


def _drop_commas_and_close(raw: str) -> str | None:
    """Remove trailing commas and append the closers a truncated text lacks, leaving strings
    untouched; None when the structure is deeper or longer than any call's (not worth a pass).

    Walks tokens (whole strings, structural characters), not characters, so a long string costs
    one regular-expression step."""
    out: list[str] = []
    closers: list[str] = []
    last = 0
    allowance = budget.current()
    for count, token in enumerate(_JSON_TOKEN.finditer(raw)):
        if len(closers) > _MAX_NESTING or (count % 256 == 0 and not allowance.take_tokens(256)):
            return None
        out.append(raw[last : token.start()])
        kind = token.group()[0]
        if kind in "}]":
            _drop_trailing_comma(out)
            if closers:
                closers.pop()
        elif kind in "{[":
            closers.append("}" if kind == "{" else "]")
        out.append(token.group())
        last = token.end()
    out.append(raw[last:])
    if last == len(raw) and out[-2:-1] and _CLOSED_STRING.fullmatch(out[-2]) is None and out[-2].startswith('"'):
        out.append('"')  # the text ended inside a string
    _drop_trailing_comma(out)
    return "".join(out) + "".join(reversed(closers))


def _drop_trailing_comma(out: list[str]) -> None:
    """Drop a `,` that ends what `out` holds, ignoring whitespace after it (which goes too)."""
    while out and not out[-1].strip():
        out.pop()
    if out and out[-1].rstrip().endswith(","):
        text = out[-1].rstrip()
        out[-1] = text[:-1]


def cut_by_parameter_names(raw: str, expected: Sequence[str]) -> dict[str, Any] | None:
    """Cut string values out of malformed JSON by locating `"param":` markers in the raw text."""
    marker = re.compile(r"[\"']({})[\"']\s*:\s*".format("|".join(map(re.escape, expected))))
    found = list(islice(marker.finditer(raw), _MAX_CUT_MARKERS))
    if not found:
        return None
    arguments: dict[str, Any] = {}
    for i, m in enumerate(found):
        budget.check()
        end = found[i + 1].start() if i + 1 < len(found) else len(raw)
        value = raw[m.end() : end].rstrip()
        value = value.rstrip("}] \t\r\n") if i + 1 == len(found) else value
        value = value.rstrip(",").rstrip()
        arguments[m.group(1)] = _decode_value(value)
    return arguments


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


def python_calls(source: str, params: Params) -> list[ParsedCall] | None:
    """Calls written as Python: `[f(a=1), g(b="x")]`, `f(a=1)`, one call per statement, and
    `print(f(...))` (Gemma). Dotted names keep their last part (`default_api.f` is `f`), except
    Llama's built-ins, `brave_search.call(...)`, which are named by the module. None if `source`
    is not such Python."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    nodes: list[ast.expr] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            return None
        value = statement.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    calls = [_python_call(node, params) for node in nodes]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _python_call(node: ast.expr, params: Params) -> ParsedCall | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" and len(node.args) == 1:
        node = node.args[0]
    if not isinstance(node, ast.Call):
        return None
    name = _dotted_name(node.func)
    if name is None:
        return None
    kwargs = _call_arguments(node, params.get(name, ()))
    return None if kwargs is None else ParsedCall(name, kwargs)


def _dotted_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        if func.attr == "call" and isinstance(func.value, ast.Name):
            return func.value.id
        return func.attr
    return None


def _python_kwargs(source: str, params: Sequence[str]) -> dict[str, Any] | None:
    """`(a=1, b="x")` as {"a": 1, "b": "x"}."""
    try:
        node = ast.parse(f"f{source}", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return _call_arguments(node, params) if isinstance(node, ast.Call) else None


def _call_arguments(node: ast.Call, params: Sequence[str]) -> dict[str, Any] | None:
    """Keyword arguments; positional ones only where the tool's parameter names place them."""
    if len(node.args) > len(params) or any(k.arg is None for k in node.keywords):
        return None
    try:
        arguments = {params[i]: _literal(arg) for i, arg in enumerate(node.args)}
        arguments.update({k.arg: _literal(k.value) for k in node.keywords if k.arg is not None})
    except (ValueError, TypeError, RecursionError):
        return None
    return arguments


def _literal(node: ast.expr) -> Any:
    """A Python literal, also accepting JSON's true/false/null, which models mix into Python calls."""
    if isinstance(node, ast.Name) and node.id in _JSON_WORDS:
        return _JSON_WORDS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values) if k is not None}
    return ast.literal_eval(node)
