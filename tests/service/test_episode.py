"""Whole episodes through the real service and real sandboxes, over each transport; the episode
itself on each sandbox backend (Docker, and bubblewrap for hosts without Docker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from env_server.models import EpisodeRecord
from env_server.tasks import builtin
from tests.sandbox.support import BACKENDS
from tests.service.conftest import HttpSession
from tests.support.service import RunningService

FIZZBUZZ = builtin.BuiltinSuite().get("builtin/fizzbuzz")
SOLUTION = FIZZBUZZ.metadata["solution"]["solution.py"]


@pytest.mark.parametrize("sandbox_backend", BACKENDS)
def test_http_session_episode_solves_the_task_and_records_it(session: HttpSession, client: httpx.Client, service: RunningService) -> None:
    reset = session.reset(task_id="builtin/fizzbuzz")
    assert reset["observation"]["task_id"] == "builtin/fizzbuzz"
    assert "fizzbuzz" in reset["observation"]["prompt"]
    assert {t["function"]["name"] for t in reset["observation"]["tools"]} == {
        "bash", "read_file", "write_file", "edit_file", "list_dir", "search", "run_tests", "submit"
    }

    listing = session.step("bash", {"command": "ls"})
    assert listing["observation"]["error_kind"] is None
    assert "solution.py" in listing["observation"]["output"]
    assert "test_hidden" not in listing["observation"]["output"]

    assert session.step("write_file", {"path": "solution.py", "content": SOLUTION})["observation"]["error_kind"] is None
    tests = session.step("run_tests")
    assert tests["observation"]["error_kind"] is None, tests["observation"]["output"]

    final = session.step("submit")
    assert final["done"] is True
    assert final["reward"] == 1.0, final
    assert final["metadata"]["tests_passed"] == final["metadata"]["tests_total"] > 0
    assert final["metadata"]["failing_tests"] == []

    trajectory = EpisodeRecord.model_validate(client.get(f"/sessions/{session.id}/trajectory").json())
    assert [s.parsed_call["tool_name"] for s in trajectory.steps] == ["bash", "write_file", "run_tests", "submit"]
    assert trajectory.reward == 1.0
    logged = [json.loads(line) for line in (service.settings.trajectory_dir / "episodes.jsonl").read_text().splitlines()]
    assert any(r["episode_id"] == trajectory.episode_id and r["reward"] == 1.0 for r in logged)


@pytest.mark.parametrize("sandbox_backend", BACKENDS)
def test_raw_assistant_message_and_json_text_arguments_are_repaired(session: HttpSession, client: httpx.Client) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    message = (
        "Let me write the file.\n<tool_call>\n"
        '{"name": "write_file", "arguments": {"path": "note.txt", "content": "say "hi"\n",}}\n'
    )
    observation = session.act({"type": "assistant_message", "content": message})["observation"]
    assert observation["tool_name"] == "write_file" and observation["error_kind"] is None, observation
    # arguments as the model's JSON text, with a trailing comma and single quotes
    read = session.step("read_file", "{'path': 'note.txt',}")["observation"]
    assert read["output"] == 'say "hi"\n'
    steps = client.get(f"/sessions/{session.id}/trajectory").json()["steps"]
    assert steps[0]["action"]["type"] == "assistant_message"
    assert steps[0]["parsed_call"] == {"tool_name": "write_file", "arguments": {"path": "note.txt", "content": 'say "hi"\n'}}


@pytest.mark.parametrize("sandbox_backend", BACKENDS)
def test_step_limit_grades_automatically(session: HttpSession) -> None:
    task = builtin.BuiltinSuite().get("builtin/fizzbuzz").model_copy(update={"id": "inline/fizzbuzz-2-steps"})
    task = task.model_copy(update={"limits": task.limits.model_copy(update={"max_steps": 2})})
    assert session.reset(task=task.model_dump())["observation"]["max_steps"] == 2
    assert session.step("write_file", {"path": "solution.py", "content": SOLUTION})["done"] is False
    last = session.step("bash", {"command": "true"})
    assert last["done"] is True and last["reward"] == 1.0, last
    assert last["metadata"]["step_limit_reached"] is True


def test_plain_httpx_example_plays_a_full_episode(base_url: str) -> None:
    example = Path(__file__).parents[2] / "examples" / "http_episode.py"
    completed = subprocess.run([sys.executable, str(example), base_url], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "done: True reward: 1.0" in completed.stdout
