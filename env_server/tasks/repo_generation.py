"""Tasks from real projects: the generation loop both real-repository generators share.

A generator (`feature_deletion`, `bug_injection`) says which changes of a project's source are
candidates and what task the tests a change breaks make; this module does the rest, the same for
both: download the sdist and find the tests it passes stably (`projects`), try candidates in an
order fixed by the seed (each: the changed file in, the tests run, the file back), and put every
task through the validity gate (`validation.validate_task`: the real grader in fresh sandboxes).
Only tasks the gate accepts are written (decision 057). At most one task is kept per function.

Resumable (decision 127): per project, generator and seed the cache holds the project, its
baseline, the kept tasks and a ledger with a line per tried candidate, each line appended as soon
as it is known. A rerun skips what the ledger holds and stops at `n` kept tasks, earlier runs'
included. Concurrent: `generate_projects` runs `jobs` projects at once, each in its own sandbox.
"""

from __future__ import annotations

import ast
import collections
import json
import random
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ValidationError
from tqdm import tqdm

from env_server.models import TaskLimits, TaskSpec
from env_server.tasks.projects import (
    Baseline, Project, ProjectRefused, ProjectRun, download, establish_baseline, module_name, restore, run_tests, test_command,
    test_file_for,
)
from env_server.tasks.validation import Validity, validate_task
from sandbox import Sandbox

_Line = TypeVar("_Line", bound=BaseModel)
MAX_CALL_DEPTH = 8
"""How far `call_depth` follows calls before it reports no static path."""
_CONSTRUCTORS = frozenset({"__new__", "__init__", "__post_init__"})


class Change(BaseModel):
    """A candidate: one span of one project file replaced."""

    key: str
    """Unique within the project and generator, stable across runs (the ledger's key)."""
    path: str
    qualname: str
    """The changed function: `Class.method` or `function`."""
    start: int
    end: int
    """The replaced span: character offsets into the original file."""
    replacement: str
    lines_changed: int
    """Lines of the original file the span touches."""
    kind: str
    """What the change is (`body deleted`, or a mutation operator such as `flipped comparison`)."""

    def apply(self, original: str) -> str:
        return original[: self.start] + self.replacement + original[self.end :]


class Difficulty(BaseModel):
    """What makes a task harder, for a curriculum."""

    lines_changed: int
    """Lines of the original file the task's change replaced (a deleted body's length, a bug's span)."""
    tests_failing: int
    """Baseline tests the change breaks."""
    hidden_files: int
    """Test files the agent does not see."""
    call_depth: int | None
    """Fewest calls from a breaking test to the changed function, found statically by name (1: a
    test calls it directly; `x[k]`, `x == y`, `len(x)`, `for`, `with` call their special methods);
    None when no such path of at most MAX_CALL_DEPTH calls is found."""


class RepoTask(BaseModel):
    """One generated task (one JSON line of the cache)."""

    path: str
    """File whose function was changed."""
    qualname: str
    """`Class.method` or `function`."""
    modified: str
    """The file's text after the change."""
    hidden: list[str]
    """Test files the agent does not see: those that hold a test the change breaks."""
    graded: list[str]
    """Tests that must pass."""
    grade_timeout_s: float
    """How long grading may run (from the baseline run's time)."""
    difficulty: Difficulty | None = None
    """None in caches written before difficulty was recorded."""


class Attempt(BaseModel):
    """One tried candidate: one line of the ledger."""

    key: str
    reasons: list[str]
    """Why it was not kept (empty: kept)."""
    seconds: float


class GenerationReport(BaseModel):
    """What generating from one project did, over every run so far."""

    project: str
    refused: str | None = None
    """Why the project gives no tasks (every count is then 0)."""
    baseline_tests: int = 0
    """The project's tests that pass untouched in the sandbox, in two runs under the same id."""
    candidates: int = 0
    """Changes available."""
    tried: int = 0
    """Candidates whose change was tested."""
    valid: int = 0
    """Tasks kept: every one passed the validity gate."""
    rejected: dict[str, int] = {}
    """Why tried candidates were not kept, by reason: before the gate (`package does not import`,
    `no failing test`, `failing tests not in test files`, `tests time out`, or the generator's own),
    at the gate (`reference not 1.0`, `baseline NAME > 0`, `gate error: ...`). A candidate the
    gate refuses counts once under each of its reasons."""
    seconds: float = 0.0
    """Wall-clock time, download and baseline runs included."""

    @property
    def seconds_per_valid(self) -> float | None:
        return self.seconds / self.valid if self.valid else None


class RepoTaskGenerator(ABC):
    """What a real-repository generator decides; `generate_project` does everything else."""

    suite: ClassVar[str]
    """The suite its tasks are served under, and its directory in the cache."""
    task_type: ClassVar[type[RepoTask]] = RepoTask

    @abstractmethod
    def changes(self, project: Project) -> list[Change]:
        """Every candidate change of the project's source, in a fixed order."""

    @abstractmethod
    def task(
        self, project: Project, change: Change, modified: str, broken: list[str], run: ProjectRun, baseline: Baseline,
    ) -> RepoTask | str:
        """The task `change` makes (`modified`: the file it leaves), given the baseline tests it
        broke (never empty; some in a test file) and the run that broke them; or why it makes none."""

    @abstractmethod
    def task_spec(self, project: Project, task: RepoTask) -> TaskSpec:
        """The task as the service serves it."""

    def served(self, project: Project, task: RepoTask, prompt: str, hidden_tests: dict[str, str], **metadata: object) -> TaskSpec:
        """The task spec both generators serve: the project with the changed file, the test files
        not in `task.hidden` visible, `hidden_tests` graded, the original file as the reference."""
        test_files = set(project.test_files)
        files = {path: text for path, text in project.files.items() if path not in test_files}
        files[task.path] = task.modified
        return TaskSpec(
            id=f"{self.suite}/{project.key}/{module_name(project, task.path)}.{task.qualname}",
            prompt=prompt,
            files=files,
            visible_tests={path: project.files[path] for path in sorted(test_files - set(task.hidden))},
            test_command=test_command(project),
            hidden_tests=hidden_tests,
            grade_command=test_command(project),
            limits=TaskLimits(max_steps=40, grade_timeout_s=task.grade_timeout_s),
            metadata={
                "source": f"{project.name}=={project.version} sdist",
                "license": project.license,
                "package": project.packages[0],
                "packages": project.packages,
                "graded_test_ids": task.graded,
                "solution": {task.path: project.files[task.path]},
                "difficulty": task.difficulty.model_dump() if task.difficulty else None,
                **metadata,
            },
        )

    def cached_tasks(self, cache_dir: Path) -> list[TaskSpec]:
        """Every task generated into `cache_dir`, as served."""
        specs = []
        for directory in sorted((cache_dir / self.suite).glob("*/")):
            project_file = directory / "project.json"
            if not project_file.exists():
                continue
            project = Project.model_validate_json(project_file.read_text())
            for tasks_file in sorted(directory.glob("tasks-seed*.jsonl")):
                specs.extend(self.task_spec(project, task) for task in _read_lines(tasks_file, self.task_type))
        return specs


def _read_lines(path: Path, model: type[_Line]) -> list[_Line]:
    """The models of a JSON-lines file; a line that does not parse (a run killed mid-write) is skipped."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(model.model_validate_json(line))
        except ValidationError:
            continue
    return found


def _append(path: Path, model: BaseModel) -> None:
    with path.open("a") as file:
        file.write(model.model_dump_json() + "\n")


def _drop_partial_line(path: Path) -> None:
    """Cut the half line a killed run may have left, so that the next line appended stands on its own."""
    if path.exists():
        text = path.read_text()
        if text and not text.endswith("\n"):
            path.write_text(text[: text.rfind("\n") + 1])


def rejection_reasons(verdict: Validity) -> list[str]:
    """The gate's verdict as rejection reasons (empty when valid)."""
    reasons = [f"baseline {score.name} > 0" for score in verdict.baselines if score.reward > 0]
    if verdict.reference != 1.0:
        reasons.append("reference not 1.0")
    if not reasons and not verdict.valid:
        reasons.extend(verdict.problems)
    return reasons


def _verdict_text(verdict: Validity) -> str:
    scores = " ".join(f"{score.name}={score.reward:.2f}" for score in verdict.baselines)
    reference = "none" if verdict.reference is None else f"{verdict.reference:.2f}"
    problems = f"; {'; '.join(verdict.problems)}" if verdict.problems else ""
    return f"reference={reference} {scores}{problems}"


class _ProjectCache:
    """One project's files in the cache: `cache_dir/SUITE/NAME-VERSION/`."""

    def __init__(self, cache_dir: Path, suite: str, requirement: str, seed: int) -> None:
        self.requirement, self.seed = requirement, seed
        self.directory: Path | None = None
        self._root = cache_dir / suite

    def find(self) -> Project | None:
        """The project as an earlier run downloaded it, if one did."""
        marker = self._root / "requirements.json"
        known = json.loads(marker.read_text()) if marker.exists() else {}
        if self.requirement in known and (self._root / known[self.requirement] / "project.json").exists():
            self.directory = self._root / known[self.requirement]
            return Project.model_validate_json((self.directory / "project.json").read_text())
        return None

    def keep(self, project: Project) -> None:
        self.directory = self._root / project.key
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "project.json").write_text(project.model_dump_json())
        marker = self._root / "requirements.json"
        with _MARKER_LOCK:
            known = json.loads(marker.read_text()) if marker.exists() else {}
            marker.write_text(json.dumps({**known, self.requirement: project.key}, indent=1, sort_keys=True))

    @property
    def baseline_file(self) -> Path:
        return self.directory / "baseline.json"

    @property
    def tasks_file(self) -> Path:
        return self.directory / f"tasks-seed{self.seed}.jsonl"

    @property
    def ledger_file(self) -> Path:
        return self.directory / f"tried-seed{self.seed}.jsonl"


_MARKER_LOCK = threading.Lock()


class _StoredBaseline(BaseModel):
    baseline: Baseline
    setup_seconds: float
    """Download and the baseline runs, the grader's included."""


def generate_project(
    generator: RepoTaskGenerator, requirement: str, n: int, seed: int, cache_dir: Path, open_sandbox: Callable[[], Sandbox],
    log: Callable[[str], None] = lambda _: None, max_tries: int | None = None, on_kept: Callable[[], None] = lambda: None,
) -> GenerationReport:
    """Generate up to `n` gate-valid tasks from one project into `cache_dir`, trying at most
    `max_tries` candidates (default: all), earlier runs' tasks and tries counted; deterministic for
    a seed. A project that cannot give tasks is reported `refused`."""
    started = time.perf_counter()
    cache = _ProjectCache(cache_dir, generator.suite, requirement, seed)
    try:
        project = cache.find()
        if project is None:
            with tempfile.TemporaryDirectory() as scratch:
                project = download(requirement, Path(scratch))
            cache.keep(project)
    except ProjectRefused as error:
        return GenerationReport(project=requirement, refused=str(error), seconds=time.perf_counter() - started)
    pool = generator.changes(project)
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    for path in (cache.tasks_file, cache.ledger_file):
        _drop_partial_line(path)
    tasks = _read_lines(cache.tasks_file, generator.task_type)
    attempts = {attempt.key: attempt for attempt in _read_lines(cache.ledger_file, Attempt)}
    kept_functions = {(task.path, task.qualname) for task in tasks}
    with open_sandbox() as sandbox:
        stored = _read_lines(cache.baseline_file, _StoredBaseline)
        if stored:
            baseline, setup_seconds = stored[0].baseline, stored[0].setup_seconds
            restore(sandbox, project)
        else:
            try:
                baseline = establish_baseline(sandbox, project)
            except ProjectRefused as error:
                return GenerationReport(project=project.key, refused=str(error), seconds=time.perf_counter() - started)
            setup_seconds = time.perf_counter() - started
            cache.baseline_file.write_text(_StoredBaseline(baseline=baseline, setup_seconds=setup_seconds).model_dump_json() + "\n")
            log(f"{project.key}: baseline {len(baseline.passed)} passed, {baseline.failed} not, {baseline.unstable} test "
                f"functions left out (ids or results change between runs), {baseline.not_graded} that the grader fails; "
                f"{baseline.seconds:.1f} s; {len(pool)} candidates")
        for position in order:
            if len(tasks) >= n or (max_tries is not None and len(attempts) >= max_tries):
                break
            change = pool[position]
            if change.key in attempts or (change.path, change.qualname) in kept_functions:
                continue
            tried_at = time.perf_counter()
            task, reasons, detail = _try(generator, project, change, baseline, sandbox, position)
            attempt = Attempt(key=change.key, reasons=reasons, seconds=time.perf_counter() - tried_at)
            if task is not None:
                # The task before its ledger line: a run killed between the two finds the function
                # kept on its rerun and tries none of its candidates again.
                _append(cache.tasks_file, task)
                tasks.append(task)
                kept_functions.add((task.path, task.qualname))
                on_kept()
            _append(cache.ledger_file, attempt)
            attempts[attempt.key] = attempt
            if detail:
                log(f"  {'kept' if task else 'refused by the gate'} {change.key}: {'; '.join(reasons) or 'valid'} ({detail})")
    return _report(project.key, baseline, setup_seconds, len(pool), list(attempts.values()), len(tasks))


def _report(project: str, baseline: Baseline, setup_seconds: float, candidates: int, attempts: list[Attempt], valid: int) -> GenerationReport:
    rejected = collections.Counter(reason for attempt in attempts for reason in attempt.reasons)
    return GenerationReport(
        project=project, baseline_tests=len(baseline.passed), candidates=candidates, tried=len(attempts), valid=valid,
        rejected=dict(sorted(rejected.items())), seconds=setup_seconds + sum(attempt.seconds for attempt in attempts),
    )


def cached_reports(generator: RepoTaskGenerator, cache_dir: Path, seed: int) -> list[GenerationReport]:
    """What the cache says generation from each project did so far (every run of `seed`), read
    without a sandbox: the figures of a long run that was stopped, or is still going."""
    reports = []
    for directory in sorted((cache_dir / generator.suite).glob("*/")):
        stored = _read_lines(directory / "baseline.json", _StoredBaseline)
        if not stored or not (directory / "project.json").exists():
            continue
        project = Project.model_validate_json((directory / "project.json").read_text())
        attempts = _read_lines(directory / f"tried-seed{seed}.jsonl", Attempt)
        valid = len(_read_lines(directory / f"tasks-seed{seed}.jsonl", generator.task_type))
        reports.append(_report(project.key, stored[0].baseline, stored[0].setup_seconds, len(generator.changes(project)), attempts, valid))
    return reports


def _try(
    generator: RepoTaskGenerator, project: Project, change: Change, baseline: Baseline, sandbox: Sandbox, position: int,
) -> tuple[RepoTask | None, list[str], str]:
    """(the task if the gate keeps it, why not, the gate's scores when it ran)."""
    modified = change.apply(project.files[change.path])
    try:
        ast.parse(modified)
    except SyntaxError:
        return None, ["does not parse"], ""
    sandbox.write_file(change.path, modified)
    run = run_tests(sandbox, project, f"candidate-{position}", baseline.timeout_s)
    sandbox.write_file(change.path, project.files[change.path])
    broken = sorted(baseline.passed - run.passed)
    test_files = project.test_files
    if run.timed_out:
        return None, ["tests time out"], ""
    if not run.imports:
        return None, ["package does not import"], ""
    if not broken:
        return None, ["no failing test"], ""
    if not any(test_file_for(test, test_files) for test in broken):
        return None, ["failing tests not in test files"], ""
    made = generator.task(project, change, modified, broken, run, baseline)
    if isinstance(made, str):
        return None, [made], ""
    made.difficulty = Difficulty(
        lines_changed=change.lines_changed, tests_failing=len(broken), hidden_files=len(made.hidden),
        call_depth=call_depth(project, change.qualname, broken),
    )
    try:
        verdict = validate_task(generator.task_spec(project, made), sandbox)
        reasons, detail = rejection_reasons(verdict), _verdict_text(verdict)
    except Exception as error:  # one candidate the gate cannot check is refused; the sweep goes on
        if not sandbox.is_alive():
            raise
        reasons, detail = [f"gate error: {type(error).__name__}"], str(error)[:200]
    restore(sandbox, project)
    return (None if reasons else made), reasons, detail


def call_depth(project: Project, qualname: str, tests: Iterable[str]) -> int | None:
    """Fewest calls from one of `tests` to the function `qualname`, by name in the project's
    syntax trees (1: the test calls it): cheap and deterministic, and a lower bound's estimate
    (a call through a variable is not seen; two functions of one name are one)."""
    target = qualname.rsplit(".", 1)[-1]
    if target == "__init__" and "." in qualname:
        target = qualname.rsplit(".", 2)[-2]  # a constructor is called by its class's name
    calls: dict[str, set[str]] = collections.defaultdict(set)
    for _, tree in project.source_files():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                calls[node.name] |= _called_names(node)
            elif isinstance(node, ast.ClassDef):  # calling a class runs its constructor
                constructors = [item for item in node.body if isinstance(item, ast.FunctionDef) and item.name in _CONSTRUCTORS]
                calls[node.name] |= {name for item in constructors for name in _called_names(item)}
    frontier: set[str] = set()
    for test in tests:
        frontier |= _test_calls(project, test)
    seen: set[str] = set()
    for depth in range(1, MAX_CALL_DEPTH + 1):
        if target in frontier:
            return depth
        seen |= frontier
        frontier = {callee for caller in frontier for callee in calls.get(caller, ())} - seen
        if not frontier:
            return None
    return None


# Methods that syntax calls: `cache[key] = value` runs `__setitem__`, `x in s` runs `__contains__`.
_SUBSCRIPT_METHODS = {ast.Load: "__getitem__", ast.Store: "__setitem__", ast.Del: "__delitem__"}
_COMPARISON_METHODS = {
    ast.Eq: "__eq__", ast.NotEq: "__ne__", ast.Lt: "__lt__", ast.LtE: "__le__", ast.Gt: "__gt__", ast.GtE: "__ge__",
    ast.In: "__contains__", ast.NotIn: "__contains__",
}
_BUILTIN_METHODS = {"len": "__len__", "iter": "__iter__", "next": "__next__", "repr": "__repr__", "str": "__str__",
                    "hash": "__hash__", "bool": "__bool__", "reversed": "__reversed__", "list": "__iter__", "sorted": "__iter__"}


def _called_names(node: ast.AST) -> set[str]:
    """Names `node` calls: by name or attribute, and the special methods its syntax runs."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            func = child.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            names.update({name, _BUILTIN_METHODS.get(name, "")})
        elif isinstance(child, ast.Subscript):
            names.add(_SUBSCRIPT_METHODS.get(type(child.ctx), ""))
        elif isinstance(child, ast.Compare):
            names.update(_COMPARISON_METHODS.get(type(op), "") for op in child.ops)
        elif isinstance(child, ast.For | ast.comprehension):
            names.update({"__iter__", "__next__"})
        elif isinstance(child, ast.With):
            names.update({"__enter__", "__exit__"})
    return names - {""}


def _test_calls(project: Project, test: str) -> set[str]:
    """Names the test function `test` (a junit-derived id) and its class's set-up call."""
    path = test_file_for(test, project.test_files)
    if path is None:
        return set()
    module, _, name = test.partition("::")
    name = name.split("[", 1)[0]
    scope = module.removeprefix(path[:-3]).strip("/")
    try:
        tree = ast.parse(project.files[path])
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and scope and node.name == scope.split("/")[-1]:
            names |= {call for item in node.body if isinstance(item, ast.FunctionDef) and item.name in (name, "setUp", "setup_method")
                      for call in _called_names(item)}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not scope and node.name == name:
            names |= _called_names(node)
    return names


def generate_projects(
    generator: RepoTaskGenerator, requirements: Sequence[str], n: int, seed: int, cache_dir: Path,
    open_sandbox: Callable[[], Sandbox], jobs: int = 1, max_tries: int | None = None,
    log: Callable[[str], None] = lambda _: None, progress: bool | None = None,
) -> list[GenerationReport]:
    """`generate_project` over every requirement, `jobs` at once, with one progress bar of kept
    tasks on stderr (by default only on a terminal; progress lines go to `log`, above the bar);
    the reports in the order of `requirements`."""
    shown = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=n * len(requirements), desc=generator.suite, unit="task", disable=not shown, file=sys.stderr, dynamic_ncols=True) as bar:
        lock = threading.Lock()

        def kept() -> None:
            with lock:
                bar.update(1)

        def above_the_bar(line: str) -> None:
            with lock, tqdm.external_write_mode(file=sys.stderr):
                log(line)

        def one(requirement: str) -> GenerationReport:
            report = generate_project(
                generator, requirement, n, seed, cache_dir, open_sandbox, log=above_the_bar, max_tries=max_tries, on_kept=kept,
            )
            with lock:  # a project that ended short of n no longer counts toward the bar's total
                bar.total -= n - report.valid
                bar.refresh()
            return report

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as workers:
            return list(workers.map(one, requirements))


def summary_table(reports: Iterable[GenerationReport]) -> str:
    """A Markdown table: per project, candidates, tries, valid tasks, rejections and time."""
    reports = list(reports)
    lines = [
        "| project | baseline tests | candidates | tried | valid | valid / tried | s / valid task | rejected (reason: count) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        if report.refused:
            lines.append(f"| {report.project} | refused: {report.refused.split(': ', 1)[-1]} | | | | | | |")
            continue
        per_valid = f"{report.seconds_per_valid:.1f}" if report.seconds_per_valid else "-"
        rejected = ", ".join(f"{reason}: {count}" for reason, count in report.rejected.items()) or "-"
        lines.append(
            f"| {report.project} | {report.baseline_tests} | {report.candidates} | {report.tried} | {report.valid} | "
            f"{report.valid / max(report.tried, 1):.0%} | {per_valid} | {rejected} |"
        )
    tried, valid, seconds = (sum(getattr(report, field) for report in reports) for field in ("tried", "valid", "seconds"))
    per_valid = f"{seconds / valid:.1f}" if valid else "-"
    lines.append(f"| all ({len(reports)} projects) | | | {tried} | {valid} | {valid / max(tried, 1):.0%} | {per_valid} | |")
    return "\n".join(lines)

