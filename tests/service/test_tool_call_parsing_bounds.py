"""A pathological assistant message costs its own session a bounded parse and nobody else anything
(decision 037): through the real service on 127.0.0.1, while one session sends a message of
nearly the body limit built to make a backtracking parser go quadratic, `/health` and another
session keep answering, and the big step returns a typed observation."""

from __future__ import annotations

import threading

import httpx
import pytest

from env_server.tool_calls import budget
from tests.service.conftest import HttpSession

# Unclosed `<function=NAME` openers with no `>`: a pattern with an unbounded name scanned to the
# end of the message from every one of them (quadratic), holding the GIL throughout.
PATHOLOGICAL = "<function=bash" * (3 * 1024 * 1024 // 14)
CALL = '<tool_call>{"name": "bash", "arguments": {"command": "echo still-parsed"}}</tool_call>'


def _health_during(client: httpx.Client, step: threading.Thread, started: threading.Event) -> list[int]:
    """Status codes of `/health` requests sent after the big step was sent and answered before it finished."""
    answered: list[int] = []
    started.wait()
    while step.is_alive():
        status = client.get("/health").status_code
        if step.is_alive():
            answered.append(status)
    return answered


def test_health_and_other_sessions_answer_while_one_session_parses_a_pathological_message(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as big_client, httpx.Client(base_url=base_url, timeout=120) as other_client:
        big, other = HttpSession(big_client), HttpSession(other_client)
        try:
            big.reset(task_id="builtin/fizzbuzz")
            other.reset(task_id="builtin/fizzbuzz")
            started, result = threading.Event(), {}

            def send_big() -> None:
                started.set()
                result["step"] = big.act({"type": "assistant_message", "content": PATHOLOGICAL + "\n" + CALL})

            step = threading.Thread(target=send_big)
            step.start()
            answered = _health_during(other_client, step, started)
            other_step = other.step("bash", {"command": "echo other"})["observation"]
            step.join()
        finally:
            big.close()
            other.close()
    assert answered and set(answered) == {200}, "no /health reply arrived while the big step was in flight"
    assert other_step["error_kind"] is None and other_step["output"].strip() == "other"
    observation = result["step"]["observation"]
    # The call after the pathological text is still found and run.
    assert observation["calls_found"] == 1 and observation["error_kind"] is None, observation["output"][:300]
    assert observation["output"].strip() == "still-parsed"


def test_a_parse_over_its_time_budget_is_a_typed_observation_and_the_session_goes_on(
    session: HttpSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    with monkeypatch.context() as patch:
        patch.setattr(budget, "PARSE_SECONDS", 0.0)  # the in-process server reads it per message
        observation = session.act({"type": "assistant_message", "content": PATHOLOGICAL + "\n" + CALL})["observation"]
    assert observation["error_kind"] == "json_decode"
    assert "parsing stopped" in observation["output"] and "Hint:" in observation["output"]
    after = session.act({"type": "assistant_message", "content": CALL})["observation"]
    assert after["error_kind"] is None and after["output"].strip() == "still-parsed"
