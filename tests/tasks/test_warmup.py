"""The generated `warmup` suite: deterministic, three levels, a fixed split, bare tasks score 0."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from env_server.grading.grader import grade, prepare_workspace
from env_server.grading.in_sandbox import typed_values
from env_server.models import TaskSpec
from env_server.tasks import default_registry, warmup
from env_server.tasks.cli import main
from env_server.tasks.splits import split_of
from env_server.tasks.validation import validate
from sandbox import Sandbox, SandboxSpec, open_sandbox

_RAISED = object()


@pytest.fixture(scope="module")
def tasks() -> list[TaskSpec]:
    return warmup.generate()


def _fingerprint(specs: list[TaskSpec]) -> str:
    return hashlib.sha256(json.dumps([t.model_dump() for t in specs], sort_keys=True).encode()).hexdigest()


def _checks(task: TaskSpec) -> list[tuple[str, str, list[Any], Any]]:
    """(module, function, args, expected) of every hidden call, decoded from the spec."""
    assert not task.hidden_tests, "warmup tasks grade by call table only"
    return [
        (call.module, call.function, [typed_values.decode(arg) for arg in call.args], typed_values.decode(call.expected))
        for call in task.hidden_calls
    ]


def _answer(files: dict[str, str], module: str, function: str, args: list[Any]) -> Any:
    try:
        return getattr(warmup.load_modules(files)[module], function)(*json.loads(json.dumps(args)))
    except Exception:
        return _RAISED


def test_suite_is_the_same_in_another_process(tasks: list[TaskSpec]) -> None:
    # A different hash seed in the child: nothing may depend on set or dict-of-str ordering.
    child = subprocess.run(
        [sys.executable, "-c", "import hashlib, json\nfrom env_server.tasks import warmup\n"
         "print(hashlib.sha256(json.dumps([t.model_dump() for t in warmup.generate()], sort_keys=True).encode()).hexdigest())"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert child.stdout.strip() == _fingerprint(tasks)
    assert _fingerprint(warmup.generate(seed=1, sizes={1: 20, 2: 10, 3: 10})) != _fingerprint(tasks[:40])


def test_three_levels_of_every_kind_with_short_prompts(tasks: list[TaskSpec]) -> None:
    assert len(tasks) >= 1000 and len({t.id for t in tasks}) == len(tasks)
    levels = collections.Counter(t.metadata["level"] for t in tasks)
    assert levels == collections.Counter(warmup.LEVEL_SIZES) and all(t.id.startswith("warmup/l") for t in tasks)
    kinds = {t.metadata["kind"] for t in tasks}
    assert kinds >= {"write_function", "implement_helper", "add_parameter", "fix_bug/off_by_one",
                     "fix_bug/wrong_operator", "fix_bug/swapped_args", "fix_bug/wrong_constant"}
    for task in tasks:
        level = task.metadata["level"]
        assert len(task.prompt) < 400, task.id
        assert bool(task.visible_tests) == (level > 1), task.id
        if level == 1:
            assert len(task.files) == 1 and "raise NotImplementedError" in next(iter(task.files.values()))
        if level == 2:
            (module_text,) = task.files.values()
            assert 20 <= module_text.count("\n") <= 60, task.id
        if level == 3:
            assert len(task.files) == 2 and task.files.keys() == task.metadata["solution"].keys()
    # Workspace modules must not shadow the standard library or the test runner in the grader.
    modules = {path.removesuffix(".py") for t in tasks for path in t.files}
    assert not modules & (set(sys.stdlib_module_names) | {"pytest", "conftest"})


def test_reference_passes_and_the_bare_task_fails_every_hidden_check(tasks: list[TaskSpec]) -> None:
    """All 1,200 tasks, on the host: the graded checks in each spec against its own files."""
    for task in tasks:
        checks = _checks(task)
        assert len(checks) >= 3, task.id
        assert len({json.dumps(expected) for *_, expected in checks}) >= 2, task.id  # no constant answer passes
        for module, function, args, expected in checks:
            assert _answer(task.metadata["solution"], module, function, args) == expected, (task.id, function, args)
            bare = _answer(task.files, module, function, args)
            assert bare is _RAISED or bare != expected, (task.id, function, args)


def test_split_is_fixed_by_id_and_holds_out_about_a_fifth(tasks: list[TaskSpec]) -> None:
    # Pinned: changing the hash would silently move tasks between training and evaluation.
    assert [split_of(f"warmup/l1/{i:04d}") for i in range(6)] == ["held_out", "held_out", "train", "train", "train", "held_out"]
    registry = default_registry()
    train, held_out = registry.ids("warmup", split="train"), registry.ids("warmup", split="held_out")
    assert sorted(train + held_out) == sorted(t.id for t in tasks) and not set(train) & set(held_out)
    assert 0.15 < len(held_out) / len(tasks) < 0.25
    for level in warmup.LEVEL_SIZES:
        assert any(task_id.startswith(f"warmup/l{level}/") for task_id in held_out)
    assert warmup.split_ids("held_out") == held_out
    assert all(registry.get(task_id).metadata["split"] == "held_out" for task_id in held_out[:20])


def test_cli_lists_the_suite_and_each_split(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "list", "--suite", "warmup", "--split", "held_out"]) == 0
    held_out = capsys.readouterr().out.split()
    assert held_out == default_registry().ids("warmup", split="held_out")
    assert main(["tasks", "list", "--suite", "warmup"]) == 0
    assert len(capsys.readouterr().out.split()) == sum(warmup.LEVEL_SIZES.values())


def _sample(tasks: list[TaskSpec]) -> list[str]:
    """Eleven tasks: the first of each level-1 parameter list, of each bug kind and of each level-3 kind."""
    picked: dict[str, str] = {}
    for task in tasks:
        kind = task.metadata["kind"]
        if kind == "write_function":
            kind += ":" + next(iter(task.files.values())).split("(", 1)[1].split(")", 1)[0]
        picked.setdefault(kind, task.id)
    return list(picked.values())


@pytest.mark.docker
def test_a_sample_validates_through_the_real_grader(tasks: list[TaskSpec]) -> None:
    ids = _sample(tasks)
    assert len(ids) == 11
    registry = default_registry()
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        verdicts = list(validate((registry.get(task_id) for task_id in ids), sandbox))
    assert [v.task_id for v in verdicts if not v.valid] == [], [v.problems for v in verdicts if not v.valid]
    assert all(v.reference == 1.0 and v.baseline("untouched") == 0.0 for v in verdicts)


@pytest.mark.docker
def test_answers_that_only_look_right_score_zero(workspace: Sandbox, tasks: list[TaskSpec]) -> None:
    """Hard-coding the prompt's examples, or returning an object equal to everything, earns nothing."""
    task = next(t for t in tasks if t.metadata["kind"] == "write_function" and "(x: int)" in t.prompt)
    (path,) = task.files
    name = task.prompt.split("`", 2)[1].split("(", 1)[0]
    examples = dict(
        (int(line.split("(", 1)[1].split(")", 1)[0]), int(line.rsplit("==", 1)[1]))
        for line in task.prompt.split("Examples: ", 1)[1].split("; ")
    )
    hacks = {
        "examples": f"def {name}(x: int) -> int:\n    return {examples!r}[x]\n",
        "always_equal": (
            "class Anything(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n\n\n"
            f"def {name}(x: int) -> int:\n    return Anything(0)\n"
        ),
    }
    for hack, source in hacks.items():
        workspace.exec("find . -mindepth 1 -delete")
        prepare_workspace(workspace, task)
        workspace.write_file(path, source)
        assert grade(workspace, task).reward == 0.0, hack


def test_cli_show_names_hidden_calls_without_their_values(capsys: pytest.CaptureFixture[str]) -> None:
    task = default_registry().get("warmup/l1/0000")
    assert main(["tasks", "show", task.id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["hidden_calls"] == [f"{c.module}.{c.function}" for c in task.hidden_calls]
    assert main(["tasks", "show", "--with-hidden", task.id]) == 0
    assert json.loads(capsys.readouterr().out)["hidden_calls"][0]["expected"] == task.hidden_calls[0].expected
