"""Bug injection: AST-located one-token mutations that leave the rest of a file as it was, and real
generations from a local sdist through the validity gate, graded by the whole suite."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from env_server.cli import main
from env_server.grading.grader import grade, prepare_workspace
from env_server.tasks import default_registry
from env_server.tasks.bug_injection import BugInjection
from env_server.tasks.projects import Project
from sandbox import SandboxSpec, open_sandbox
from tests.support.sdists import RANGES, RANGES_SOURCE as SOURCE, local_sdist

PROJECT = Project(name="ranges", version="1.0", packages=["ranges"], source_root="", files={"ranges/__init__.py": SOURCE})


def _mutations() -> dict[str, str]:
    """Each mutation as `kind: changed line`."""
    found = {}
    for change in BugInjection().changes(PROJECT):
        modified = change.apply(SOURCE)
        ast.parse(modified)
        # Only the span changed: the text before and after it is the original's.
        assert modified[: change.start] == SOURCE[: change.start]
        assert modified[change.start + len(change.replacement) :] == SOURCE[change.end :]
        changed = [new for old, new in zip(SOURCE.splitlines(), modified.splitlines(), strict=False) if old != new]
        found[f"{change.qualname}: {change.kind}"] = changed[0].strip() if changed else ""
    return found


def test_every_operator_changes_one_token_or_one_span() -> None:
    found = _mutations()
    assert found["clamp: flipped comparison (line 6)"] == "if x > low:"
    assert found["clamp: off-by-one (line 6)"] == "if x <= low:"
    assert found["clamp: flipped comparison (line 8)"] == "if x < high:"
    assert found["clamp: dropped branch (line 6)"] == "if x > high:"  # the first `if` is gone
    assert found["is_empty: flipped comparison (line 18)"] == "return len(values) != 0 and True"
    assert found["is_empty: wrong constant (line 18)"] == "return len(values) == 0 and False"
    assert found["is_empty: off-by-one (line 18)"] == "return len(values) == 1 and True"
    assert found["window: swapped arguments (line 14)"] == "return [values[index] for index in range(start + size, start)]"
    # Defaults and docstrings are not mutated.
    assert not any("size=" in line for key, line in found.items() if "window" in key)


def test_swapped_arguments_keep_what_lies_between_them() -> None:
    source = "def f(a, b):\n    return divmod(a,\n                  b)\n"
    project = Project(name="p", version="1", packages=["p"], source_root="", files={"p.py": source})
    (change,) = [change for change in BugInjection().changes(project) if change.kind.startswith("swapped")]
    assert change.apply(source) == "def f(a, b):\n    return divmod(b,\n                  a)\n"


@pytest.mark.docker
def test_generation_writes_only_tasks_the_whole_suite_grades(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sdist = local_sdist(tmp_path, "ranges-1.0", RANGES)
    cache = tmp_path / "cache"
    assert main(["tasks", "--cache-dir", str(cache), "generate", "bug-injection", "--project", str(sdist), "--n", "3", "--jobs", "2"]) == 0
    out, err = capsys.readouterr()
    (report,) = [json.loads(line) for line in out.splitlines()]
    assert report["valid"] == 3 and report["tried"] >= 3
    # A mutation no test sees (`min` of equal arguments, a dropped branch the tests never take) is not kept.
    assert set(report["rejected"]) <= {"no failing test", "fewer than 2 failing tests", "baseline untouched > 0", "reference not 1.0"}
    assert "| ranges-1.0 |" in err and "valid / tried" in err
    registry = default_registry(cache)
    ids = registry.ids("bug_injection")
    assert len(ids) == 3 and len({task_id.rsplit(".", 1)[1] for task_id in ids}) == 3  # one task per function at most
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        for task_id in ids:
            task = registry.get(task_id)
            graded = task.metadata["graded_test_ids"]
            # Every test the project passed grades, the visible ones too: nothing else may break.
            assert len(graded) == 8 and set(task.visible_tests) < set(task.hidden_tests)
            # The symptom names one failing test, whose file the agent does not see.
            (symptom,) = [test for test in graded if test in task.prompt]
            assert f"{symptom.split('::')[0]}.py" in set(task.hidden_tests) - set(task.visible_tests)
            sandbox.exec("find . /tmp -mindepth 1 -delete")
            prepare_workspace(sandbox, task)
            assert grade(sandbox, task).reward == 0.0  # the bug as planted
            path, original = next(iter(task.metadata["solution"].items()))
            sandbox.write_file(path, original)
            assert grade(sandbox, task).reward == 1.0
            # A fix that breaks another function's tests earns nothing.
            sandbox.write_file(path, original.replace("return len(values) == 0", "return len(values) == 1"))
            assert grade(sandbox, task).reward == 0.0
