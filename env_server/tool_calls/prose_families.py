"""Families that announce a call in prose: Command-R `Action:` JSON and ReAct `Action:`/`Action Input:`."""

from __future__ import annotations

import re

from env_server.tool_calls.arguments import framed_json_calls, load_value, parse_arguments
from env_server.tool_calls.registry import Params, ParsedCall, tool_call_family
from env_server.tool_calls.scanning import MAX_CALLS_PER_MESSAGE, markers

_COMMAND_R = re.compile(r"Action:\s*(?=```)|<\|START_ACTION\|>")
_COMMAND_R_END = re.compile(r"<\|END_ACTION\|>|```")


@tool_call_family("command_r", marker=_COMMAND_R.pattern, precedence=10)
def command_r(text: str, params: Params) -> list[ParsedCall]:
    """Cohere Command R/R+: `Action: ```json [{"tool_name": ..., "parameters": {...}}] ````;
    Command A: `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>`."""
    calls = [c for m, stop in markers(_COMMAND_R, text) for c in framed_json_calls(text, m.end(), _COMMAND_R_END, params, stop)[0]]
    return calls[:MAX_CALLS_PER_MESSAGE]


_REACT = re.compile(
    r"(?m)^[ \t]*Action[ \t]*:[ \t]*`?([^\s`]+?)`?[ \t]*\n(?:[ \t]*\n)?[ \t]*Action[ \t]+Input[ \t]*:[ \t]*(.*?)"
    r"(?=\n[ \t]*(?:Observation|Thought|Action|Final Answer)[ \t]*:|\Z)",
    re.DOTALL,
)


@tool_call_family("react", marker=r"(?m)^[ \t]*Action[ \t]*:[^\n]*\n(?:[ \t]*\n)?[ \t]*Action[ \t]+Input[ \t]*:", precedence=50)
def react(text: str, params: Params) -> list[ParsedCall]:
    """ReAct (LangChain and others): `Action: NAME` then `Action Input: ...` up to `Observation:`.
    Input that is not JSON or keyword arguments is plain text: it goes to the tool's first
    parameter when the tool is known, else to `input`."""
    calls = []
    for m, _ in markers(_REACT, text):
        name, raw = m.group(1), m.group(2).strip()
        known = params.get(name)
        arguments = parse_arguments(_unfence(raw), known)
        if arguments is None:
            value, exact = load_value(raw)  # a quoted string is the string
            arguments = {known[0] if known else "input": value if exact and isinstance(value, str) else raw}
        calls.append(ParsedCall(name, arguments))
    return calls


def _unfence(raw: str) -> str:
    fenced = re.fullmatch(r"```[\w-]*\s*\n?(.*?)\n?```", raw, re.DOTALL)
    return fenced.group(1) if fenced else raw
