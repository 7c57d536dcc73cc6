"""One parser per family: hand-written cases (the tuning set; the held-out corpus is separate)."""

from __future__ import annotations

import pytest

from env_server.tool_call_parser import TOOL_CALL_FAMILIES, ParsedCall, ToolCallBudgetError, ToolCallParseError, parse_arguments, parse_tool_calls
from env_server.tool_calls import budget

PARAMS = {"bash": ["command"], "read_file": ["path"], "write_file": ["path", "content"], "get_weather": ["city", "unit"]}
LS = ParsedCall("bash", {"command": "ls"})
WEATHER = ParsedCall("get_weather", {"city": "Paris", "unit": "celsius"})

CASES: dict[str, tuple[str, list[ParsedCall]]] = {
    "hermes": ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', [LS]),
    "qwen3_coder": ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>", [LS]),
    "function_tag_json": ('<function=bash>{"command": "ls"}</function>', [LS]),
    "llama3_json": ('<|python_tag|>{"name": "bash", "parameters": {"command": "ls"}}<|eom_id|>', [LS]),
    "llama3_pythonic": ('[bash(command="ls"), get_weather(city="Paris", unit="celsius")]', [LS, WEATHER]),
    "mistral": ('[TOOL_CALLS]bash[ARGS]{"command": "ls"}[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}</s>', [LS, WEATHER]),
    "deepseek": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{\"command\": \"ls\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        [LS],
    ),
    "kimi_k2": (
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|>',
        [LS],
    ),
    "glm45": ("<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>", [LS]),
    "harmony": ('<|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"command": "ls"}<|call|>', [LS]),
    "gemma": ("```tool_code\nprint(default_api.bash(command='ls'))\n```", [LS]),
    "claude_xml": ('<function_calls>\n<invoke name="bash">\n<parameter name="command">ls</parameter>\n</invoke>\n</function_calls>', [LS]),
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="bash">\n<parameter name="command">ls</parameter>\n</invoke>\n</minimax:tool_call>', [LS]),
    "granite": ('<|tool_call|>[{"name": "bash", "arguments": {"command": "ls"}}]', [LS]),
    "nemotron": ('<TOOLCALL>[{"name": "bash", "arguments": {"command": "ls"}}]</TOOLCALL>', [LS]),
    "phi4": ('functools[{"name": "bash", "arguments": {"command": "ls"}}]', [LS]),
    "xlam": ('[{"name": "bash", "arguments": {"command": "ls"}}, {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]', [LS, WEATHER]),
    "command_r": ('Plan: list.\nAction: ```json\n[\n    {"tool_name": "bash", "parameters": {"command": "ls"}}\n]\n```', [LS]),
    "react": ('Thought: list the files\nAction: bash\nAction Input: {"command": "ls"}\nObservation:', [LS]),
    "tool_calls_tag": ('<tool_calls>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_calls>', [LS]),
    "fenced_json": ('Running:\n```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```', [LS]),
    "bare_json": ('I will run {"name": "bash", "arguments": {"command": "ls"}} now.', [LS]),
}


def test_every_registered_family_has_a_case() -> None:
    assert set(CASES) == set(TOOL_CALL_FAMILIES)


@pytest.mark.parametrize("family", sorted(CASES))
def test_family_is_detected(family: str) -> None:
    text, expected = CASES[family]
    assert parse_tool_calls(text, PARAMS) == expected


@pytest.mark.parametrize("family", sorted(CASES))
def test_family_parses_when_pinned(family: str) -> None:
    text, expected = CASES[family]
    assert parse_tool_calls(text, PARAMS, family=family) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Variants of a family's format.
        ('<tool_call>\n```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```\n</tool_call>', [LS]),
        ('<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "s = \\"</tool_call>\\"\\n"}}</tool_call>',
         [ParsedCall("write_file", {"path": "a.py", "content": 's = "</tool_call>"\n'})]),
        ("<function=write_file>\n<parameter=path>\na.xml\n</parameter>\n<parameter=content>\n<a></parameter></a>\n</parameter>\n</function>",
         [ParsedCall("write_file", {"path": "a.xml", "content": "<a></parameter></a>"})]),
        ('{"name": "bash", "parameters": {"command": "ls"}}; {"name": "bash", "parameters": {"command": "pwd"}}',
         [LS, ParsedCall("bash", {"command": "pwd"})]),
        ('<|python_tag|>brave_search.call(query="weather in Paris")', [ParsedCall("brave_search", {"query": "weather in Paris"})]),
        ("<|python_start|>[bash(command='ls')]<|python_end|>", [LS]),
        ('[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "abc123def"}]</s>', [LS]),
        ('[TOOL_CALLS]bash[CALL_ID]a1b2c3d4e[ARGS]{"command": "ls"}', [LS]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', [LS]),
        ('<|tool▁calls▁begin|><|tool▁call▁begin|>bash<|tool▁sep|>{"command": "ls"}<|tool▁call▁end|><|tool▁calls▁end|>', [LS]),
        ('<|tool_call_begin|>bash:3<|tool_call_argument_begin|>{"command": "ls"}<|tool_call_end|>', [LS]),
        ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>", [WEATHER]),
        ('<|start|>assistant to=functions.bash<|channel|>commentary json<|message|>{"command": "ls"}<|call|>', [LS]),
        ("```tool_code\nbash(command='ls')\nget_weather(city='Paris', unit='celsius')\n```", [LS, WEATHER]),
        ('<|tool_call|>[{"name": "bash", "arguments": {"command": "ls"}}]<|/tool_call|>', [LS]),
        ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "bash", "parameters": {"command": "ls"}}]<|END_ACTION|>', [LS]),
        ('{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}', [LS]),
        ("Thought: list\nAction: bash\nAction Input: ls -la\nObservation:", [ParsedCall("bash", {"command": "ls -la"})]),
        ('Action: bash\n\nAction Input: "ls -la"\n', [ParsedCall("bash", {"command": "ls -la"})]),
        ('{"type": "function", "name": "bash", "parameters": {"command": "ls"}}', [LS]),
        ("<function=write_file>\n<parameter=path>\na.py\n<parameter=content>\nx = 1\n</function>",
         [ParsedCall("write_file", {"path": "a.py", "content": "x = 1"})]),
        ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', [LS]),
        ("```tool_code\nget_weather('Paris', unit=true)\n```", [ParsedCall("get_weather", {"city": "Paris", "unit": True})]),
        ('<tool_call>{"name":"bash","arguments":{"command":"ls"}}</tool_call>', [LS]),
    ],
)
def test_family_variants(text: str, expected: list[ParsedCall]) -> None:
    assert parse_tool_calls(text, PARAMS) == expected


@pytest.mark.parametrize(
    "text",
    [
        '<think>\nMaybe <tool_call>{"name": "bash", "arguments": {"command": "rm -rf /"}}</tool_call>?\n</think>\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
        'I could run [bash(command="rm -rf /")]...\n</think>\n\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
        '◁think▷[TOOL_CALLS]bash[ARGS]{"command": "rm -rf /"}◁/think▷[TOOL_CALLS]bash[ARGS]{"command": "ls"}',
        '[THINK]<tool_call>{"name": "bash", "arguments": {"command": "rm -rf /"}}</tool_call>[/THINK][TOOL_CALLS]bash[ARGS]{"command": "ls"}',
        "<|channel|>analysis<|message|>Call bash with rm? No.<|end|><|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{\"command\": \"ls\"}<|call|>",
    ],
)
def test_a_call_inside_reasoning_is_not_a_call(text: str) -> None:
    assert parse_tool_calls(text, PARAMS) == [LS]


@pytest.mark.parametrize(
    "text",
    [
        "See [1] and [the docs](http://x).",
        "Try this:\n[f(x) for x in y]\nIt is shorter.",
        "Action: none needed.\nThe answer is 4.",
        "```python\nprint({'a': 1})\n```",
    ],
)
def test_prose_holds_no_call(text: str) -> None:
    assert parse_tool_calls(text, PARAMS) == []


def test_an_unclosed_reasoning_block_holds_no_call() -> None:
    assert parse_tool_calls('<think>I will <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', PARAMS) == []


def test_a_pinned_family_ignores_other_formats() -> None:
    hermes = CASES["hermes"][0]
    assert parse_tool_calls(hermes, PARAMS, family="mistral") == []
    assert parse_tool_calls(CASES["xlam"][0] + "\n" + hermes, PARAMS, family="hermes") == [LS]


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hermes") as raised:
        parse_tool_calls("hi", family="gpt5")
    assert not isinstance(raised.value, ToolCallParseError)


@pytest.mark.parametrize(
    "text",
    ["[TOOL_CALLS] I cannot", "<TOOLCALL>not json</TOOLCALL>", "<|tool_calls_section_begin|>oops", "```tool_code\nimport os\n```"],
)
def test_an_announced_call_with_nothing_usable_raises(text: str) -> None:
    with pytest.raises(ToolCallParseError):
        parse_tool_calls(text, PARAMS)


@pytest.mark.parametrize(
    ("text", "params", "expected"),
    [
        ('{"command": "ls"}', None, {"command": "ls"}),
        ('{"command": "ls",}', None, {"command": "ls"}),
        ("{'command': 'ls', 'quiet': True}", None, {"command": "ls", "quiet": True}),
        ('command="ls", timeout=5', None, {"command": "ls", "timeout": 5}),
        ("(path='a.py')", None, {"path": "a.py"}),
        ('[ARGS]{"path": "a.py"}', None, {"path": "a.py"}),
        ("", None, {}),
        ('{"path": "a.py", "content": "print("hi")\n"}', ["path", "content"], {"path": "a.py", "content": 'print("hi")\n'}),
        ("just words", None, None),
        ("[1, 2]", None, None),
    ],
)
def test_parse_arguments(text: str, params: list[str] | None, expected: dict | None) -> None:
    assert parse_arguments(text, params) == expected


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + '{"a":' * 5000 + "1" + "}" * 5000,
        '{"name": ' * 10000,
        "[bash(command=" + "[" * 5000 + "]" * 5000 + ")]",
        "[TOOL_CALLS]" * 5000,
    ],
    ids=["deep-json", "repeated-keys", "deep-python", "many-markers"],
)
def test_hostile_messages_fail_cleanly(text: str) -> None:
    """A policy's message cannot crash the parser: a call, none, or the typed parse error."""
    try:
        calls = parse_tool_calls(text, PARAMS)
    except ToolCallParseError:
        return
    assert len(calls) <= 64


# Adversarial messages: every one is read in one forward pass, and the calls it does hold come out.
BIG = 1024 * 1024
HERMES_LS = CASES["hermes"][0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Unclosed openers and partial tags by the hundred thousand, then a real call.
        ("<function=bash" * (BIG // 14) + "\n" + HERMES_LS, [LS]),
        ("<tool_call>{" * (BIG // 12) + "\n" + CASES["qwen3_coder"][0], [LS]),
        ('<invoke name="bash' * (BIG // 18) + CASES["claude_xml"][0], [LS]),
        ("<|tool_call_begin|>" + " " * BIG + "x" + CASES["kimi_k2"][0], [LS]),
        ("to=" * (BIG // 3) + CASES["harmony"][0], [LS]),
        ("\n" * BIG + CASES["llama3_pythonic"][0], [LS, WEATHER]),
        ("<|channel|>analysis" * (BIG // 19) + "\n" + HERMES_LS, [LS]),
        ("</think>" * (BIG // 8) + HERMES_LS, [LS]),
        # Whitespace runs where the tagged formats allow whitespace.
        ("<tool_call>bash<arg_key>command</arg_key>" + " " * BIG + "<arg_value>ls</arg_value>" + " " * BIG + "</tool_call>", [LS]),
        ("<function=bash>\n<parameter=command>\nls\n</parameter>" + " " * BIG + "</function>", [LS]),
        # One huge argument, read exactly.
        ('<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "' + "x" * (4 * BIG) + '"}}</tool_call>',
         [ParsedCall("write_file", {"path": "a.py", "content": "x" * (4 * BIG)})]),
        # Past the lenient readers' budget: unescaped quotes in a large file are cut out at the parameter names.
        ('<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "' + 'print("hi")\n' * (BIG // 12) + '"}}</tool_call>',
         [ParsedCall("write_file", {"path": "a.py", "content": 'print("hi")\n' * (BIG // 12)})]),
    ],
    ids=["unclosed-function", "unclosed-tool-call", "unclosed-invoke", "kimi-whitespace", "harmony-to", "blank-lines",
         "analysis-channels", "lone-closers", "glm-whitespace", "qwen-whitespace", "huge-argument", "huge-unescaped"],
)
def test_adversarial_messages_keep_their_calls(text: str, expected: list[ParsedCall]) -> None:
    assert parse_tool_calls(text, PARAMS) == expected


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "bash", "arguments": {"command": "' * (BIG // 56),
        "[TOOL_CALLS]" + "[" * BIG,
        '<|tool_call|>[{"a":' * (BIG // 19),
        "functools[" * (BIG // 10),
        "[bash(command=" * (BIG // 14),
        "Action: bash\nAction Input: " * (BIG // 27),
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{" * (BIG // 40),
        '{"name": "bash", "arguments": {"command": "ls"}}\n' * (BIG // 50),
        # json-repair takes seconds on 8 KiB of this: its watchdog stops it.
        "<tool_call>" + '{"' * 8192,
    ],
    ids=["hermes-openers", "mistral-brackets", "granite-objects", "phi4-openers", "pythonic-openers", "react-openers",
         "deepseek-openers", "many-calls", "repair-super-linear"],
)
def test_adversarial_messages_end_in_a_bounded_typed_result(text: str) -> None:
    """At most 64 well-formed calls, none, or the typed parse error."""
    try:
        calls = parse_tool_calls(text, PARAMS)
    except ToolCallParseError:
        return
    assert len(calls) <= 64
    assert all(isinstance(call.arguments, dict) for call in calls)


def test_a_message_over_the_size_budget_is_refused_with_the_typed_error() -> None:
    with pytest.raises(ToolCallBudgetError, match="characters"):
        parse_tool_calls("x" * (budget.MAX_MESSAGE_CHARS + 1), PARAMS)


def test_a_message_over_the_time_budget_ends_with_the_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget, "PARSE_SECONDS", 0.0)
    with pytest.raises(ToolCallBudgetError, match="parsing stopped"):
        parse_tool_calls(HERMES_LS, PARAMS)
