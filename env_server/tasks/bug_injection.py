"""Bug-injection tasks: a real library with one bug planted in one function; its tests grade the fix.

SWE-smith's idea without a language model. Generation (`coding-env tasks generate bug-injection
[--project NAME==VERSION ...]`) runs the shared loop of `repo_generation`:
1. Candidates are single-token or single-span mutations of the package's functions (AST-located,
   the rest of the file byte for byte as it was): a flipped comparison (`<` and `>`, `==` and `!=`,
   `in` and `not in`, `is` and `is not`), an off-by-one (an integer constant one less, or one
   more for 0; a comparison's bound moved: `<` and `<=`, `>` and `>=`), a dropped branch (an `if`
   without `else` removed), swapped arguments (a call's first two positional arguments) and a
   wrong constant (`True` and `False`).
2. A mutation the tests cannot see is discarded; so is one that breaks fewer than
   MIN_BROKEN_TESTS tests (the prompt shows one failure; a fix written against that one input
   alone must not pass).
3. The task shows the mutated project, every test file without a failing test, and one failing
   test's id and message as the symptom. It is graded by every test of the suite that passed
   before the mutation (the hidden failing ones and the rest: nothing else may break).
4. The validity gate as for feature deletion: the original file scores 1.0, the untouched
   (buggy) and emptied workspaces 0. Only tasks it accepts are written.
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

SUITE = "bug_injection"
MIN_BROKEN_TESTS = 2
MAX_CONSTANT = 10_000
"""Integer constants larger than this (masks, sizes, codepoints) are not nudged: an off-by-one there is rarely a bug anyone writes."""

_FLIPPED = {
    ast.Lt: ">", ast.Gt: "<", ast.LtE: ">=", ast.GtE: "<=", ast.Eq: "!=", ast.NotEq: "==",
    ast.In: "not in", ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is",
}
_BOUND_MOVED = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">"}
_OPERATOR = re.compile(r"<=|>=|==|!=|<|>|\bnot\s+in\b|\bis\s+not\b|\bin\b|\bis\b")


class InjectedBug(RepoTask):
    """A bug-injection task: the shared fields, what was planted and the symptom shown."""

    kind: str
    """The mutation operator (`flipped comparison`, `off-by-one`, ...); never shown."""
    symptom_test: str
    """The failing test the prompt names."""
    symptom: str
    """The start of its failure message."""


class BugInjection(RepoTaskGenerator):
    """Plant one bug; the tests it breaks (hidden) and the rest of the suite grade the fix."""

    suite = SUITE
    task_type = InjectedBug

    def changes(self, project: Project) -> list[Change]:
        found = []
        for path, tree in project.source_files():
            text = project.files[path]
            offsets = _LineOffsets(text)
            for qualname, function in _functions(tree):
                for kind, start, end, replacement in _mutations(function, text, offsets):
                    line = text.count("\n", 0, start) + 1
                    found.append(Change(
                        key=f"{path}:{qualname}:{start}:{kind}", path=path, qualname=qualname, start=start, end=end,
                        replacement=replacement, lines_changed=text.count("\n", start, end) + 1, kind=f"{kind} (line {line})",
                    ))
        return found

    def task(
        self, project: Project, change: Change, modified: str, broken: list[str], run: ProjectRun, baseline: Baseline,
    ) -> InjectedBug | str:
        test_files = project.test_files
        failing = [test for test in broken if test_file_for(test, test_files)]
        if len(failing) < MIN_BROKEN_TESTS:
            return f"fewer than {MIN_BROKEN_TESTS} failing tests"
        symptom_test = next((test for test in failing if run.failures.get(test)), failing[0])
        return InjectedBug(
            path=change.path, qualname=change.qualname, modified=modified,
            hidden=sorted({test_file_for(test, test_files) for test in failing}),
            graded=sorted(test for test in baseline.passed if test_file_for(test, test_files)),
            grade_timeout_s=baseline.timeout_s, kind=change.kind.split(" (", 1)[0],
            symptom_test=symptom_test, symptom=run.failures.get(symptom_test) or "the test fails",
        )

    def task_spec(self, project: Project, task: RepoTask) -> TaskSpec:
        assert isinstance(task, InjectedBug)
        test_files = project.test_files
        prompt = (
            f"This is the {project.name} {project.version} project, and it has a bug. A test that "
            f"passed before now fails:\n\n    {task.symptom_test}\n    {_one_paragraph(task.symptom)}\n\n"
            f"Find the bug and fix it without breaking anything else. Run the visible tests with "
            f"`{test_command(project)}`. The failing tests are not in the workspace; they and the "
            f"rest of the suite will grade your work."
        )
        # Every file with a graded test, the visible ones too: nothing else may break.
        graded_files = sorted({file for test in task.graded if (file := test_file_for(test, test_files))})
        return self.served(project, task, prompt, hidden_tests={path: project.files[path] for path in graded_files}, mutation=task.kind)


def _one_paragraph(message: str) -> str:
    return " ".join(message.split())[:300]


class _LineOffsets:
    """Character offsets of AST positions (lines are 1-based, columns are UTF-8 byte offsets)."""

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines(keepends=True)
        self._starts = [0]
        for line in self._lines:
            self._starts.append(self._starts[-1] + len(line))

    def at(self, line: int, column: int) -> int:
        return self._starts[line - 1] + len(self._lines[line - 1].encode()[:column].decode(errors="replace"))

    def line_end(self, line: int) -> int:
        """The offset just past line `line`'s newline."""
        return self._starts[line]

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Each function and method outside other functions (nested ones belong to their enclosing function)."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{prefix}{child.name}", child

    yield from walk(tree, "")


def _mutations(function: ast.FunctionDef | ast.AsyncFunctionDef, text: str, offsets: _LineOffsets) -> Iterator[tuple[str, int, int, str]]:
    """(operator, start, end, replacement) of each mutation of the function's body."""
    inside_fstrings = {id(node) for joined in ast.walk(function) if isinstance(joined, ast.JoinedStr) for node in ast.walk(joined)}
    for statement in function.body:
        for node in ast.walk(statement):
            if id(node) in inside_fstrings:
                continue  # positions inside f-strings are not reliable before Python 3.12
            if isinstance(node, ast.Compare) and len(node.ops) == 1:
                found = _operator_span(node, text, offsets)
                if found:
                    start, end = found
                    yield "flipped comparison", start, end, _FLIPPED[type(node.ops[0])]
                    if type(node.ops[0]) in _BOUND_MOVED:
                        yield "off-by-one", start, end, _BOUND_MOVED[type(node.ops[0])]
            elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
                start, end = offsets.span(node)
                yield "wrong constant", start, end, str(not node.value)
            elif isinstance(node, ast.Constant) and type(node.value) is int and node.value <= MAX_CONSTANT:
                start, end = offsets.span(node)
                if text[start:end].isdigit():  # not 0x1F, 1_000 or 1e3: the literal as written
                    yield "off-by-one", start, end, str(node.value - 1 if node.value > 0 else 1)
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(arg, ast.Starred) for arg in node.args[:2]):
                first, second = (offsets.span(arg) for arg in node.args[:2])
                if text[first[0] : first[1]] != text[second[0] : second[1]]:
                    swapped = text[second[0] : second[1]] + text[first[1] : second[0]] + text[first[0] : first[1]]
                    yield "swapped arguments", first[0], second[1], swapped
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.For | ast.While | ast.If | ast.With | ast.Try):
                yield from _dropped_branches(node, text, offsets)
    yield from _dropped_branches(function, text, offsets)


def _dropped_branches(node: ast.AST, text: str, offsets: _LineOffsets) -> Iterator[tuple[str, int, int, str]]:
    """An `if` without `else` removed from a block that keeps another statement."""
    for block in (getattr(node, "body", None), getattr(node, "orelse", None)):
        if not isinstance(block, list) or len(block) < 2:
            continue
        for statement in block:
            if isinstance(statement, ast.If) and not statement.orelse:
                start = offsets.at(statement.lineno, 0)
                if text[start : offsets.at(statement.lineno, statement.col_offset)].strip() == "":
                    yield "dropped branch", start, offsets.line_end(statement.end_lineno), ""


def _operator_span(node: ast.Compare, text: str, offsets: _LineOffsets) -> tuple[int, int] | None:
    """Where a one-operator comparison's operator is written, or None when that is not plain."""
    gap_start, gap_end = offsets.span(node.left)[1], offsets.span(node.comparators[0])[0]
    gap = text[gap_start:gap_end]
    if "#" in gap or "\\" in gap:
        return None
    found = list(_OPERATOR.finditer(gap))
    if len(found) != 1:
        return None
    return gap_start + found[0].start(), gap_start + found[0].end()


class BugInjectionSuite(StaticSuite):
    """Every generated task found under `cache_dir/bug_injection/`."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(BugInjection().cached_tasks(cache_dir))
