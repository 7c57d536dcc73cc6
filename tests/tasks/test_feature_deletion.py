"""Feature deletion: AST-located body removal, and a real generation from an sdist.

The suite builds its sdist locally; the check against PyPI itself is opt-in
(`CODING_ENV_NETWORK_TESTS=1`), since tests send no traffic beyond this machine.
"""

from __future__ import annotations

import ast
import io
import os
import tarfile
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


MINISTATS = {
    "ministats/__init__.py": '''"""Small statistics helpers."""


def mean(values):
    """Arithmetic mean."""
    total = sum(values)
    count = len(values)
    return total / count


def span(values):
    """Largest minus smallest."""
    largest = max(values)
    smallest = min(values)
    return largest - smallest


def clamp(x, low, high):
    """x limited to [low, high]."""
    if x < low:
        return low
    return min(x, high)
''',
    "tests/test_mean.py": "from ministats import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n",
    "tests/test_span.py": "from ministats import span\n\n\ndef test_span():\n    assert span([4, 1, 9]) == 8\n",
    "tests/test_clamp.py": "from ministats import clamp\n\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0\n",
}


def _local_sdist(directory: Path) -> Path:
    """A real sdist archive of a three-function library with one test file per function."""
    path = directory / "ministats-0.1.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in MINISTATS.items():
            data = text.encode()
            info = tarfile.TarInfo(f"ministats-0.1/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _generate_and_check(requirement: str, n: int, cache: Path, package: str) -> None:
    report = generate(requirement, n, 0, cache, lambda: open_sandbox(SandboxSpec(), backend="docker"))
    assert report.valid == n and report.tried >= n
    (tasks_file,) = (cache / "feature_deletion").glob("*/tasks-seed0.jsonl")
    first_run = tasks_file.read_text()
    registry = default_registry(cache)
    ids = registry.ids("feature_deletion")
    assert len(ids) == n
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        for task_id in ids:
            _check_task(sandbox, registry.get(task_id), package)
    # Deterministic for a seed: the same deletions again.
    generate(requirement, n, 0, cache, lambda: open_sandbox(SandboxSpec(), backend="docker"))
    assert tasks_file.read_text() == first_run


@pytest.mark.docker
def test_generation_from_a_local_sdist_yields_gradable_tasks(tmp_path: Path) -> None:
    sdist = _local_sdist(tmp_path)
    _generate_and_check(str(sdist), 3, tmp_path / "cache", "ministats")


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CODING_ENV_NETWORK_TESTS") != "1", reason="downloads from PyPI; set CODING_ENV_NETWORK_TESTS=1")
def test_generation_from_a_pypi_sdist_yields_gradable_tasks(tmp_path: Path) -> None:
    _generate_and_check("inflection==0.5.1", 2, tmp_path, "inflection")


def _check_task(sandbox: Sandbox, task, package: str) -> None:
    sandbox.exec("find . /tmp -mindepth 1 -delete")
    prepare_workspace(sandbox, task)
    path = next(iter(task.metadata["solution"]))
    assert "raise NotImplementedError" in sandbox.read_file(path).decode()
    assert not set(task.hidden_tests) & set(task.visible_tests) and not set(task.hidden_tests) & set(task.files)
    assert sandbox.exec(f"cd /tmp && python3 -c 'import {package}'").exit_code == 1  # only the workspace copy
    untouched = grade(sandbox, task)
    assert untouched.reward == 0.0 and untouched.tests_total == len(task.metadata["graded_test_ids"])
    for path, text in task.metadata["solution"].items():
        sandbox.write_file(path, text)
    assert grade(sandbox, task).reward == 1.0
