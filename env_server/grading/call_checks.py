"""Grading a call-table task (`TaskSpec.hidden_calls`): run the calls in the grading sandbox,
decide on the host.

Only the calls' inputs and the stdlib-only harness (`env_server/grading/in_sandbox/call_harness.py`) enter the
grading sandbox; the expected results stay here. The harness's result lines are parsed
defensively (anything malformed fails its call) and compared with `typed_values.matches`: exact
types, exact values, floats within the check's tolerances. Failing ids are built here from the
task's own calls (`call 3: f(1, 'a')`), never from text the sandbox produced.

Calls whose right answer is not unique name a `judge`: trusted code in this module that
receives the decoded arguments and the decoded result (plain values only) and says yes or no.
"""

from __future__ import annotations

import json
import math
import shlex
import uuid
from collections.abc import Callable
from importlib import resources
from typing import Any

from pydantic import BaseModel

from env_server.grading import in_sandbox
from env_server.grading.in_sandbox import typed_values
from env_server.models import CallCheck, TaskSpec
from sandbox import FileTooLarge, Sandbox

CALLS_PER_PROCESS = 16
"""Calls run by one worker process before a fresh one takes over (state and patches carry no further)."""

_HARNESS_FILES = ("call_harness.py", "typed_values.py")
_ID_ARGS_CHARS = 80


def _find_zero(args: list[Any], result: Any) -> bool:
    """HumanEval/32: any x with |poly(xs, x)| < 1e-4 is a zero (the check's own criterion)."""
    (coefficients,) = args
    if type(result) is not float or not math.isfinite(result):
        return False
    try:
        value = math.fsum(coefficient * result**power for power, coefficient in enumerate(coefficients))
    except OverflowError:
        return False
    return abs(value) < 1e-4


JUDGES: dict[str, Callable[[list[Any], Any], bool]] = {"humaneval/find_zero": _find_zero}
"""Trusted host-side judges by name: (decoded positional arguments, decoded result) -> passed."""


class CallVerdict(BaseModel):
    """How one call of the table went."""

    check_id: str
    """`call N: function(args…)`, built on the host from the task's own check."""

    passed: bool

    reason: str
    """`ok`, `wrong result`, `raised NAME`, `timeout`, `crashed`, `no result`, `unencodable result`..."""


def check_id(index: int, check: CallCheck) -> str:
    """The id a failing call is reported under: index, function, and the start of its arguments."""
    shown = [repr(typed_values.decode(value)) for value in check.args]
    shown += [f"{name}={typed_values.decode(value)!r}" for name, value in check.kwargs.items()]
    text = ", ".join(shown)
    if len(text) > _ID_ARGS_CHARS:
        text = text[: _ID_ARGS_CHARS - 1] + "…"
    return f"call {index}: {check.function}({text})"


class CallTableRun(BaseModel):
    """What the harness left: its raw result lines and how its run ended."""

    raw_results: str
    """JSON lines, one per call that finished (parsed defensively by `judge_calls`)."""

    ended: str
    """`exit N` or `timeout` (the whole table's `grade_timeout_s`)."""


def run_call_table(grader: Sandbox, task: TaskSpec, results_limit_bytes: int) -> CallTableRun:
    """Run the task's calls against the workspace already in `grader`. The expected values do
    not leave the host."""
    directory = f"/tmp/grade-{uuid.uuid4().hex}"
    calls = [
        {**check.model_dump(include={"module", "function", "args", "kwargs", "json_result"}), "report_args": check.expected_args is not None}
        for check in task.hidden_calls
    ]
    grader.write_file(f"{directory}/calls.json", json.dumps(calls))
    for name in _HARNESS_FILES:
        grader.write_file(f"{directory}/{name}", (resources.files(in_sandbox) / name).read_bytes())
    command = (
        f"python3 -I -B {shlex.quote(directory)}/call_harness.py {shlex.quote(directory)} "
        f"{task.limits.call_timeout_s} {CALLS_PER_PROCESS}"
    )
    result = grader.exec(command, timeout_s=task.limits.grade_timeout_s)
    ended = "timeout" if result.timed_out else f"exit {result.exit_code}"
    try:
        raw = grader.read_file(f"{directory}/results.jsonl", max_bytes=results_limit_bytes).decode(errors="replace")
    except (OSError, FileTooLarge):  # no results, or more than the harness ever writes: none count
        raw = ""
    return CallTableRun(raw_results=raw, ended=ended)


def _outcomes(raw: str, total: int) -> dict[int, dict[str, Any]]:
    """Each call's outcome line; an index reported twice (a forged line) counts as no result."""
    seen: dict[int, dict[str, Any]] = {}
    twice: set[int] = set()
    for line in raw.splitlines():
        try:
            outcome = json.loads(line)
        except ValueError:
            continue
        if type(outcome) is not dict or type(outcome.get("i")) is not int or not 0 <= outcome["i"] < total:
            continue
        (twice if outcome["i"] in seen else set()).add(outcome["i"])
        seen[outcome["i"]] = outcome
    return {index: outcome for index, outcome in seen.items() if index not in twice}


def judge_calls(task: TaskSpec, raw_results: str) -> list[CallVerdict]:
    """The verdict on each of the task's calls, from the harness's raw results."""
    outcomes = _outcomes(raw_results, len(task.hidden_calls))
    return [_verdict(index, check, outcomes.get(index)) for index, check in enumerate(task.hidden_calls)]


def _verdict(index: int, check: CallCheck, outcome: dict[str, Any] | None) -> CallVerdict:
    passed, reason = judge_outcome(check, outcome)
    return CallVerdict(check_id=check_id(index, check), passed=passed, reason=reason)


def judge_outcome(check: CallCheck, outcome: dict[str, Any] | None) -> tuple[bool, str]:
    """(passed, reason) for one call's harness line (None: no line). The validity gate feeds
    trivial baselines' answers through this same judge (`env_server.tasks.baselines`)."""
    if outcome is None:
        return False, "no result"
    for failure in ("timeout", "crashed", "too_large", "malformed"):
        if failure in outcome:
            return False, failure.replace("_", " ")
    if "raised" in outcome:
        raised = outcome["raised"]
        passed = check.raises is not None and raised == check.raises
        shown = raised if type(raised) is str and raised.replace(".", "").replace("_", "").isalnum() else "?"
        return passed, "ok" if passed else f"raised {shown[:80]}"
    returned = outcome.get("returned")
    if check.raises is not None:
        return False, f"returned instead of raising {check.raises}"
    if check.judge is not None:
        passed = _judged(check, returned)
    else:
        passed = typed_values.matches(returned, check.expected, rel_tol=check.rel_tol, abs_tol=check.abs_tol)
    if passed and check.expected_args is not None:
        after = outcome.get("args")
        if type(after) is not list or len(after) != len(check.expected_args) or not all(
            typed_values.matches(got, wanted, rel_tol=check.rel_tol, abs_tol=check.abs_tol)
            for got, wanted in zip(after, check.expected_args)
        ):
            return False, "changed its arguments"
    if passed:
        return True, "ok"
    unencodable = returned == typed_values.UNENCODABLE
    return False, "unencodable result" if unencodable else "wrong result"


def _judged(check: CallCheck, returned: Any) -> bool:
    judge = JUDGES.get(check.judge or "")
    if judge is None:
        return False
    try:
        args = [typed_values.decode(value) for value in check.args]
        return judge(args, typed_values.decode(returned)) is True
    except Exception:  # a judge fed a value it did not expect: the solution's answer is wrong
        return False
