"""Feature-deletion tasks: a real library with one function body removed; its tests grade.

Generation (`coding-env tasks generate feature-deletion [--project NAME==VERSION ...]`) runs the
shared loop of `repo_generation` over the project (the pinned default list when none is given):
1. Candidates are function and method bodies of the package (AST-located; not tests), tried in
   an order fixed by the seed. A candidate's body is replaced by `raise NotImplementedError` (its
   docstring kept, so the module still imports); the tests run again.
2. It becomes a task only if the package still imports and at least one baseline test now fails
   (those become the graded tests; the test files that hold them are hidden).
3. Every task is put through the validity gate (`validation.validate_task`: the real grader in
   fresh sandboxes, as the service grades): the reference (the original file) must score 1.0;
   the untouched and the emptied workspace, and "delete the body" (the body `return None`, or
   returning its first parameter) must score 0. Only tasks the gate accepts are written (decision 057).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from env_server.models import TaskSpec
from env_server.tasks import StaticSuite
from env_server.tasks.projects import Baseline, Project, ProjectRun, test_command, test_file_for
from env_server.tasks.repo_generation import Change, RepoTask, RepoTaskGenerator

SUITE = "feature_deletion"
MIN_BODY_LINES = 3
_DELETED_BODY = "raise NotImplementedError"


class FeatureDeletion(RepoTaskGenerator):
    """Delete one function body; the tests that break grade its re-implementation."""

    suite = SUITE

    def changes(self, project: Project) -> list[Change]:
        """Every deletable body of the project's packages, in source order. Bodies shorter than
        MIN_BODY_LINES, on the `def` line, or nested in functions are skipped."""
        found = []
        for path, tree in project.source_files():
            text = project.files[path]
            for qualname, first, last in _bodies(tree):
                start, end = _line_offsets(text, first, last)
                indent = re.match(r"[ \t]*", text[start:]).group(0)
                found.append(Change(
                    key=f"{path}:{qualname}", path=path, qualname=qualname, start=start, end=end,
                    replacement=f"{indent}{_DELETED_BODY}\n", lines_changed=last - first + 1, kind="body deleted",
                ))
        return found

    def task(
        self, project: Project, change: Change, modified: str, broken: list[str], run: ProjectRun, baseline: Baseline,
    ) -> RepoTask:
        test_files = project.test_files
        graded = [test for test in broken if test_file_for(test, test_files)]
        hidden = sorted({test_file_for(test, test_files) for test in graded})
        return RepoTask(
            path=change.path, qualname=change.qualname, modified=modified, hidden=hidden, graded=graded,
            grade_timeout_s=baseline.timeout_s,
        )

    def task_spec(self, project: Project, task: RepoTask) -> TaskSpec:
        prompt = (
            f"This is the {project.name} {project.version} project. The body of `{task.qualname}` in "
            f"{task.path} was removed; it now raises NotImplementedError. Implement it so that the "
            f"project's behaviour is restored. Run the tests with `{test_command(project)}`. The tests "
            f"that exercise it most are not in the workspace; they will grade your work."
        )
        return self.served(project, task, prompt, hidden_tests={path: project.files[path] for path in task.hidden})


def _bodies(tree: ast.Module) -> Iterator[tuple[str, int, int]]:
    """(qualname, first body line, last body line) of each function and method, docstrings left out."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = child.body
                if ast.get_docstring(child) is not None:
                    body = body[1:]
                if not body or body[0].lineno == child.lineno:
                    continue
                first, last = body[0].lineno, max(stmt.end_lineno or stmt.lineno for stmt in body)
                if last - first + 1 >= MIN_BODY_LINES:
                    yield f"{prefix}{child.name}", first, last

    yield from walk(tree, "")


def _line_offsets(text: str, first: int, last: int) -> tuple[int, int]:
    """Character offsets of lines first..last (1-based), the last line's end included."""
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: first - 1])
    return start, start + sum(len(line) for line in lines[first - 1 : last])


class FeatureDeletionSuite(StaticSuite):
    """Every generated task found under `cache_dir/feature_deletion/`."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(FeatureDeletion().cached_tasks(cache_dir))
