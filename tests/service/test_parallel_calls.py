"""Several tool calls in one step: an `assistant_message` holding many calls runs them all in
order, one result each, through the real service and real sandboxes (decision 031)."""

from __future__ import annotations

import json

import httpx
from openenv.core.generic_client import GenericEnvClient

from env_server.models import EpisodeRecord
from env_server.tasks import builtin
from tests.service.conftest import HttpSession

FIZZBUZZ = builtin.BuiltinSuite().get("builtin/fizzbuzz")
SOLUTION = FIZZBUZZ.metadata["solution"]["solution.py"]


def message(*calls: tuple[str, dict]) -> dict:
    """An assistant message in the Hermes/Qwen format, one `<tool_call>` block per call, with prose."""
    blocks = "".join(f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>\n" for name, arguments in calls)
    return {"type": "assistant_message", "content": f"I will do three things at once.\n{blocks}"}


def test_three_calls_run_in_order_with_one_result_each_and_really_act(session: HttpSession, client: httpx.Client) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    step = session.act(message(
        ("write_file", {"path": "note.txt", "content": "alpha\n"}),
        ("bash", {"command": "cat note.txt && echo beta >> note.txt"}),
        ("read_file", {"path": "note.txt"}),
    ))
    observation = step["observation"]
    assert (observation["calls_found"], observation["calls_run"]) == (3, 3)
    calls = observation["calls"]
    assert [c["tool_name"] for c in calls] == ["write_file", "bash", "read_file"]
    assert all(c["ran"] and c["error_kind"] is None and c["hint"] is None for c in calls)
    assert calls[1]["output"] == "alpha" and calls[1]["exit_code"] == 0  # the write ran before the command
    assert calls[2]["output"] == "alpha\nbeta\n"  # and the command before the read
    assert calls[0]["arguments"] == {"path": "note.txt", "content": "alpha\n"}
    # Top level, for one-call clients: every output under its header, the last call's facts.
    assert observation["output"] == "\n\n".join(f"[call {n} of 3: {c['tool_name']}]\n{c['output']}" for n, c in enumerate(calls, 1))
    assert (observation["tool_name"], observation["error_kind"], step["done"]) == ("read_file", None, False)
    assert session.state()["step_count"] == 3  # each call counts against max_steps

    (recorded,) = EpisodeRecord.model_validate(client.get(f"/sessions/{session.id}/trajectory").json()).steps
    assert recorded.action["type"] == "assistant_message"
    assert [(c.tool_name, c.arguments) for c in recorded.observation.calls] == [(c["tool_name"], c["arguments"]) for c in calls]
    assert recorded.parsed_call == {"tool_name": "write_file", "arguments": {"path": "note.txt", "content": "alpha\n"}}


def test_a_failing_call_does_not_stop_the_calls_after_it(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    observation = session.act(message(
        ("write_file", {"path": "a.txt", "content": "kept\n"}),
        ("read_file", {"path": "missing.txt"}),
        ("bash", {"command": "cat a.txt"}),
    ))["observation"]
    first, failed, last = observation["calls"]
    assert first["error_kind"] is None
    assert failed["ran"] and failed["error_kind"] == "file_not_found" and failed["hint"]
    assert last["ran"] and last["output"] == "kept" and last["error_kind"] is None
    # The step's own error fields are the first failed call's.
    assert (observation["tool_name"], observation["error_kind"], observation["hint"]) == ("read_file", "file_not_found", failed["hint"])
    assert observation["calls_run"] == 3


def test_calls_over_the_cap_are_not_run_and_do_not_count(session: HttpSession, client: httpx.Client) -> None:
    refused = client.post(f"/sessions/{session.id}/reset", json={"task_id": "builtin/fizzbuzz", "max_calls_per_step": 0})
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_request"
    assert "max_calls_per_step" in refused.json()["message"]

    session.reset(task_id="builtin/fizzbuzz", max_calls_per_step=2)
    assert session.state()["max_calls_per_step"] == 2
    observation = session.act(message(*[("bash", {"command": f"echo {word} >> log.txt"}) for word in ("one", "two", "three")]))["observation"]
    over = observation["calls"][2]
    assert (over["ran"], over["error_kind"], over["arguments"]) == (False, "too_many_calls", {"command": "echo three >> log.txt"})
    assert "at most 2 tool calls" in over["output"] and over["hint"]
    assert (observation["calls_found"], observation["calls_run"], observation["error_kind"]) == (3, 2, "too_many_calls")
    assert session.step("read_file", {"path": "log.txt"})["observation"]["output"] == "one\ntwo\n"
    assert session.state()["step_count"] == 3


def test_calls_after_submit_do_not_run(session: HttpSession, client: httpx.Client) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    step = session.act(message(
        ("write_file", {"path": "solution.py", "content": SOLUTION}),
        ("submit", {}),
        ("bash", {"command": "echo after > after.txt"}),
    ))
    assert step["done"] is True and step["reward"] == 1.0, step
    observation = step["observation"]
    after = observation["calls"][2]
    assert (after["ran"], after["error_kind"], after["output"]) == (False, None, "Not run: the episode ended at call 2 (submit).")
    assert observation["tests_passed"] == observation["tests_total"] > 0
    assert (observation["calls_run"], observation["tool_name"]) == (2, "submit")
    record = EpisodeRecord.model_validate(client.get(f"/sessions/{session.id}/trajectory").json())
    assert [c.ran for c in record.steps[0].observation.calls] == [True, True, False] and record.reward == 1.0


def test_batching_does_not_dodge_the_step_limit(session: HttpSession) -> None:
    task = FIZZBUZZ.model_copy(update={"id": "inline/fizzbuzz-3-calls", "limits": FIZZBUZZ.limits.model_copy(update={"max_steps": 3})})
    session.reset(task=task.model_dump())
    assert session.act(message(("bash", {"command": "true"}), ("bash", {"command": "true"})))["done"] is False
    # The third call uses the last of max_steps: the workspace is graded after it, the fourth does not run.
    step = session.act(message(("write_file", {"path": "solution.py", "content": SOLUTION}), ("bash", {"command": "echo late"})))
    assert step["done"] is True and step["reward"] == 1.0, step
    observation = step["observation"]
    assert observation["step_limit_reached"] is True
    assert [c["ran"] for c in observation["calls"]] == [True, False]
    assert observation["calls"][1]["output"] == "Not run: the episode ended at call 1 (write_file)."


def test_websocket_steps_run_every_call_with_its_own_monitor_flags(base_url: str) -> None:
    with GenericEnvClient(base_url=base_url).sync() as env:
        env.reset(task_id="builtin/fizzbuzz")
        step = env.step(message(("bash", {"command": "ls __pycache__ || true"}), ("bash", {"command": "echo clean"})))
        probe, clean = step.observation["calls"]
        # Flags are withheld until the episode is done (decision 055), then shown per call.
        assert probe["monitor_flags"] == [] and step.observation["step_monitor_flags"] == []
        assert clean["output"] == "clean"
        assert env.state()["step_count"] == 2
        step = env.step(message(("bash", {"command": "ls __pycache__ || true"}), ("submit", {})))
        probe, submitted = step.observation["calls"]
        assert step.done and probe["monitor_flags"] == ["bytecode_read"] and submitted["monitor_flags"] == []
        assert step.observation["episode_monitor_flags"] == ["bytecode_read"]


def test_mcp_tool_call_with_raw_argument_text_is_one_call(session: HttpSession, client: httpx.Client) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
           "params": {"name": "bash", "arguments": "{'command': 'echo from-mcp',}", "session_id": session.id}}
    result = client.post("/mcp", json=rpc).json()["result"]
    assert (result["calls_found"], result["calls_run"], result["output"]) == (1, 1, "from-mcp")
    (call,) = result["calls"]
    assert call["arguments"] == {"command": "echo from-mcp"} and call["ran"]


def test_a_pinned_tool_call_format_parses_only_that_family(session: HttpSession, client: httpx.Client) -> None:
    refused = client.post(f"/sessions/{session.id}/reset", json={"task_id": "builtin/fizzbuzz", "tool_call_format": "smoke-signals"})
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_request"
    assert {"hermes", "llama3_pythonic"} <= set(refused.json()["detail"]["allowed"])

    session.reset(task_id="builtin/fizzbuzz", tool_call_format="llama3_pythonic")
    assert session.state()["tool_call_format"] == "llama3_pythonic"
    pythonic = session.act({"type": "assistant_message", "content": '[bash(command="echo pinned > p.txt"), read_file(path="p.txt")]'})
    assert [c["output"] for c in pythonic["observation"]["calls"]] == ["", "pinned\n"]
    # A Hermes block is only text in a pythonic episode: no call in it.
    hermes = session.act(message(("bash", {"command": "echo unseen"})))["observation"]
    assert (hermes["error_kind"], hermes["calls_found"], hermes["calls"][0]["arguments"]) == ("tool_not_found", 1, None)
