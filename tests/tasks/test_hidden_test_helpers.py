"""Hidden tests that lean on their own test package (`from . import Mixin`, `from tests import
BaseCase`), a sibling helper (`from common import ...`) or the data of their test directory grade
as they do in their project: the grader's copy of the suite holds the original test directory,
found before anything in the workspace, and the workspace's copy is restored before the run."""

from __future__ import annotations

import pytest

from env_server.grading.grader import grade, prepare_workspace, pytest_command
from env_server.models import TaskSpec
from sandbox import Sandbox

pytestmark = pytest.mark.docker

TASK = TaskSpec(
    id="helpers/area",
    prompt="Implement `area(w, h)` in shapes.py.",
    files={
        "shapes.py": "def area(w, h):\n    raise NotImplementedError\n",
        "tests/__init__.py": "class AreaMixin:\n    expected = {(2, 3): 6, (4, 5): 20}\n",
        "test/common.py": "CASES = [(1, 1, 1), (3, 3, 9)]\n",
    },
    hidden_tests={
        "tests/test_mixin.py": (
            "from shapes import area\n\nfrom . import AreaMixin\n\n\n"
            "class TestArea(AreaMixin):\n    def test_table(self):\n        for (w, h), value in self.expected.items():\n"
            "            assert area(w, h) == value\n"
        ),
        "test/test_common.py": (
            "from common import CASES\n\nfrom shapes import area\n\n\n"
            "def test_cases():\n    for w, h, value in CASES:\n        assert area(w, h) == value\n"
        ),
    },
    metadata={"solution": {"shapes.py": "def area(w, h):\n    return w * h\n"}},
)


def test_hidden_tests_import_their_own_package_and_helpers(workspace: Sandbox) -> None:
    prepare_workspace(workspace, TASK)
    assert grade(workspace, TASK).reward == 0.0
    workspace.write_file("shapes.py", TASK.metadata["solution"]["shapes.py"])
    result = grade(workspace, TASK)
    assert (result.reward, result.tests_passed, result.monitor_flags) == (1.0, 2, []), result.output


def test_a_workspace_helper_does_not_stand_in_for_the_graders_copy(workspace: Sandbox) -> None:
    prepare_workspace(workspace, TASK)
    workspace.write_file("shapes.py", "def area(w, h):\n    return 0\n")
    workspace.write_file("common.py", "CASES = []\n")  # a top-level module named like the helper
    workspace.write_file("test/common.py", "CASES = []\n")
    workspace.write_file("tests/__init__.py", "class AreaMixin:\n    expected = {}\n")
    assert grade(workspace, TASK).reward == 0.0


# A project's own test package, as mistune's or distro's: a base class that compares against
# fixtures in a subdirectory, found beside the module's `__file__`, and data a test reads from
# the working directory.
FIXTURE_HELPERS = {
    "tests/__init__.py": (
        "import json, os\n\n\nclass BaseCase:\n    def check(self, function):\n"
        "        with open(os.path.join(os.path.dirname(__file__), 'fixtures', 'cases.json')) as cases:\n"
        "            for w, h, value in json.load(cases):\n                assert function(w, h) == value\n"
    ),
    "tests/fixtures/cases.json": "[[2, 3, 6], [4, 5, 20]]\n",
    "tests/data/squares.txt": "3 9\n",
}
FIXTURE_TEST = (
    "from shapes import area\n\nfrom tests import BaseCase\n\n\n"
    "class TestArea(BaseCase):\n    def test_fixtures(self):\n        self.check(area)\n\n"
    "    def test_squares(self):\n        side, value = map(int, open('tests/data/squares.txt').read().split())\n"
        "        assert area(side, side) == value\n"
)


def _fixture_task(source_root: str) -> TaskSpec:
    module = f"{source_root}/shapes.py" if source_root != "." else "shapes.py"
    return TaskSpec(
        id=f"helpers/fixtures-{source_root}",
        prompt="Implement `area(w, h)` in shapes.py.",
        files={module: "def area(w, h):\n    raise NotImplementedError\n", **FIXTURE_HELPERS},
        hidden_tests={"tests/test_area.py": FIXTURE_TEST},
        grade_command=pytest_command(source_root),
        metadata={"solution": {module: "def area(w, h):\n    return w * h\n"}},
    )


@pytest.mark.parametrize("source_root", [".", "src"])
def test_hidden_tests_read_their_test_package_and_its_data(workspace: Sandbox, source_root: str) -> None:
    """`from tests import ...` resolves to the grader's copy even where the workspace root is not
    importable (a src layout), and fixtures beside the helper's `__file__` are there."""
    task = _fixture_task(source_root)
    prepare_workspace(workspace, task)
    assert grade(workspace, task).reward == 0.0
    [(path, solution)] = task.metadata["solution"].items()
    workspace.write_file(path, solution)
    result = grade(workspace, task)
    assert (result.reward, result.tests_passed, result.monitor_flags) == (1.0, 2, []), result.output


def test_an_agent_s_edits_to_the_test_package_and_its_data_do_not_reach_grading(workspace: Sandbox) -> None:
    """The policy's shortcut: leave the bug, make the project's own checker and data agree with it."""
    task = _fixture_task(".")
    prepare_workspace(workspace, task)
    workspace.write_file("shapes.py", "def area(w, h):\n    return 0\n")
    workspace.write_file("tests/__init__.py", "class BaseCase:\n    def check(self, function):\n        pass\n")
    workspace.write_file("tests/fixtures/cases.json", "[]\n")
    workspace.write_file("tests/data/squares.txt", "3 0\n")
    result = grade(workspace, task)
    assert (result.reward, result.tests_passed) == (0.0, 0), result.output
