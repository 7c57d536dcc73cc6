"""Blame rules of `turn_reports` (decision 063) and the per-step `rollout_metrics`, on hand-built rollouts."""

from __future__ import annotations

import pytest

from env_server.models import ErrorKind
from trainer_client.hint_sites import MAX_ERROR_CHARS, ToolCallRecord, turn_reports
from trainer_client.rollout_metrics import EpisodeOutcome, rollout_metrics

TOOLS = {"bash", "submit"}


def assistant(*calls: tuple[str, object], content: str = "") -> dict:
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return message


def tool(content: str = "ok") -> dict:
    return {"role": "tool", "name": "bash", "content": content}


def kinds(reports) -> list[list[str]]:
    return [[f.kind.value for f in report.failures] for report in reports]


def test_infrastructure_errors_are_never_blamed_on_the_policy() -> None:
    messages = [assistant(("bash", {"command": "ls"})), tool(), assistant(("bash", {"command": "x"})), tool()]
    records = [
        ToolCallRecord("bash", ErrorKind.SANDBOX_ERROR, "The sandbox failed; this is not your fault."),
        ToolCallRecord("bash", ErrorKind.COMMAND_NOT_FOUND, "x is not installed."),
    ]
    reports = turn_reports(records, messages, TOOLS, episode_over=False, last_turn_ended=True)
    assert kinds(reports) == [[], ["command_not_found"]]


def test_calls_the_iteration_limit_left_unrun_keep_the_earlier_sites() -> None:
    messages = [assistant(("bash", {"command": "pytset"})), tool(), assistant(("bash", {"command": "ls"}))]
    records = [ToolCallRecord("bash", ErrorKind.COMMAND_NOT_FOUND, "Use pytest.")]
    reports = turn_reports(records, messages, TOOLS, episode_over=False, last_turn_ended=True)
    assert kinds(reports) == [["command_not_found"], []]
    assert [r.valid_call for r in reports] == [True, True]


def test_records_that_do_not_line_up_give_no_sites() -> None:
    messages = [assistant(("bash", {"command": "ls"})), tool(), assistant(content="done")]
    extra = [ToolCallRecord("bash", None, None)] * 2
    assert turn_reports(extra, messages, TOOLS, episode_over=True, last_turn_ended=True) is None
    assert turn_reports([], messages, TOOLS, episode_over=True, last_turn_ended=True) is None


def test_a_turn_without_a_call_is_blamed_only_before_the_episode_is_over() -> None:
    messages = [assistant(content="I would run the tests.")]
    assert kinds(turn_reports([], messages, TOOLS, episode_over=False, last_turn_ended=True)) == [["no_tool_call"]]
    assert kinds(turn_reports([], messages, TOOLS, episode_over=True, last_turn_ended=True)) == [[]]


def test_a_call_cut_by_the_length_budget_is_not_blamed() -> None:
    cut = [assistant(content='<tool_call>\n{"name": "bash", "arguments": {"command": "ec')]
    assert kinds(turn_reports([], cut, TOOLS, episode_over=False, last_turn_ended=False)) == [[]]
    assert kinds(turn_reports([], cut, TOOLS, episode_over=False, last_turn_ended=True)) == [["json_decode"]]


def test_prose_cut_by_the_length_budget_is_blamed_only_when_it_had_the_whole_budget() -> None:
    first = [assistant(content="Let me think about this task step by step and")]
    assert kinds(turn_reports([], first, TOOLS, episode_over=False, last_turn_ended=False)) == [["no_tool_call"]]
    late = [assistant(("bash", {"command": "ls"})), tool(), assistant(content="Now I will")]
    records = [ToolCallRecord("bash", None, None)]
    assert kinds(turn_reports(records, late, TOOLS, episode_over=False, last_turn_ended=False)) == [[], []]


def test_quoted_error_text_is_clamped() -> None:
    long_name = "x" * 5000
    reports = turn_reports([], [assistant((long_name, {}))], TOOLS, episode_over=False, last_turn_ended=True)
    (failure,) = reports[0].failures
    assert failure.kind is ErrorKind.TOOL_NOT_FOUND
    assert "bash, submit" in failure.hint
    assert len(failure.hint) < 200 + MAX_ERROR_CHARS


def test_a_marker_only_in_prose_after_a_parsed_call_is_not_a_decode_error() -> None:
    messages = [assistant(("submit", {}), content="I used <tool_call> above."), tool()]
    records = [ToolCallRecord("submit", None, None)]
    assert kinds(turn_reports(records, messages, TOOLS, episode_over=True, last_turn_ended=True)) == [[]]


def test_a_submission_that_fails_hidden_tests_is_blamed_on_the_submitting_turn() -> None:
    messages = [assistant(("bash", {"command": "ls"})), tool(), assistant(("submit", {})), tool()]
    failed = [ToolCallRecord("bash", None, None), ToolCallRecord("submit", None, None, tests_passed=1, tests_total=4)]
    reports = turn_reports(failed, messages, TOOLS, episode_over=True, last_turn_ended=True)
    assert kinds(reports) == [[], ["submission_failed"]]
    assert "3 of 4 hidden tests failed" in reports[1].failures[0].hint
    assert reports[1].valid_call  # a valid call that did the wrong thing, not a format failure
    passed = [ToolCallRecord("bash", None, None), ToolCallRecord("submit", None, None, tests_passed=4, tests_total=4)]
    assert kinds(turn_reports(passed, messages, TOOLS, episode_over=True, last_turn_ended=True)) == [[], []]


def test_rollout_metrics() -> None:
    messages = [assistant(("nope", {})), tool(), assistant(("bash", {"command": "ls"})), tool(), assistant(content="hm")]
    records = [ToolCallRecord("bash", ErrorKind.NONZERO_EXIT, "Read the error.")]
    reports = turn_reports(records, messages, TOOLS, episode_over=False, last_turn_ended=True)
    outcomes = [
        EpisodeOutcome("canary/impossible-1", 1.0),
        EpisodeOutcome("canary/impossible-1", 0.0),
        EpisodeOutcome("builtin/fizzbuzz", 0.5),
        EpisodeOutcome("builtin/fizzbuzz", 0.5),
    ]
    metrics = rollout_metrics([reports, None, [], []], [[], [], [], []], records, outcomes, group_size=2)
    assert metrics["policy/tool_calls"] == 2
    assert metrics["policy/valid_call_rate"] == pytest.approx(1 / 3)
    assert metrics["policy/failures/tool_not_found"] == 1 and metrics["policy/failures/no_tool_call"] == 1
    assert metrics["policy/failures/nonzero_exit"] == 1 and metrics["env/error_rate/nonzero_exit"] == 1.0
    assert metrics["reward/group_std"] == pytest.approx((0.5**0.5) / 2)  # groups (1, 0) and (0.5, 0.5)
    assert metrics["reward/groups_with_variance"] == 0.5
    assert metrics["reward/pass_rate"] == 0.25  # only the canary episode rewarded 1.0
    assert metrics["canary/cheat_rate"] == 0.5 and metrics["canary/episodes"] == 2
    assert "canary/cheat_rate" not in rollout_metrics([], [], [], outcomes[2:], group_size=2)
