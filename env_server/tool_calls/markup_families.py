"""Families whose arguments are tagged raw text, so code needs no escaping: Qwen3-Coder,
GLM-4.5/4.6, Claude-style `<invoke>` and MiniMax M2.

Values stay strings (these formats carry no types; the tool's schema types them, as the
service's validation does). A value ends at its closing tag only where the next thing is the
next argument or the call's end, so code that quotes a closing tag stays whole.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from env_server.tool_calls import budget
from env_server.tool_calls.registry import Params, ParsedCall, tool_call_family
from env_server.tool_calls.scanning import MAX_CALLS_PER_MESSAGE, ForwardSearch

MAX_ARGUMENTS_PER_CALL = 256
"""Arguments read from one call, at most (a tool has a handful)."""

_SPACE = re.compile(r"\s*")


def _tagged_arguments(
    text: str, start: int, key: re.Pattern[str], close: str, bounded: ForwardSearch, loose: ForwardSearch, unwrap: Callable[[str], str]
) -> tuple[dict[str, Any], int]:
    """Arguments `key-match VALUE close`, one after another from `start`; and where they end.

    A value ends at the first closing tag `bounded` finds (one followed by the next key or the
    call's end), else at the first `loose` finds (any closing tag, key or call end)."""
    arguments: dict[str, Any] = {}
    pos = start
    while len(arguments) < MAX_ARGUMENTS_PER_CALL and (m := key.match(text, _SPACE.match(text, pos).end())) is not None:
        budget.check()
        end = bounded.search(m.end()) or loose.search(m.end())
        value_end = end.start() if end else len(text)
        if end is not None and not text.startswith(close, value_end):  # the next key or the call's end
            value_end -= len(text[m.end() : value_end]) - len(text[m.end() : value_end].rstrip())
        arguments[m.group(1).strip()] = unwrap(text[m.end() : value_end])
        closing = text.startswith(close, value_end)
        pos = value_end + len(close) if closing else value_end
    return arguments, pos


def _tagged_calls(
    text: str, call: re.Pattern[str], key: re.Pattern[str], close: str, after_value: str, unwrap: Callable[[str], str] = str
) -> list[ParsedCall]:
    """Every `call` match (its group 1 the tool's name) with the tagged arguments that follow it.

    `key` and `after_value` (what may follow a value's closing tag after whitespace: the next key
    or the call's end) start with no whitespace, and whitespace runs are taken possessively, so
    no search backtracks over one. Every search only moves forward through the message
    (`ForwardSearch`), so the message costs one pass per pattern however many calls and
    arguments it holds."""
    bounded = ForwardSearch(re.compile(re.escape(close) + r"(?=\s*+(?:" + after_value + r"|\Z))"), text)
    loose = ForwardSearch(re.compile(re.escape(close) + "|" + key.pattern + "|" + after_value), text)
    calls_ahead = ForwardSearch(call, text)
    calls = []
    pos = 0
    while len(calls) < MAX_CALLS_PER_MESSAGE and (m := calls_ahead.search(pos)) is not None:
        budget.check()
        arguments, pos = _tagged_arguments(text, m.end(), key, close, bounded, loose, unwrap)
        calls.append(ParsedCall(m.group(1), arguments))
    return calls


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


_FUNCTION = re.compile(r"<function=([^<>\s]{1,256})\s*>(?!\s*\{)")
_PARAMETER = re.compile(r"<parameter=([^<>\s]{1,256})\s*>")


@tool_call_family("qwen3_coder", marker=_FUNCTION.pattern, precedence=20)
def qwen3_coder(text: str, params: Params) -> list[ParsedCall]:
    """Qwen3-Coder (also Seed-OSS, inside `<seed:tool_call>`):
    `<tool_call><function=NAME><parameter=K>\\nV\\n</parameter></function></tool_call>`."""
    return _tagged_calls(
        text, _FUNCTION, _PARAMETER, "</parameter>", "<parameter=|</function>|</tool_call>", _strip_one_newline
    )


_GLM_CALL = re.compile(r"<tool_call>\s*([A-Za-z_][\w.\-]*)\s*(?=<arg_key>|</tool_call>)")
# A key is short: bounded, so an unclosed `<arg_key>` costs a short look, not a scan (stripped by the reader).
_ARG_KEY = re.compile(r"<arg_key>([^<]{0,256})</arg_key>\s*<arg_value>")


@tool_call_family("glm45", marker=_GLM_CALL.pattern, precedence=30)
def glm45(text: str, params: Params) -> list[ParsedCall]:
    """GLM-4.5/4.6/4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`."""
    return _tagged_calls(text, _GLM_CALL, _ARG_KEY, "</arg_value>", "<arg_key>|</tool_call>")


_INVOKE = re.compile(r"<invoke\s+name=\"([^\"<]{1,256})\"\s*>")
_NAMED_PARAMETER = re.compile(r"<parameter\s+name=\"([^\"<]{1,256})\"\s*>")


def _invokes(text: str) -> list[ParsedCall]:
    return _tagged_calls(text, _INVOKE, _NAMED_PARAMETER, "</parameter>", r"<parameter\s+name=|</invoke>")


@tool_call_family("claude_xml", marker=r"<function_calls>|<invoke\s+name=", precedence=15)
def claude_xml(text: str, params: Params) -> list[ParsedCall]:
    """Claude-style: `<function_calls><invoke name="X"><parameter name="k">v</parameter></invoke></function_calls>`."""
    return _invokes(text)


@tool_call_family("minimax_m2", marker=r"<minimax:tool_call>", precedence=10)
def minimax_m2(text: str, params: Params) -> list[ParsedCall]:
    """MiniMax M2: `<minimax:tool_call><invoke name="X"><parameter name="k">v</parameter></invoke></minimax:tool_call>`."""
    return _invokes(text)
