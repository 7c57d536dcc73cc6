"""Every episode ends, grading never answers 5xx, and `reward: null` is the infrastructure's alone.

What the agent does to its own sandbox or workspace (breaking grading, killing processes,
filling memory or disk) ends the episode with reward 0; only a grading sandbox that cannot be
started or an engine that does not answer aborts it (docs/decisions/024-who-ends-an-episode.md).
"""

from __future__ import annotations

from collections.abc import Callable

import docker
import httpx
import pytest

from env_server.environment import CodingEnvironment
from env_server.episode import prompt_footer
from env_server.grading.grader import GRADE_COMMAND
from env_server.hints import HintGenerator
from env_server.openenv_models import ACTIONS, AnyAction
from env_server.settings import HintSettings
from env_server.tools import TOOLS
from sandbox import Sandbox, SandboxSpec, open_sandbox
from tests.sandbox.support import BACKENDS
from tests.service.conftest import HttpSession, containers_of
from tests.support.service import SharedServices, builtin_registry

ADD_TASK = {
    "id": "inline/add",
    "prompt": "Implement add(a, b) in solution.py.",
    "files": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {"test_hidden_add.py": "from solution import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"},
    "grade_command": GRADE_COMMAND,
}
ADD_SOLUTION = "def add(a, b):\n    return a + b\n"

BREAK_GRADING = {
    "unreadable file": "chmod 000 solution.py",
    "folder where a hidden test goes": "mkdir -p test_hidden_add.py/inner",
    "1,200 nested folders": "p=.; for i in $(seq 1200); do p=$p/d; done; mkdir -p $p",
}


def _task(max_steps: int = 30) -> dict:
    return {**ADD_TASK, "limits": {"max_steps": max_steps}}


def _bash(session: HttpSession, command: str, timeout_s: float | None = None) -> dict:
    return session.step("bash", {"command": command, **({"timeout_s": timeout_s} if timeout_s else {})})


def _assert_over_on_the_agent(session: HttpSession, final: dict, reward: set[float] = frozenset({0.0})) -> None:
    """The episode ended with a reward in `reward` (never null), and the session refuses further steps."""
    assert final["done"] is True
    assert final["reward"] in reward, final
    assert final["metadata"].get("aborted") is not True
    if final["observation"]["error_kind"] == "grading_error":
        assert final["reward"] == 0.0 and final["metadata"]["reason"]
    refused = session.client.post(f"/sessions/{session.id}/step", json={"action": {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "true"}}})
    assert refused.status_code == 409 and refused.json()["code"] == "episode_done"
    assert session.state()["done"] is True and session.state()["reward"] == final["reward"]


@pytest.mark.parametrize("command", BREAK_GRADING.values(), ids=BREAK_GRADING.keys())
def test_a_workspace_that_breaks_grading_ends_the_episode_with_reward_0(session: HttpSession, command: str) -> None:
    session.reset(task=_task())
    session.step("write_file", {"path": "solution.py", "content": ADD_SOLUTION})
    assert _bash(session, command)["done"] is False
    final = session.step("submit")
    # The grader either copes with the workspace (the solution is graded: 1.0) or scores it 0
    # as a grading error; it never answers 5xx, never leaves the episode open, never aborts it.
    _assert_over_on_the_agent(session, final, reward={0.0, 1.0})
    assert final["observation"]["error_kind"] in (None, "grading_error")
    assert "test_hidden" not in final["observation"]["output"]  # no hidden test names leak through an error


@pytest.mark.parametrize("protocol", [1, 2])
def test_only_protocol_1_repeats_typed_fields_in_metadata(session: HttpSession, protocol: int) -> None:
    """Decision 121: protocol 2 keeps `metadata` to what has no typed field; protocol 1, the default
    for one release, also repeats typed fields there under their old keys."""
    session.reset(task=_task(max_steps=2), **({"protocol": protocol} if protocol != 1 else {}))
    _bash(session, "true")
    last = _bash(session, "true")
    assert last["observation"]["step_limit_reached"] is True and last["observation"]["tests_total"] == 1
    copies = {"tests_passed", "tests_total", "monitor_flags", "step_limit_reached"}
    assert set(last["metadata"]) == {"failing_tests", "grading_ms", *(copies if protocol == 1 else ())}
    assert last["observation"]["metadata"] == last["metadata"]


@pytest.mark.parametrize("command", BREAK_GRADING.values(), ids=BREAK_GRADING.keys())
def test_the_step_limit_always_ends_the_episode(session: HttpSession, command: str) -> None:
    assert session.reset(task=_task(max_steps=2))["observation"]["max_steps"] == 2
    assert _bash(session, command)["done"] is False
    last = _bash(session, "true")
    assert last["metadata"]["step_limit_reached"] is True
    _assert_over_on_the_agent(session, last)
    assert session.state()["step_count"] == 2


AGENT_SABOTAGE = {
    "kill every process it can": "kill -9 -1",
    "fork bomb": "f() { f | f & }; f",
    "fill memory": "python3 -c 'x = bytearray(4 << 30)'",
    "fill disk": "head -c 20G /dev/zero > fill.bin; rm -f fill.bin",
}


@pytest.mark.parametrize("command", AGENT_SABOTAGE.values(), ids=AGENT_SABOTAGE.keys())
@pytest.mark.parametrize("sandbox_backend", BACKENDS)
def test_what_the_agent_does_to_its_sandbox_scores_0_never_null(services: SharedServices, sandbox_backend: str, command: str) -> None:
    # 256 MB of memory: the default workspace tmpfs (256 MB) alone can fill it.
    service = services.get(pool_size=1, grading_pool_size=1, sandbox_backend=sandbox_backend, sandbox={"memory_mb": 256, "pids": 64})
    with httpx.Client(base_url=service.url, timeout=300) as client:
        session = HttpSession(client)
        session.reset(task=_task())
        result = _bash(session, command, timeout_s=10)
        if not result["done"]:  # the sandbox survived: the episode goes on and is graded as usual
            assert result["observation"]["error_kind"] != "sandbox_error", result["observation"]
            result = session.step("submit")
        _assert_over_on_the_agent(session, result)
        session.close()


def test_a_sandbox_killed_under_the_episode_is_charged_to_the_episode(session: HttpSession, docker_client: docker.DockerClient) -> None:
    # From the service's side a container killed from outside looks the same as one the agent
    # brought down; the engine still answers, so the episode scores 0 rather than vanishing.
    session.reset(task=_task())
    (container,) = containers_of(docker_client, session.state()["sandbox_id"])
    container.kill()
    result = _bash(session, "true")
    assert result["observation"]["error_kind"] == "sandbox_error"
    assert result["observation"]["error"]["error_type"] == "transport_error"
    assert result["metadata"]["aborted"] is False and result["metadata"]["reason"]
    _assert_over_on_the_agent(session, result)
    session.reset(task=_task())  # the session is usable again with a new sandbox
    assert _bash(session, "true")["observation"]["error_kind"] is None


def environment_action(tool_name: str, arguments: dict) -> AnyAction:
    return ACTIONS.validate_python({"type": "call_tool", "tool_name": tool_name, "arguments": arguments})


def _environment(
    grader_checkout: Callable[[], Sandbox], engine_alive: Callable[[], bool] = lambda: True, retire: Callable[[Sandbox], None] = Sandbox.close
) -> CodingEnvironment:
    return CodingEnvironment(
        checkout=lambda: open_sandbox(SandboxSpec()),
        grader_checkout=grader_checkout,
        tasks=builtin_registry(),
        hints=HintGenerator(HintSettings(), list(TOOLS)),
        infrastructure_alive=engine_alive,
        retire=retire,
    )


def test_the_grading_sandbox_is_handed_to_retire_still_open() -> None:
    # Closing it is left to `retire` (the service's closes it in the background): removing a
    # container would otherwise be part of every submit's answer.
    graders: list[Sandbox] = []
    retired: list[tuple[Sandbox, bool]] = []

    def grader_checkout() -> Sandbox:
        graders.append(open_sandbox(SandboxSpec()))
        return graders[-1]

    def retire(sandbox: Sandbox) -> None:
        retired.append((sandbox, sandbox.is_alive()))
        sandbox.close()

    environment = _environment(grader_checkout, retire=retire)
    try:
        environment.reset(task=_task())
        environment.step(environment_action("write_file", {"path": "solution.py", "content": ADD_SOLUTION}))
        final = environment.step(environment_action("submit", {}))
        assert final.done is True and final.reward == 1.0
        (grader,) = graders
        assert (grader, True) in retired
        assert len(retired) == 2  # the grading sandbox, then the episode's own
    finally:
        environment.close()


def _no_grading_sandbox() -> Sandbox:
    raise RuntimeError("engine refused to start a container")


def test_no_grading_sandbox_is_the_infrastructures_fault() -> None:
    environment = _environment(_no_grading_sandbox)
    try:
        environment.reset(task=_task())
        environment.step(environment_action("write_file", {"path": "solution.py", "content": ADD_SOLUTION}))
        final = environment.step(environment_action("submit", {}))
        assert final.done is True and final.reward is None
        assert final.error_kind.value == "sandbox_error"
        assert final.metadata["aborted"] is True and "grading sandbox" in final.metadata["reason"]
    finally:
        environment.close()


def test_a_dead_sandbox_with_the_engine_gone_is_the_infrastructures_fault(docker_client: docker.DockerClient) -> None:
    engine = {"alive": True}
    environment = _environment(lambda: open_sandbox(SandboxSpec()), lambda: engine["alive"])
    try:
        environment.reset(task=_task())
        (container,) = containers_of(docker_client, environment.state.sandbox_id)
        container.kill()
        engine["alive"] = False  # what the service's Docker ping says when the engine has gone away
        final = environment.step(environment_action("bash", {"command": "true"}))
        assert final.done is True and final.reward is None and final.metadata["aborted"] is True
    finally:
        environment.close()


def test_the_reset_prompt_ends_with_how_to_work(session: HttpSession) -> None:
    prompt = session.reset(task=_task())["observation"]["prompt"]
    assert prompt == ADD_TASK["prompt"] + prompt_footer(list(TOOLS))
    footer = prompt[len(ADD_TASK["prompt"]) :]
    assert all(name in footer for name in TOOLS) and "submit" in footer and "ends the episode" in footer
    assert len(footer) < 300  # a small model reads it every episode


@pytest.mark.parametrize(
    ("task_change", "field"),
    [
        ({"limits": {"step_timeout_s": 1e12}}, "step_timeout_s"),
        ({"hidden_tests": {"../escape.py": "def test_x(): pass\n"}}, "hidden_tests"),
        ({"files": {"/etc/passwd": "x"}}, "files"),
    ],
    ids=["huge timeout", "hidden test outside the workspace", "absolute file path"],
)
def test_an_unbounded_inline_task_is_refused_at_reset_with_a_typed_error(session: HttpSession, task_change: dict, field: str) -> None:
    response = session.client.post(f"/sessions/{session.id}/reset", json={"task": {**ADD_TASK, **task_change}})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "invalid_request"
    assert field in body["message"], body["message"]
    assert any(field in map(str, error["loc"]) for error in body["detail"])
