"""The validity gate: every served task resists every trivial baseline, each baseline catches the
task it is meant for, the host's scores are the grader's, and the graded part runs on real sandboxes."""

from __future__ import annotations

import pytest

from env_server.grading.grader import grade, prepare_workspace
from env_server.models import CallCheck, TaskSpec
from env_server.tasks import StaticSuite, default_registry
from env_server.tasks.baselines import call_table_baselines, constant_reward, hole_baselines, visible_info
from env_server.tasks.cli import main
from env_server.tasks.validation import host_validity, validate_task
from sandbox import Sandbox


def _task(calls: list[CallCheck], prompt: str = "Write `f(x)` in solution.py.", **fields: object) -> TaskSpec:
    spec = {"files": {"solution.py": "def f(x):\n    raise NotImplementedError\n"}, **fields}
    return TaskSpec(
        id="gate/t", prompt=prompt, hidden_calls=calls, metadata={"solution": {"solution.py": "def f(x):\n    return x * 2\n"}}, **spec,
    )


def _scores(task: TaskSpec) -> dict[str, float]:
    return {score.name: score.reward for score in call_table_baselines(task)}


@pytest.mark.parametrize("suite", ["builtin", "humaneval", "warmup", "codeio"])
def test_no_served_task_pays_a_trivial_baseline(suite: str) -> None:
    registry = default_registry()
    paid = {}
    for task_id in registry.ids(suite):
        verdict = host_validity(registry.get(task_id))
        if not verdict.valid or any(score.reward > 0 for score in verdict.baselines):
            paid[task_id] = verdict.problems
    assert paid == {}


def test_suites_keep_their_size_after_the_gate() -> None:
    registry = default_registry()
    assert len(registry.ids("warmup")) == 1200
    assert len(registry.ids("humaneval")) == 164
    assert len(registry.ids("codeio")) == 300


def test_each_baseline_catches_the_task_it_is_for() -> None:
    always_zero = _task([CallCheck.build("solution", "f", [x], expected=0) for x in (1, 2, 3)])
    assert _scores(always_zero)["default"] == 1.0 and not host_validity(always_zero).valid

    echo = _task([CallCheck.build("solution", "f", [x], expected=x) for x in ("a", "b", "c")])
    assert _scores(echo)["identity"] == 1.0

    second_argument = _task([CallCheck.build("solution", "f", [1, x], expected=x) for x in (5, 6, 7)])
    assert _scores(second_argument)["identity"] == 1.0

    shown = [CallCheck.build("solution", "f", [x], expected=x * 2) for x in (2, 3)]
    unshown_alike = [CallCheck.build("solution", "f", [x], expected=99) for x in (50, 60)]
    memorised = _task([*shown, *unshown_alike], prompt="Write `f(x)`. Examples: f(2) == 4; f(3) == 6")
    assert _scores(memorised)["lookup"] == 1.0 and _scores(memorised)["default"] == 0.0

    doctest = _task(shown, files={"solution.py": 'def f(x):\n    """\n    >>> f(2)\n    4\n    >>> f(3)\n    6\n    """\n'})
    assert _scores(doctest)["lookup"] == 1.0

    raising = _task([CallCheck.build("solution", "f", [x], raises=ValueError) for x in (1, 2)])
    assert _scores(raising)["raises"] == 1.0

    partial = _task([CallCheck.build("solution", "f", [x], expected=y) for x, y in ((1, 7), (2, 8), (3, 9))],
                    prompt="Write `f(x)`; the answer is often 8.", reward_mode="fraction")
    assert _scores(partial)["shown_output"] == pytest.approx(1 / 3)
    assert _scores(partial)["most_common_hidden"] == pytest.approx(1 / 3)

    honest = _task([CallCheck.build("solution", "f", [x], expected=x * 2) for x in (5, 6, 7)], prompt="Example: f(2) == 4")
    assert host_validity(honest).valid and set(_scores(honest).values()) == {0.0}


def test_visible_values_come_from_prompt_files_tests_and_json_in_strings() -> None:
    task = _task([CallCheck.build("solution", "f", [1], expected=2)], prompt="`f(10) -> [1, 2]`",
                 visible_tests={"test_v.py": "import json\nCASES = json.loads('[[{\"x\": 4}, 8]]')\n"})
    seen = visible_info(task)
    assert {10, 1, 2, 4, 8}.issubset({value for value in seen.values.values() if type(value) is int})
    assert seen.shows([1, 2]) and seen.shows({"x": 4})


def test_a_static_suite_serves_only_what_the_gate_accepts() -> None:
    bad = _task([CallCheck.build("solution", "f", [x], expected=0) for x in (1, 2, 3)])
    good = _task([CallCheck.build("solution", "f", [x], expected=x * 2) for x in (1, 2, 3)]).model_copy(update={"id": "gate/good"})
    suite = StaticSuite([bad, good])
    assert suite.ids() == ["gate/good"] and list(suite.rejected) == ["gate/t"]
    with pytest.raises(KeyError, match="not served"):
        suite.get("gate/t")


def test_delete_the_body_variants_replace_every_stub() -> None:
    text = 'class A:\n    def m(self, value):\n        """Doc."""\n        raise NotImplementedError("todo")\n\n\ndef g(a, b):\n    raise NotImplementedError\n\n\ndef kept():\n    return 1\n'
    task = TaskSpec(id="gate/p", prompt="p", files={"lib.py": text}, hidden_tests={"test_h.py": "def test_x():\n    pass\n"})
    variants = hole_baselines(task)
    assert variants["body:return_none"]["lib.py"].count("return None") == 2
    identity = variants["body:identity"]["lib.py"]
    assert "        return value\n" in identity and "    return a\n" in identity and "return 1" in identity
    assert "NotImplementedError" not in identity
    compile(identity, "lib.py", "exec")


@pytest.mark.docker
def test_host_scores_are_what_the_grader_gives(workspace: Sandbox) -> None:
    """A constant submission graded for real earns what the host scored for that constant."""
    task = default_registry().get("builtin/fizzbuzz").model_copy(update={"reward_mode": "fraction"})
    shown_constant = "Fizz"
    host = {score.name: score for score in call_table_baselines(task)}
    prepare_workspace(workspace, task)
    workspace.write_file("solution.py", f"def fizzbuzz(n):\n    return {shown_constant!r}\n")
    graded = grade(workspace, task).reward

    assert graded == pytest.approx(constant_reward(task, shown_constant)) and graded > 0
    assert host["shown_output"].reward >= graded


@pytest.mark.docker
def test_the_graded_gate_rejects_a_pytest_task_that_delete_the_body_passes(workspace: Sandbox) -> None:
    weak = TaskSpec(
        id="gate/weak", prompt="Implement `log_event` in events.py.",
        files={"events.py": "def log_event(event):\n    raise NotImplementedError\n"},
        hidden_tests={"test_events.py": "from events import log_event\n\n\ndef test_returns_nothing():\n    assert log_event('x') is None\n"},
        metadata={"solution": {"events.py": "EVENTS = []\n\n\ndef log_event(event):\n    EVENTS.append(event)\n"}},
    )
    verdict = validate_task(weak, workspace)
    assert verdict.reference == 1.0 and verdict.baseline("untouched") == 0.0
    assert verdict.baseline("body:return_none") == 1.0 and not verdict.valid

    strong = weak.model_copy(update={"id": "gate/strong", "hidden_tests": {"test_events.py": (
        "import events\n\n\ndef test_records():\n    events.EVENTS.clear()\n    events.log_event('x')\n    assert events.EVENTS == ['x']\n"
    )}})
    verdict = validate_task(strong, workspace)
    assert verdict.valid, verdict.problems
    assert {score.name for score in verdict.baselines} >= {"untouched", "emptied", "body:return_none", "body:identity"}


@pytest.mark.docker
def test_cli_validate_reports_every_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "validate", "--suite", "builtin", "--sample", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("default", "identity", "shown_output", "most_common_hidden", "lookup", "raises", "untouched", "emptied", "reference=1.00"):
        assert name in out
    assert "suite builtin: 4 tasks built, 0 rejected by the gate, 4 served; trivially rewarded among served: 0 (0.0%)" in out
