"""A task's reference solution as a trainer's privileged teacher reads it: a diff, not whole files.

A feature-deletion task's reference is a whole module of a real project; what a teacher needs is
the part that differs from the workspace the agent starts from, so the reference is rendered as a
unified diff of the task's files against the solved ones (decision 129).
"""

from __future__ import annotations

import difflib

from env_server.models import TaskReference, TaskSpec


def task_reference(task: TaskSpec) -> TaskReference | None:
    """The task's reference (`metadata["solution"]` files, `metadata["solution_command"]`); None when it has neither."""
    solution: dict[str, str] = task.metadata.get("solution") or {}
    command: str | None = task.metadata.get("solution_command")
    if not solution and not command:
        return None
    diff = "".join(_file_diff(path, task.files.get(path), text) for path, text in sorted(solution.items()))
    return TaskReference(task_id=task.id, diff=diff, command=command)


def _file_diff(path: str, before: str | None, after: str) -> str:
    lines = difflib.unified_diff(
        (before or "").splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile="/dev/null" if before is None else f"a/{path}",
        tofile=f"b/{path}",
    )
    # A line without a newline at the end of a file would run into the next diff line.
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
