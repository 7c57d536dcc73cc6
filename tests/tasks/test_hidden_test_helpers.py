"""Hidden tests that lean on their own test package (`from . import Mixin`) or a sibling helper
(`from common import ...`) grade as they do in their project: the grader's copy of the suite holds
the original helpers, found before anything in the workspace."""

from __future__ import annotations

import pytest

from env_server.grading.grader import grade, prepare_workspace
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
