"""Checking that a task can be solved and is not solved already, through the real grader.

A task is valid when its reference solution (`metadata["solution"]` files, or a
`metadata["solution_command"]` run in the workspace) scores 1.0, and two non-solutions score 0:
the untouched workspace (doing nothing) and an emptied one (deleting everything, which
catches checks that pass vacuously, e.g. "no file in the directory is wrong" when the
directory is gone).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pydantic import BaseModel

from env_server.grading import grade, prepare_workspace
from env_server.tasks import TaskRegistry
from sandbox import Backend, Sandbox, SandboxSpec, open_sandbox

_CLEAR_WORKSPACE = "find . -mindepth 1 -delete"


class ValidationOutcome(BaseModel):
    task_id: str
    ok: bool
    detail: str
    """Rewards seen, or why the task could not be checked."""


def solve(sandbox: Sandbox, metadata: dict) -> bool:
    """Apply the task's reference solution; False if it has none."""
    files = metadata.get("solution")
    command = metadata.get("solution_command")
    for path, text in (files or {}).items():
        sandbox.write_file(path, text)
    if command:
        sandbox.exec(command, timeout_s=60)
    return bool(files or command)


def validate(registry: TaskRegistry, ids: Iterable[str], backend: Backend = "docker") -> Iterator[ValidationOutcome]:
    spec = SandboxSpec()
    with open_sandbox(spec, backend=backend) as sandbox:
        for task_id in ids:
            task = registry.get(task_id)
            try:
                sandbox.exec(_CLEAR_WORKSPACE)
                prepare_workspace(sandbox, task)
                untouched = grade(sandbox, task).reward
                sandbox.exec(_CLEAR_WORKSPACE)
                emptied = grade(sandbox, task).reward
                prepare_workspace(sandbox, task)
                if not solve(sandbox, task.metadata):
                    ok = untouched == emptied == 0.0
                    yield ValidationOutcome(task_id=task_id, ok=ok, detail=f"untouched={untouched:.2f} emptied={emptied:.2f}, no reference")
                    continue
                solved = grade(sandbox, task)
            except Exception as error:  # one broken task must not stop the sweep
                yield ValidationOutcome(task_id=task_id, ok=False, detail=f"{type(error).__name__}: {error}")
                continue
            detail = f"untouched={untouched:.2f} emptied={emptied:.2f} reference={solved.reward:.2f}"
            if solved.failing_tests:
                detail += f" failing={solved.failing_tests[:3]}"
            yield ValidationOutcome(task_id=task_id, ok=solved.reward == 1.0 and untouched == emptied == 0.0, detail=detail)
