"""Feature deletion: AST-located body removal, and a real generation from a downloaded sdist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from env_server.grading import grade, prepare_workspace
from env_server.tasks import default_registry
from env_server.tasks.feature_deletion import Project, candidates, delete_body, generate
from sandbox import Sandbox, SandboxSpec, open_sandbox

SOURCE = '''"""A module."""


def short(x):
    return x


class Shape:
    def area(self):
        """Area in square units."""
        width = self.width
        height = self.height
        return width * height  # keep me? no

    def one_liner(self): return 1


def total(values):
    result = 0
    for value in values:
        result += value
    return result
'''
PROJECT = Project(name="demo", version="1.0", packages=["demo"], source_root="",
                  files={"demo/__init__.py": SOURCE, "demo/tests/test_demo.py": "def test_x():\n    pass\n"})


def test_candidates_are_multi_line_bodies_of_package_code_only() -> None:
    found = [(path, name) for path, name, _, _ in candidates(PROJECT)]
    assert found == [("demo/__init__.py", "Shape.area"), ("demo/__init__.py", "total")]


def test_deleting_a_body_keeps_docstring_signature_and_the_rest_of_the_file() -> None:
    (_, _, first, last) = candidates(PROJECT)[0]
    modified = delete_body(SOURCE, first, last)
    assert '    def area(self):\n        """Area in square units."""\n        raise NotImplementedError\n\n    def one_liner' in modified
    assert "width * height" not in modified and "keep me" not in modified
    assert modified.replace(modified[modified.index("    def area"):modified.index("    def one_liner")], "") == \
        SOURCE.replace(SOURCE[SOURCE.index("    def area"):SOURCE.index("    def one_liner")], "")
    ast.parse(modified)


@pytest.mark.docker
@pytest.mark.slow
def test_generation_from_a_real_sdist_yields_gradable_tasks(tmp_path: Path) -> None:
    """Downloads inflection 0.5.1 with pip (a package index must be reachable)."""
    report = generate("inflection==0.5.1", 2, 0, tmp_path, lambda: open_sandbox(SandboxSpec(), backend="docker"))
    assert (report.valid, report.project) == (2, "inflection-0.5.1") and report.tried >= 2
    again = (tmp_path / "feature_deletion" / "inflection-0.5.1" / "tasks-seed0.jsonl").read_text()
    registry = default_registry(tmp_path)
    ids = registry.ids("feature_deletion")
    assert len(ids) == 2
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        for task_id in ids:
            task = registry.get(task_id)
            _check_task(sandbox, task)
    # Deterministic for a seed: the same deletions again.
    generate("inflection==0.5.1", 2, 0, tmp_path, lambda: open_sandbox(SandboxSpec(), backend="docker"))
    assert (tmp_path / "feature_deletion" / "inflection-0.5.1" / "tasks-seed0.jsonl").read_text() == again


def _check_task(sandbox: Sandbox, task) -> None:
    sandbox.exec("find . /tmp -mindepth 1 -delete")
    prepare_workspace(sandbox, task)
    path = next(iter(task.metadata["solution"]))
    assert "raise NotImplementedError" in sandbox.read_file(path).decode()
    assert not set(task.hidden_tests) & set(task.visible_tests) and not set(task.hidden_tests) & set(task.files)
    assert sandbox.exec("cd /tmp && python3 -c 'import inflection'").exit_code == 1  # only the workspace copy
    untouched = grade(sandbox, task)
    assert untouched.reward == 0.0 and untouched.tests_total == len(task.metadata["graded_test_ids"])
    for path, text in task.metadata["solution"].items():
        sandbox.write_file(path, text)
    assert grade(sandbox, task).reward == 1.0
