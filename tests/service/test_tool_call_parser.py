"""Tool-call extraction from raw assistant text: the malformed-call corpus and the edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_server.call_runner import TOOL_PARAMETERS
from env_server.tool_call_parser import ParsedCall, ToolCallParseError, parse_tool_calls
from env_server.tools import TOOLS

CORPUS = Path(__file__).parent / "data" / "malformed_calls.jsonl"
REQUIRED_SUCCESS_RATE = 0.995


def _parsed_as_meant(text: str, expected: dict) -> bool:
    """The first call names the expected tool and its validated arguments equal the intended ones."""
    try:
        calls = parse_tool_calls(text, TOOL_PARAMETERS)
    except ToolCallParseError:
        return False
    if not calls or calls[0].name != expected["name"]:
        return False
    model = TOOLS[expected["name"]].arguments
    try:
        return model.model_validate(calls[0].arguments) == model.model_validate(expected["arguments"])
    except ValueError:
        return False


def test_malformed_call_corpus_parses_above_target() -> None:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    assert len(rows) >= 200
    failures = [row["id"] for row in rows if not _parsed_as_meant(row["text"], row["expected"])]
    rate = 1 - len(failures) / len(rows)
    assert rate >= REQUIRED_SUCCESS_RATE, f"{rate:.4f}; failed: {failures}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Sure.\n<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call>", [ParsedCall("bash", {"command": "ls"})]),
        (
            "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"a\"}}</tool_call>\n"
            "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"b\"}}</tool_call>",
            [ParsedCall("bash", {"command": "a"}), ParsedCall("bash", {"command": "b"})],
        ),
        ("<function=read_file>\n<parameter=path>\na.py\n</parameter>\n</function>", [ParsedCall("read_file", {"path": "a.py"})]),
        ("No tool needed, the answer is 4.", []),
    ],
)
def test_formats(text: str, expected: list[ParsedCall]) -> None:
    assert parse_tool_calls(text, TOOL_PARAMETERS) == expected


def test_announced_but_unreadable_call_raises() -> None:
    with pytest.raises(ToolCallParseError):
        parse_tool_calls("<tool_call>I will now run the tests</tool_call>", TOOL_PARAMETERS)


def test_code_keeps_its_final_newline_and_indentation() -> None:
    text = '<tool_call>{"name": "edit_file", "arguments": {"path": "a.py", "old_str": "    x = 1\\n", "new_str": "    x = 2\\n",}}'
    (call,) = parse_tool_calls(text, TOOL_PARAMETERS)
    assert call.arguments == {"path": "a.py", "old_str": "    x = 1\n", "new_str": "    x = 2\n"}
