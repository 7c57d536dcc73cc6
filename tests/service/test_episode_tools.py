"""An episode's tool set (`reset {"tools": [...]}`): what the policy is offered and may call, through
the real service with real sandboxes and through the trainer's client and TRL environment."""

from __future__ import annotations

import httpx

from tests.service.conftest import HttpSession
from tests.service.test_fork import fork
from trainer_client.client import ClientSettings
from trainer_client.environment import environment_factory
from trainer_client.trl_rollout import environment_methods

OFFERED = ["read_file", "write_file", "submit"]


def names(schemas: list[dict]) -> list[str]:
    return [schema.get("function", schema)["name"] for schema in schemas]


def test_a_reset_with_tools_offers_only_those_and_submit(session: HttpSession) -> None:
    observation = session.reset(task_id="builtin/fizzbuzz", tools=["write_file", "read_file"])["observation"]
    assert names(observation["tools"]) == OFFERED  # the service's order; submit always added
    assert "Work only by calling the tools: read_file, write_file, submit." in observation["prompt"]
    assert "bash" not in observation["prompt"].split("Work only by calling")[1]
    assert session.state()["tools"] == OFFERED
    listed = session.act({"type": "list_tools"})["observation"]["tools"]
    assert [tool["name"] for tool in listed] == OFFERED


def test_a_tool_outside_the_set_is_not_run_and_names_the_episodes_tools(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz", tools=["read_file", "write_file"])
    refused = session.step("bash", {"command": "echo pwned > proof.txt"})["observation"]
    assert refused["error_kind"] == "tool_not_found"
    assert "read_file, write_file, submit" in refused["output"] and "read_file, write_file, submit" in refused["hint"]
    assert session.step("read_file", {"path": "proof.txt"})["observation"]["error_kind"] == "file_not_found"
    # A message's calls are held to the same set.
    message = '<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>'
    assert session.act({"type": "assistant_message", "content": message})["observation"]["error_kind"] == "tool_not_found"
    assert session.step("write_file", {"path": "note.txt", "content": "ok\n"})["observation"]["error_kind"] is None
    graded = session.step("submit")
    assert graded["done"] and graded["reward"] is not None


def test_unknown_tool_names_are_refused_and_every_tool_is_the_default(session: HttpSession, client: httpx.Client) -> None:
    refused = client.post(f"/sessions/{session.id}/reset", json={"task_id": "builtin/fizzbuzz", "tools": ["bash", "teleport"]})
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_request"
    assert "teleport" in refused.json()["message"]
    empty = client.post(f"/sessions/{session.id}/reset", json={"task_id": "builtin/fizzbuzz", "tools": []})
    assert empty.status_code == 422
    every = names(session.reset(task_id="builtin/fizzbuzz")["observation"]["tools"])
    assert {"bash", "run_tests", "list_dir", "submit"} <= set(every)
    assert session.step("bash", {"command": "true"})["observation"]["error_kind"] is None


def test_forks_keep_the_episodes_tools(session: HttpSession, client: httpx.Client) -> None:
    session.reset(task_id="builtin/fizzbuzz", tools=["bash"])
    (forked,) = fork(client, session.id, 1)
    try:
        assert forked.state()["tools"] == ["bash", "submit"]
        assert forked.step("read_file", {"path": "solution.py"})["observation"]["error_kind"] == "tool_not_found"
    finally:
        forked.close()


def test_the_trl_environment_offers_the_settings_tools(base_url: str) -> None:
    settings = ClientSettings(base_url=base_url, tools=["write_file", "bash"])
    assert settings.tools == ["write_file", "bash", "submit"]
    environment = environment_factory(settings)()
    try:
        assert sorted(method.__name__ for method in environment_methods(environment)) == ["bash", "submit", "write_file"]
        prompt = environment.reset(task_id="builtin/fizzbuzz")
        assert prompt.endswith(
            "Work only by calling the tools: bash, write_file, submit. "
            "Call submit when you are done: it ends the episode and grades your work with hidden tests."
        )
    finally:
        environment._close()
