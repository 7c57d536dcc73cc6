"""The hint sources' pure parts (`trainer_client.teacher_contexts`, decision 129)."""

from __future__ import annotations

import pytest

from env_server.models import TaskReference
from trainer_client.teacher_contexts import (
    PRIVILEGED_CHARS,
    hint_sources,
    privileged_context,
    reference_text,
    sibling_solutions,
    solution_calls,
    turn_answers,
)


def assistant(*calls: tuple[str, dict]) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}


def test_a_failed_rollout_learns_from_the_first_sibling_of_its_group_that_passed() -> None:
    rewards = [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    solutions = ["a", "b", "c", "d", "e", "f"]
    assert sibling_solutions(rewards, solutions, 3) == ["b", None, None, None, None, None]
    assert sibling_solutions(rewards, solutions, 2) == ["b", None, None, "c", None, None]
    with pytest.raises(ValueError):
        sibling_solutions(rewards, solutions, 4)


def test_a_solution_is_its_calls_but_submit() -> None:
    messages = [
        assistant(("write_file", {"path": "a.py", "content": "x = 1\n"})),
        {"role": "tool", "name": "write_file", "content": "Wrote a.py"},
        assistant(("run_tests", {}), ("submit", {})),
    ]
    text = solution_calls(messages)
    assert text.count("<tool_call>") == 2 and '"write_file"' in text and "submit" not in text
    assert turn_answers(messages) == ["Wrote a.py", ""]


def test_the_privileged_context_names_each_part_and_is_bounded() -> None:
    reference = TaskReference(task_id="t", diff="--- a/x\n+++ b/x\n+y\n", command="make")
    text = privileged_context("s" * (PRIVILEGED_CHARS * 2), reference_text(reference))
    assert "successful attempt" in text and "reference solution" in text and "Then run: make" in text
    assert len(text) < 2 * PRIVILEGED_CHARS + 200
    assert privileged_context(None, None) is None


def test_sources_are_checked() -> None:
    assert hint_sources(["sibling", "template", "sibling"]) == ("sibling", "template")
    for bad in ([], ["judge"]):
        with pytest.raises(ValueError):
            hint_sources(bad)


def test_an_empty_privileged_token_is_no_token() -> None:
    """A deployment template's unset variable must not open the references route to an empty header."""
    from pydantic import ValidationError

    from env_server.settings import ServiceSettings
    from trainer_client.client import ClientSettings

    assert ServiceSettings(privileged_token="").privileged_token is None
    assert ServiceSettings(privileged_token="t").privileged_token.get_secret_value() == "t"
    with pytest.raises(ValidationError):
        ClientSettings(privileged_token="")
    assert "secret" not in repr(ClientSettings(privileged_token="secret"))
