"""The validity gate: a task is served only if it can be solved and cannot be gamed.

A task is valid when (docs/decisions/053-the-validity-gate.md):
- its reference solution (`metadata["solution"]` files, or `metadata["solution_command"]` run in
  the workspace) scores 1.0 through the real grader;
- the untouched workspace (doing nothing) and the emptied one (deleting everything, which catches
  checks that pass vacuously) score 0;
- every trivial baseline of `env_server.tasks.baselines` scores 0: a type's default, an argument
  unchanged, any output the agent can see, the most common hidden output, a lookup of the shown
  examples, a stub that raises (call tables, scored on the host), and "delete the body" (pytest
  mode, graded in a sandbox);
- its hidden calls have at least two distinct expected outputs (with all-or-nothing reward no
  constant can then pass; a call table that expects one value everywhere teaches a constant).

`host_validity` is the part that needs no sandbox (call tables only); every suite applies it when
it is built (`StaticSuite`), so no registry serves a task it rejects. `validate_task` adds the
graded part; generators that can run a sandbox (feature deletion) call it on every candidate, and
`coding-env tasks validate` runs it over a suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from env_server.grading.grader import grade, prepare_workspace
from env_server.grading.in_sandbox import typed_values
from env_server.models import TaskSpec
from env_server.tasks.baselines import BaselineScore, call_table_baselines, hole_baselines, plain_checks
from sandbox import Sandbox

if TYPE_CHECKING:
    from env_server.tasks.verdict_store import VerdictStore

MIN_DISTINCT_OUTPUTS = 2
"""Distinct expected values a call table must hold (calls with a judge or an expected exception aside)."""



class Validity(BaseModel):
    """The gate's verdict on one task."""

    task_id: str
    valid: bool
    """No problem found: reference 1.0 (when graded), every baseline 0, outputs varied."""
    reference: float | None = None
    """The reference solution's reward; None when not graded (host-only) or the task has none."""
    baselines: list[BaselineScore] = Field(default_factory=list)
    """Every baseline's worst variant, host-scored first."""
    problems: list[str] = Field(default_factory=list)
    """Why the task is invalid (empty when valid)."""

    def baseline(self, name: str) -> float | None:
        """The reward of the baseline `name`, or None when it was not run."""
        return next((score.reward for score in self.baselines if score.name == name), None)


def distinct_outputs(task: TaskSpec) -> int:
    """How many distinct expected values the task's plain hidden calls hold."""
    return len({typed_values.canonical(check.expected) for check in plain_checks(task.hidden_calls)})


def host_validity(task: TaskSpec) -> Validity:
    """The gate's host-side part: trivial baselines of a call table and its output spread. A pytest-mode
    task passes it trivially (its baselines need a sandbox: `validate_task`). Remembered across
    processes (`verdict_store`): the same task under the same gate is judged once."""
    return _verdict_store().verdict(task, _judged_on_the_host)


@cache
def _verdict_store() -> VerdictStore:
    # Imported here: the store names `Validity`, defined in this module.
    from env_server.tasks import default_cache_dir
    from env_server.tasks.verdict_store import VerdictStore

    return VerdictStore(default_cache_dir() / "verdicts")


def _judged_on_the_host(task: TaskSpec) -> Validity:
    if not task.hidden_calls:
        return Validity(task_id=task.id, valid=True)
    baselines = call_table_baselines(task)
    problems = [f"baseline {score.name} ({score.variant}) scores {score.reward:.2f}" for score in baselines if score.reward > 0]
    distinct = distinct_outputs(task)
    if 0 < distinct < MIN_DISTINCT_OUTPUTS:  # 0: every call expects an exception or a judge's verdict
        problems.append(f"hidden calls expect {distinct} distinct output(s), fewer than {MIN_DISTINCT_OUTPUTS}")
    return Validity(task_id=task.id, valid=not problems, baselines=baselines, problems=problems)


def clear_workspace(sandbox: Sandbox) -> None:
    """Remove everything in the sandbox's workspace (before the next variant of a task goes in)."""
    sandbox.exec("find . -mindepth 1 -delete")


def solve(sandbox: Sandbox, metadata: dict) -> bool:
    """Apply the task's reference solution; False if it has none."""
    files = metadata.get("solution")
    command = metadata.get("solution_command")
    for path, text in (files or {}).items():
        sandbox.write_file(path, text)
    if command:
        sandbox.exec(command, timeout_s=60)
    return bool(files or command)


def validate_task(task: TaskSpec, sandbox: Sandbox, fresh_sandbox: Callable[[], Sandbox] | None = None) -> Validity:
    """The whole gate: `host_validity`, then the real grader on the untouched and the emptied workspace,
    every "delete the body" baseline, and the reference solution. `sandbox` is reused (its workspace is
    cleared before each variant); `fresh_sandbox` opens the grading sandboxes (default: like `sandbox`)."""
    verdict = host_validity(task)
    scores = list(verdict.baselines)
    problems = list(verdict.problems)

    def graded(name: str, files: dict[str, str] | None = None, clear: bool = False) -> float:
        clear_workspace(sandbox)
        if not clear:
            prepare_workspace(sandbox, task)
            for path, text in (files or {}).items():
                sandbox.write_file(path, text)
        reward = grade(sandbox, task, fresh_sandbox=fresh_sandbox).reward
        scores.append(BaselineScore(name=name, reward=reward))
        if reward > 0:
            problems.append(f"baseline {name} scores {reward:.2f}")
        return reward

    graded("untouched")
    graded("emptied", clear=True)
    for name, files in hole_baselines(task).items():
        graded(name, files)
    clear_workspace(sandbox)
    prepare_workspace(sandbox, task)
    reference = None
    if solve(sandbox, task.metadata):
        result = grade(sandbox, task, fresh_sandbox=fresh_sandbox)
        reference = result.reward
        if reference != 1.0:
            failing = f" (failing: {', '.join(result.failing_tests[:3])})" if result.failing_tests else ""
            flags = f" (flags: {', '.join(result.monitor_flags)})" if result.monitor_flags else ""
            problems.append(f"reference scores {reference:.2f}{failing}{flags}")
    elif not problems:
        problems.append("no reference solution")
    return Validity(task_id=task.id, valid=not problems, reference=reference, baselines=scores, problems=problems)


def validate(tasks: Iterable[TaskSpec], sandbox: Sandbox) -> Iterator[Validity]:
    """`validate_task` on each task in turn; a task that cannot be checked is invalid, the sweep goes on."""
    for task in tasks:
        try:
            yield validate_task(task, sandbox)
        except Exception as error:  # one broken task must not stop the sweep
            yield Validity(task_id=task.id, valid=False, problems=[f"{type(error).__name__}: {error}"[:300]])
