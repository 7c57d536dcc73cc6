"""Feature deletion: AST-located body removal, package discovery in every layout, and real
generations from sdists, every candidate through the validity gate (decision 057), resumable
from the ledger (decision 127).

The suite builds its sdist locally; the check against PyPI itself is opt-in
(`CODING_ENV_NETWORK_TESTS=1`), since tests send no traffic beyond this machine.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from env_server.grading.grader import grade, prepare_workspace
from env_server.tasks import default_registry
from env_server.tasks.feature_deletion import FeatureDeletion
from env_server.tasks.projects import Project, find_packages
from env_server.tasks.repo_generation import GenerationReport, generate_project
from sandbox import Sandbox, SandboxSpec, open_sandbox
from tests.support.sdists import local_sdist

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


def candidates(project: Project) -> list[tuple[str, str]]:
    return [(change.path, change.qualname) for change in FeatureDeletion().changes(project)]


def generate(requirement: str, n: int, seed: int, cache: Path, max_tries: int | None = None) -> GenerationReport:
    return generate_project(
        FeatureDeletion(), requirement, n, seed, cache, lambda: open_sandbox(SandboxSpec(), backend="docker"), max_tries=max_tries,
    )


def test_candidates_are_multi_line_bodies_of_package_code_only() -> None:
    found = candidates(PROJECT)
    assert found == [("demo/__init__.py", "Shape.area"), ("demo/__init__.py", "total")]


def _package_files(*paths: str) -> dict[str, str]:
    return {path: SOURCE for path in paths}


def test_a_src_layout_with_files_beside_src_finds_its_package_and_only_its_code() -> None:
    files = _package_files(
        "src/lib/__init__.py", "src/lib/core.py", "setup.py", "docs/conf.py", "tests/__init__.py", "tests/helpers.py",
        "tests/test_core.py", "src/lib/tests/test_inner.py", "src/lib/testing/fixtures.py", "tasks.py",
    )
    assert find_packages(files, ["lib"]) == ("src", ["lib"])
    # No egg-info: the distribution's name is not the package's; the directory under src/ is.
    assert find_packages(files, ["python_lib"]) == ("src", ["lib"])
    project = Project(name="lib", version="1", packages=["lib"], source_root="src", files=files)
    assert sorted({path for path, _ in candidates(project)}) == ["src/lib/__init__.py", "src/lib/core.py"]


def test_single_module_and_flat_layouts_find_their_code() -> None:
    single = _package_files("six.py", "test_six.py", "setup.py", "documentation/conf.py")
    assert find_packages(single, ["six"]) == ("", ["six"])
    project = Project(name="six", version="1", packages=["six"], source_root="", files=single)
    assert {path for path, _ in candidates(project)} == {"six.py"}
    flat = _package_files("tab/__init__.py", "test/common.py", "test/test_api.py", "benchmark.py")
    assert find_packages(flat, ["tab"]) == ("", ["tab"])
    project = Project(name="tab", version="1", packages=["tab"], source_root="", files=flat)
    assert {path for path, _ in candidates(project)} == {"tab/__init__.py"}


def test_deleting_a_body_keeps_docstring_signature_and_the_rest_of_the_file() -> None:
    change = FeatureDeletion().changes(PROJECT)[0]
    modified = change.apply(SOURCE)
    assert change.lines_changed == 3
    assert '    def area(self):\n        """Area in square units."""\n        raise NotImplementedError\n\n    def one_liner' in modified
    assert "width * height" not in modified and "keep me" not in modified
    assert modified.replace(modified[modified.index("    def area"):modified.index("    def one_liner")], "") == \
        SOURCE.replace(SOURCE[SOURCE.index("    def area"):SOURCE.index("    def one_liner")], "")
    ast.parse(modified)


# A src layout with files beside src/, and two functions whose tests a trivial body passes:
# `record`'s test only checks that it returns None, `normalise`'s only feeds it a normal form.
WEAKCHECKS = {
    "setup.py": "from setuptools import setup\n\nsetup(name='weakchecks', package_dir={'': 'src'}, packages=['weakchecks'])\n",
    "docs/conf.py": "def setup(app):\n    app.add_css_file('x.css')\n    app.add_js_file('x.js')\n    return {}\n",
    "src/weakchecks/__init__.py": '''"""Helpers whose tests check little."""


def mean(values):
    """Arithmetic mean."""
    total = sum(values)
    count = len(values)
    return total / count


def record(events, name):
    """Append `name` to `events`."""
    events.append(name)
    events.sort()
    return None


def normalise(text):
    """Lower case, outer spaces removed."""
    text = text.strip()
    text = text.lower()
    return text
''',
    "tests/test_mean.py": "from weakchecks import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 6]) == 3\n",
    "tests/test_record.py": "from weakchecks import record\n\n\ndef test_record():\n    assert record([], 'x') is None\n",
    "tests/test_normalise.py": "from weakchecks import normalise\n\n\ndef test_normalise():\n    assert normalise('abc') == 'abc'\n",
    # Parametrized over a set: its ids (`test_days[one-day3]`) change with the string-hash seed.
    "tests/test_days.py": (
        "import datetime\n\nimport pytest\n\nfrom weakchecks import mean\n\n"
        "DAYS = {(name, datetime.date(2000, 1, n)) for n, name in enumerate(['one', 'two', 'three', 'four', 'five', 'six'], 1)}\n\n\n"
        "@pytest.mark.parametrize('name, day', DAYS)\ndef test_days(name, day):\n    assert mean([day.day, day.day]) == day.day\n"
    ),
}


def _generate_and_check(requirement: str, n: int, cache: Path, package: str) -> None:
    report = generate(requirement, n, 0, cache)
    assert report.valid == n and report.tried >= n and report.seconds_per_valid == report.seconds / n
    (tasks_file,) = (cache / "feature_deletion").glob("*/tasks-seed0.jsonl")
    registry = default_registry(cache)
    ids = registry.ids("feature_deletion")
    assert len(ids) == n
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        for task_id in ids:
            task = registry.get(task_id)
            difficulty = task.metadata["difficulty"]
            assert difficulty["tests_failing"] >= 1 and difficulty["hidden_files"] == len(task.hidden_tests)
            assert difficulty["lines_changed"] >= 3 and difficulty["call_depth"] == 1  # the tests call it directly
            _check_task(sandbox, task, package)
    # Resumable: a run that stopped after one task and a rerun asking for all give the same tasks,
    # deterministic for a seed, and the rerun tries no candidate twice.
    resumed = cache.parent / "resumed"
    assert generate(requirement, 1, 0, resumed).valid == 1
    (ledger,) = (resumed / "feature_deletion").glob("*/tried-seed0.jsonl")
    with ledger.open("a") as half_written:  # a run killed while it wrote a line
        half_written.write('{"key": "ministats/__init__.py:sp')
    again = generate(requirement, n, 0, resumed)
    assert (again.valid, again.tried) == (n, report.tried)
    (resumed_tasks,) = (resumed / "feature_deletion").glob("*/tasks-seed0.jsonl")
    assert resumed_tasks.read_text() == tasks_file.read_text()
    keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == report.tried


@pytest.mark.docker
def test_generation_from_a_local_sdist_yields_gradable_tasks(tmp_path: Path) -> None:
    sdist = local_sdist(tmp_path)
    _generate_and_check(str(sdist), 3, tmp_path / "cache", "ministats")


@pytest.mark.docker
def test_candidates_a_trivial_body_passes_are_not_written(tmp_path: Path) -> None:
    sdist = local_sdist(tmp_path, "weakchecks-0.1", WEAKCHECKS)
    cache = tmp_path / "cache"
    report = generate(str(sdist), 3, 0, cache)
    # Every deletion breaks a test, so all three reach the gate; two are refused there.
    assert report.baseline_tests == 3
    assert (report.candidates, report.tried, report.valid) == (3, 3, 1)
    assert report.rejected == {"baseline body:return_none > 0": 1, "baseline body:identity > 0": 1}
    (tasks_file,) = (cache / "feature_deletion").glob("weakchecks-0.1/tasks-seed0.jsonl")
    (kept,) = [json.loads(line) for line in tasks_file.read_text().splitlines()]
    # test_days breaks too, but its ids differ from run to run: only test_mean can grade.
    assert kept["qualname"] == "mean" and kept["graded"] == ["tests/test_mean::test_mean"]
    registry = default_registry(cache)
    (task_id,) = registry.ids("feature_deletion")
    task = registry.get(task_id)
    assert task_id == "feature_deletion/weakchecks-0.1/weakchecks.mean" and "docs/conf.py" in task.files
    with open_sandbox(SandboxSpec(), backend="docker") as sandbox:
        _check_task(sandbox, task, "weakchecks")


@pytest.mark.docker
def test_a_projects_file_generates_each_and_reports_a_refused_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from env_server.cli import main

    good = local_sdist(tmp_path)
    untested = local_sdist(tmp_path, "notests-0.1", {"notests/__init__.py": "def f(x):\n    y = x\n    z = y\n    return z\n"})
    listing = tmp_path / "projects.txt"
    listing.write_text(f"# two projects\n{good}\n\n{untested}  # ships no tests\n")
    argv = ["tasks", "--cache-dir", str(tmp_path / "cache"), "generate", "feature-deletion", "--projects-file", str(listing), "--n", "1", "--jobs", "2", "--progress", "always"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    reports = [json.loads(line) for line in out.splitlines()]
    assert [(report["project"], report["valid"]) for report in reports] == [("ministats-0.1", 1), ("notests-0.1", 0)]
    assert "no test passes in the sandbox" in reports[1]["refused"]
    # The bar counts kept tasks; the refused project's share leaves its total.
    assert "feature_deletion: 100%" in err and "1/1" in err
    assert "| ministats-0.1 | 3 | 3 | 1 | 1 |" in err and "| notests-0.1 | refused:" in err and "| all (2 projects) |" in err


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


def test_call_depth_counts_calls_from_a_failing_test_to_the_changed_function() -> None:
    from env_server.tasks.repo_generation import call_depth

    source = (
        "class Box:\n    def __init__(self, x):\n        self.x = helper(x)\n\n\n"
        "def helper(x):\n    return inner(x)\n\n\ndef inner(x):\n    return x\n\n\ndef unused(x):\n    return x\n"
    )
    tests = (
        "from deep import Box, inner\n\n\ndef test_box():\n    assert Box(1).x == 1\n\n\n"
        "class TestInner:\n    def test_inner(self):\n        assert inner(2) == 2\n"
    )
    project = Project(name="deep", version="1", packages=["deep"], source_root="", files={"deep.py": source, "tests/test_deep.py": tests})
    box = ["tests/test_deep::test_box"]
    assert call_depth(project, "Box.__init__", box) == 1  # a constructor is called by its class's name
    assert call_depth(project, "helper", box) == 2
    assert call_depth(project, "inner", box) == 3
    assert call_depth(project, "inner", [*box, "tests/test_deep/TestInner::test_inner"]) == 1
    assert call_depth(project, "unused", box) is None
    syntax = Project(name="deep", version="1", packages=["deep"], source_root="", files={
        "deep.py": source + "\n\nclass Bag:\n    def __getitem__(self, key):\n        return inner(key)\n",
        "tests/test_bag.py": "from deep import Bag\n\n\ndef test_bag():\n    assert Bag()[3] == 3\n",
    })
    assert call_depth(syntax, "Bag.__getitem__", ["tests/test_bag::test_bag"]) == 1  # `bag[3]` calls it
    assert call_depth(syntax, "inner", ["tests/test_bag::test_bag"]) == 2
