"""Each ingester on fixtures written from its format's documentation: states, counts, shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from trace_builders import FIXTURES

from trainer_client.records import TRACE_STATE_SCHEMA_VERSION, TraceState
from trainer_client.traces.cli import main
from trainer_client.traces.ingest import make_ingester
from trainer_client.traces.messages import REASONING_KEY


def ingest(format: str, path: Path) -> tuple[list[TraceState], dict]:
    ingester = make_ingester(format)
    states = list(ingester.iter_states(path))
    return states, ingester.counts.model_dump()


def roles(state: TraceState) -> list[str]:
    return [message["role"] for message in state.messages]


def calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def test_claude_code_turns_merge_blocks_strip_thinking_and_skip_subagents() -> None:
    states, counts = ingest("claude_code", FIXTURES / "claude_code")

    assert counts["files"] == 1  # the subagents/agent-*.jsonl file is not read
    assert counts["states"] == 3
    assert counts["skipped"] == 1  # the truncated line
    assert counts["unknown_types"] == {"x-future-record": 1}
    assert counts["ignored"] == {
        "subagent_file": 1,
        "file-history-snapshot": 1,
        "summary": 1,
        "system": 1,
        "sidechain": 1,
        "synthetic": 1,
    }

    first, second, third = states
    # Three records (thinking, text, tool_use) with one message.id are one turn.
    assert first.student_action["content"] == "I'll list the files."
    assert first.student_action[REASONING_KEY] == "The user wants a listing first."
    assert calls(first.student_action) == [("Bash", {"command": "ls", "description": "List files"})]
    assert first.source_model == "claude-sonnet-4-5-20250929"
    assert first.schema_version == TRACE_STATE_SCHEMA_VERSION
    assert roles(first) == ["system", "user"]

    # History: thinking stripped; tool_use -> tool call, tool_result -> tool message.
    assert roles(second) == ["system", "user", "assistant", "tool"]
    assert REASONING_KEY not in second.messages[2]
    assert second.messages[2]["tool_calls"][0]["id"] == "toolu_1"
    assert second.messages[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "README.md\nsrc"}
    assert calls(second.student_action) == [("Read", {"file_path": "/repo/README.md"})]

    # The chain runs through the unknown record; the sidechain reply is not in it.
    assert roles(third) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert third.messages[-1]["content"] == "# Demo\nA demo project."
    assert "subagent chatter" not in json.dumps(third.messages)
    assert third.student_action["content"] == "The README says this is a demo project."
    assert third.meta["trace_id"] == "5f0c8a4e-1d2b-4c3a-9e8f-0a1b2c3d4e5f"
    assert {tool["function"]["name"] for tool in third.meta["tools"]} == {"Bash", "Read"}
    assert len({state.state_id for state in states}) == 3


def test_claude_code_history_follows_parent_chain_not_file_order(tmp_path: Path) -> None:
    """A rewound conversation: the second prompt replaces the first branch."""
    def record(kind: str, uuid: str, parent: str | None, content: object, message_id: str | None = None) -> str:
        message = {"role": kind, "content": content}
        if message_id:
            message.update(id=message_id, model="claude-opus-4-1")
        return json.dumps({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s", "message": message})

    (tmp_path / "s.jsonl").write_text("\n".join([
        record("user", "u1", None, "first try"),
        record("assistant", "a1", "u1", [{"type": "text", "text": "abandoned answer"}], "m1"),
        record("user", "u2", None, "second try"),
        record("assistant", "a2", "u2", [{"type": "text", "text": "kept answer"}], "m2"),
    ]) + "\n")
    states, _ = ingest("claude_code", tmp_path / "s.jsonl")
    assert [s.messages[1]["content"] for s in states] == ["first try", "second try"]
    assert "abandoned answer" not in json.dumps(states[1].messages)


def test_claude_code_parallel_tool_calls_interleaved_with_results(tmp_path: Path) -> None:
    """Blocks of one response written around the results of its earlier calls stay one turn."""
    def record(kind: str, uuid: str, parent: str | None, block: dict, message_id: str = "") -> str:
        message: dict = {"role": kind, "content": [block]}
        if kind == "assistant":
            message.update(id=message_id, model="claude-opus-4-1")
        return json.dumps({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "p", "message": message})

    def use(call_id: str, path: str) -> dict:
        return {"type": "tool_use", "id": call_id, "name": "Read", "input": {"file_path": path}}

    def result(call_id: str, text: str) -> dict:
        return {"type": "tool_result", "tool_use_id": call_id, "content": text}

    (tmp_path / "p.jsonl").write_text("\n".join([
        json.dumps({"type": "user", "uuid": "u0", "parentUuid": None, "sessionId": "p",
                    "message": {"role": "user", "content": "read both"}}),
        record("assistant", "a1", "u0", use("t1", "a.py"), "mX"),
        record("user", "r1", "a1", result("t1", "A")),
        record("assistant", "a2", "r1", use("t2", "b.py"), "mX"),
        record("user", "r2", "a2", result("t2", "B")),
        record("assistant", "a3", "r2", {"type": "text", "text": "Both read."}, "mY"),
    ]) + "\n")
    states, _ = ingest("claude_code", tmp_path / "p.jsonl")
    parallel, final = states
    assert calls(parallel.student_action) == [("Read", {"file_path": "a.py"}), ("Read", {"file_path": "b.py"})]
    assert roles(final) == ["system", "user", "assistant", "tool", "tool"]
    assert [m.get("tool_call_id") for m in final.messages[3:]] == ["t1", "t2"]


def test_openhands_one_state_per_llm_response() -> None:
    states, counts = ingest("openhands", FIXTURES / "openhands")

    assert counts["files"] == 2
    assert counts["states"] == 5
    assert counts["skipped"] == 2  # a bare `42` event and a truncated JSONL row
    assert counts["unknown_types"] == {"ConversationStateEvent": 1}
    by_id = {state.state_id: state for state in states}

    # Two actions from one response (two tool calls) are one turn.
    first = by_id["openhands:trajectory:chatcmpl-1"]
    assert calls(first.student_action) == [
        ("execute_bash", {"command": "cat calc.py"}),
        ("execute_bash", {"command": "ls"}),
    ]
    assert first.messages[0]["content"].startswith("You are OpenHands agent")
    assert first.source_model == "claude-3-7-sonnet-20250219"
    second = by_id["openhands:trajectory:chatcmpl-2"]
    assert roles(second) == ["system", "user", "assistant", "tool", "tool"]
    assert [m.get("tool_call_id") for m in second.messages[3:]] == ["toolu_a", "toolu_b"]
    finish = by_id["openhands:trajectory:chatcmpl-3"]
    assert calls(finish.student_action) == [("finish", {"message": "Fixed add."})]

    # An evaluation row without tool_call_metadata (older, prompt-based agent).
    row_first = by_id["openhands:demo__calc-2:event-1"]
    assert row_first.source_model == "litellm_proxy/gpt-4o"
    assert calls(row_first.student_action) == [("run", {"command": "pytest -q"})]
    assert row_first.messages[0]["role"] == "system"  # synthetic: the row recorded none
    row_last = by_id["openhands:demo__calc-2:event-3"]
    assert row_last.messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "1 failed"}
    assert row_last.student_action["content"] == "The test fails because add subtracts."


def test_swe_smith_three_styles_become_tool_calls() -> None:
    states, counts = ingest("swe_smith", FIXTURES / "swe_smith")

    assert counts["states"] == 6
    assert counts["skipped"] == 2  # a line that is not JSON, a row whose messages are not a list
    by_style: dict[str, list[TraceState]] = {}
    for state in states:
        by_style.setdefault(state.meta["style"], []).append(state)
    assert {style: len(group) for style, group in by_style.items()} == {"tool": 2, "xml": 2, "ticks": 2}

    tool_first, tool_second = by_style["tool"]
    assert calls(tool_first.student_action) == [("bash", {"command": "ls /testbed"})]
    assert tool_first.messages[1]["content"].startswith("<uploaded_files>")  # block list flattened
    assert tool_second.messages[-1]["tool_call_id"] == "toolu_1"

    xml_first, xml_second = by_style["xml"]
    assert xml_first.student_action["content"] == "Let me look at the file."
    assert calls(xml_first.student_action) == [("str_replace_editor", {"command": "view", "path": "/testbed/calc.py"})]
    # The observation (a user message in the trace) answers the parsed call.
    assert xml_second.messages[-1]["role"] == "tool"
    assert xml_second.messages[-1]["tool_call_id"] == xml_second.messages[-2]["tool_calls"][0]["id"]
    assert calls(xml_second.student_action) == [("submit", {})]

    ticks_first, ticks_second = by_style["ticks"]  # `messages` was a JSON string
    assert calls(ticks_first.student_action) == [("bash", {"command": "cat /testbed/calc.py"})]
    assert ticks_second.source_model == "gpt-4o-2024-08-06"
    assert roles(ticks_second) == ["system", "user", "assistant", "tool"]
    assert {tool["function"]["name"] for tool in ticks_second.meta["tools"]} == {"bash"}


def test_coding_env_episode_records() -> None:
    states, counts = ingest("coding_env", FIXTURES / "coding_env")

    assert counts["states"] == 3
    assert counts["skipped"] == 2  # bad JSON, and a line that is not an EpisodeRecord
    assert counts["ignored"] == {"action:list_tools": 1}
    first, second, third = states
    assert first.messages[1] == {"role": "user", "content": "Implement has_close_elements in solution.py"}
    assert calls(first.student_action) == [("bash", {"command": "python solution.py"})]
    # Arguments recorded as a JSON string are kept verbatim; the tool output is the tool message.
    assert calls(second.student_action) == [("write_file", {"path": "solution.py", "content": "def f(): pass"})]
    assert second.messages[-1]["content"] == "bash: python: command not found"
    assert second.meta["previous_error_kind"] == "command_not_found"
    assert "logprobs" in second.meta
    assert third.meta["tools"][0]["function"]["name"] == "bash"
    assert [s.state_id for s in states] == ["coding_env:ep-1:1", "coding_env:ep-1:2", "coding_env:ep-1:3"]


def test_ingest_cli_writes_states_and_prints_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "states.jsonl"
    assert main(["ingest", "--format", "swe_smith", str(FIXTURES / "swe_smith"), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["states"] == 6 and printed["skipped"] == 2
    lines = out.read_text().splitlines()
    assert len(lines) == 6
    assert all(TraceState.model_validate_json(line).source == "swe_smith" for line in lines)

    assert main(["ingest", "--format", "openhands", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no trace file" in capsys.readouterr().err


def test_trace_state_of_an_unknown_schema_version_is_rejected() -> None:
    state = TraceState(state_id="s", messages=[], student_action={"role": "assistant", "content": "x"}, source="claude_code")
    assert TraceState.model_validate_json(state.model_dump_json()) == state
    with pytest.raises(ValidationError, match="schema_version"):
        TraceState.model_validate({**state.model_dump(), "schema_version": TRACE_STATE_SCHEMA_VERSION + 1})
