"""Feature-deletion tasks: a real library with one function body removed; its tests grade.

Generation (`coding-env tasks generate feature-deletion --project NAME==VERSION`):
1. `pip download --no-binary :all: --no-deps` the sdist (third-party code lives only in the
   cache directory, never in this repository) and keep its text files, minus build metadata.
   The packages are found at the root (flat layout, single modules like `six.py` included) or
   under `src/`; tests, docs and build scripts may sit anywhere beside them.
2. Run the project's tests twice in a sandbox, under two string-hash seeds: the tests that pass
   in both runs are the baseline, less every test function whose ids or results differ between
   the runs (a test parametrized over a set gets ids that change from run to run, e.g. isodate's
   `test_format[4-19-expected21-%C]`; the grader could not find it again).
3. Candidates are function and method bodies of the package (AST-located; not tests), tried
   in an order fixed by the seed. A candidate's body is replaced by `raise NotImplementedError`
   (its docstring kept, so the module still imports); the tests run again. It goes on only if
   the package still imports and at least one baseline test now fails (those become the graded
   tests; the test files that hold them are hidden).
4. Every candidate that goes on is built as the task it would be and put through the validity
   gate (`validation.validate_task`: the real grader in fresh sandboxes, as the service grades):
   the reference (the original file) must score 1.0; the untouched and the emptied workspace,
   and "delete the body" (the body `return None`, or returning its first parameter) must score 0.
   Only tasks the gate accepts are written (decision 057).

The cache holds, per project, the pristine files once and one JSON line per task.
"""

from __future__ import annotations

import ast
import collections
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from env_server.grading.grader import GRADE_ENV, parse_junit, pytest_command, tar_files
from env_server.models import TaskLimits, TaskSpec
from env_server.tasks import StaticSuite
from env_server.tasks.validation import Validity, clear_workspace, validate_task
from sandbox import Sandbox

SUITE = "feature_deletion"
MIN_BODY_LINES = 3
MAX_FILE_BYTES = 512 * 1024
RUN_TIMEOUT_S = 300.0
"""The most a test run (or a grading run of a task) may take."""
MIN_RUN_TIMEOUT_S = 60.0
RUN_TIMEOUT_FACTOR = 10.0
"""A candidate's test run, and its task's grading, may take this many times the baseline run
(at least MIN_RUN_TIMEOUT_S, at most RUN_TIMEOUT_S): a deletion that makes a test loop costs
minutes, not five minutes per run."""
# Build metadata and VCS leftovers are no part of the task (an sdist's SOURCES.txt is harmless,
# but nothing in them is needed to solve or grade it).
_SKIPPED_PARTS = re.compile(r"(^|/)([^/]+\.egg-info|\.git|__pycache__|build|dist)(/|$)|\.py[co]$")
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
# Test helpers (`tests/common.py`, `pkg/test/harness.py`) are test code too: never a candidate.
_TEST_DIRECTORY = re.compile(r"(^|/)(tests?|testing)/")
_NOT_A_PACKAGE = frozenset({"tests", "test", "testing", "docs", "doc", "documentation", "examples", "example", "benchmarks", "scripts", "bin"})
_NOT_CANDIDATES = frozenset({"setup.py", "versioneer.py", "conftest.py", "_version.py"})
_DELETED_BODY = "raise NotImplementedError"


class ProjectRefused(ValueError):
    """The project cannot give tasks: no package found, its tests do not run in the sandbox, or
    the sandbox image already has it installed (its tasks would leak their solution)."""


class Project(BaseModel):
    """One downloaded project: what every task of it starts from."""

    name: str
    """Distribution name as given, e.g. `toolz`."""
    version: str
    packages: list[str]
    """Import names of the project's top-level packages or modules (the monitor watches for copies)."""
    source_root: str
    """Directory the packages live in, relative to the project root: '' or `src`."""
    files: dict[str, str]
    """Project files (relative path -> text): sources, tests, test configuration."""
    license: str | None = None
    """The licence its sdist's metadata declares (PKG-INFO), if any: what an exported dataset's card states."""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


class DeletionTask(BaseModel):
    """One generated task (one JSON line of the cache)."""

    path: str
    """File whose function lost its body."""
    qualname: str
    """`Class.method` or `function`."""
    modified: str
    """The file's text after the deletion."""
    hidden: list[str]
    """Test files that hold a graded test; the agent does not see them."""
    graded: list[str]
    """Tests that passed before the deletion and fail after it."""
    grade_timeout_s: float = RUN_TIMEOUT_S
    """How long grading may run (from the baseline run's time; older caches: RUN_TIMEOUT_S)."""


class GenerationReport(BaseModel):
    """What one `generate` call did."""

    project: str
    baseline_tests: int
    """The project's tests that pass untouched in the sandbox, in two runs under the same id."""
    candidates: int
    """Function bodies available for deletion."""
    tried: int
    """Candidates whose deletion was tested."""
    valid: int
    """Tasks kept: every one passed the validity gate."""
    rejected: dict[str, int]
    """Why tried candidates were not kept, by reason: before the gate (`package does not import`,
    `no failing test`, `failing tests not in test files`, `tests time out`), at the gate (`reference not 1.0`, `baseline NAME > 0`,
    `gate error: ...`). A candidate the gate refuses counts once under each of its reasons."""
    seconds: float
    """Wall-clock time, download and baseline run included."""
    seconds_per_valid: float | None
    """`seconds / valid`; None when nothing was kept."""


class ProjectRun(BaseModel):
    """The project's tests run once over the workspace's current state."""

    passed: set[str]
    failed: set[str]
    """Failed, errored or skipped."""
    imports: bool
    """Every package of the project imports."""
    timed_out: bool
    seconds: float


_SDIST_SUFFIXES = (".tar.gz", ".tar.bz2", ".tgz")


def download(requirement: str, into: Path) -> Project:
    """Fetch `NAME==VERSION` as an sdist with pip (or take a local `NAME-VERSION.tar.gz`) and read its text files."""
    local = Path(requirement)
    if local.is_file() and local.name.endswith(_SDIST_SUFFIXES):
        sdist = local
        stem = next(local.name.removesuffix(suffix) for suffix in _SDIST_SUFFIXES if local.name.endswith(suffix))
        name, _, version = stem.rpartition("-")
    else:
        name, _, version = requirement.partition("==")
        if not name or not version:
            raise ValueError(f"expected NAME==VERSION or a local NAME-VERSION.tar.gz, got {requirement!r}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps", "-d", str(into), requirement],
            check=True, capture_output=True, text=True,
        )
        (sdist,) = [path for path in into.iterdir() if path.name.endswith(_SDIST_SUFFIXES)]
    with tarfile.open(sdist) as archive:
        archive.extractall(into / "unpacked", filter="data")
    (root,) = list((into / "unpacked").iterdir())
    top_level = sorted(root.glob("**/*.egg-info/top_level.txt"))
    declared = top_level[0].read_text().split() if top_level else [name.replace("-", "_").lower()]
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or _SKIPPED_PARTS.search(relative) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            files[relative] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    source_root, packages = find_packages(files, declared)
    pkg_info = root / "PKG-INFO"
    licence = declared_license(pkg_info.read_text(encoding="utf-8", errors="replace")) if pkg_info.is_file() else None
    return Project(name=name, version=version, packages=packages, source_root=source_root, files=files, license=licence)


def declared_license(pkg_info: str) -> str | None:
    """The licence core metadata declares: `License-Expression`, else a one-line `License`, else
    the first `License ::` classifier's last part."""
    headers = HeaderParser().parsestr(pkg_info)
    expression = (headers.get("License-Expression") or "").strip()
    if expression:
        return expression
    text = (headers.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 64 and text.upper() != "UNKNOWN":
        return text
    classifiers = [value for value in headers.get_all("Classifier") or [] if value.startswith("License ::")]
    return classifiers[0].rsplit("::", 1)[1].strip() if classifiers else None


def find_packages(files: dict[str, str], declared: list[str]) -> tuple[str, list[str]]:
    """(source root, import names): the declared names (egg-info's top_level.txt, or the
    distribution's name) that exist as a package or a module under `src/` or at the root; if
    none does, every package directory there that is not tests, docs or examples."""
    for root in ("src", ""):
        prefix = f"{root}/" if root else ""
        present = [name for name in declared if f"{prefix}{name}/__init__.py" in files or f"{prefix}{name}.py" in files]
        if present:
            return root, present
    for root in ("src", ""):
        prefix = f"{root}/" if root else ""
        found = sorted({
            path.removeprefix(prefix).split("/")[0] for path in files
            if path.startswith(prefix) and path.removeprefix(prefix).count("/") == 1 and path.endswith("/__init__.py")
        } - _NOT_A_PACKAGE)
        if found:
            return root, found
    raise ProjectRefused(f"no package named {declared} (nor any other) under src/ or at the project root")


def package_of(project: Project, path: str) -> str | None:
    """The project package (or single module) that `path` belongs to, None for files beside them."""
    if project.source_root and not path.startswith(f"{project.source_root}/"):
        return None
    parts = PurePosixPath(path.removeprefix(f"{project.source_root}/") if project.source_root else path).parts
    top = parts[0] if len(parts) > 1 else PurePosixPath(parts[0]).stem if parts[0].endswith(".py") else None
    return top if top in project.packages else None


def test_command(project: Project) -> str:
    """The project's test run: the grader's safe pytest command, the package importable."""
    return pytest_command(project.source_root or ".")


def is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.search(path) or _TEST_DIRECTORY.search(path)) or PurePosixPath(path).name == "conftest.py"


def candidates(project: Project) -> list[tuple[str, str, int, int]]:
    """(path, qualname, first body line, last body line) of deletable bodies, in source order.

    Only the project's packages count (not tests, build scripts or docs beside them). Bodies
    shorter than MIN_BODY_LINES, on the `def` line, or nested in functions are skipped.
    """
    found = []
    for path, text in sorted(project.files.items()):
        if not path.endswith(".py") or is_test_file(path) or PurePosixPath(path).name in _NOT_CANDIDATES:
            continue
        if package_of(project, path) is None:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found.extend((path, qualname, first, last) for qualname, first, last in _bodies(tree))
    return found


def _bodies(tree: ast.Module) -> Iterator[tuple[str, int, int]]:
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


def delete_body(text: str, first: int, last: int) -> str:
    """`text` with lines first..last (1-based) replaced by one `raise NotImplementedError`."""
    lines = text.splitlines(keepends=True)
    indent = re.match(r"\s*", lines[first - 1]).group(0)
    return "".join(lines[: first - 1] + [f"{indent}{_DELETED_BODY}\n"] + lines[last:])


def run_tests(
    sandbox: Sandbox, project: Project, report_name: str, timeout_s: float = RUN_TIMEOUT_S, hash_seed: int | None = None
) -> ProjectRun:
    """Every test of the project over the workspace's current state (`hash_seed`: a fixed
    PYTHONHASHSEED, else a random one as when grading)."""
    env = GRADE_ENV if hash_seed is None else {**GRADE_ENV, "PYTHONHASHSEED": str(hash_seed)}
    imports = " && ".join(f"python3 -c 'import {package}'" for package in project.packages)
    prefix = f"cd {project.source_root} && " if project.source_root else ""
    report = f"/tmp/{report_name}.xml"
    started = time.perf_counter()
    result = sandbox.exec(
        f"rm -f {report}; ( {prefix}{imports} ) >/dev/null 2>&1; echo imports=$?; "
        f"{test_command(project)} --junitxml={report} -o junit_family=xunit2 >/dev/null 2>&1; true",
        timeout_s=timeout_s, env=env,
    )
    seconds = time.perf_counter() - started
    try:
        passed, failed = parse_junit(sandbox.read_file(report).decode(errors="replace"))
    except FileNotFoundError:
        passed, failed = [], []
    return ProjectRun(passed=set(passed), failed=set(failed), imports="imports=0" in result.stdout, timed_out=result.timed_out, seconds=seconds)


def _test_file_for(test_id: str, test_files: list[str]) -> str | None:
    """Test file of a junit-derived test id (`pkg/tests/test_x/Class::name` -> `pkg/tests/test_x.py`)."""
    module = test_id.split("::", 1)[0]
    matches = [path for path in test_files if module == path[:-3] or module.startswith(path[:-3] + "/")]
    return max(matches, key=len) if matches else None


def _restore(sandbox: Sandbox, project: Project) -> None:
    """The workspace holds the pristine project again, and nothing else."""
    clear_workspace(sandbox)
    sandbox.put_archive(tar_files(project.files), ".")


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


def generate(
    requirement: str, n: int, seed: int, cache_dir: Path, open_sandbox: Callable[[], Sandbox],
    log: Callable[[str], None] = lambda _: None, max_tries: int | None = None,
) -> GenerationReport:
    """Generate up to `n` gate-valid tasks for one project into `cache_dir`, trying at most
    `max_tries` candidates (default: all); deterministic for a seed. Raises ProjectRefused when
    the project cannot give tasks."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        project = download(requirement, Path(scratch))
    test_files = sorted(path for path in project.files if path.endswith(".py") and _TEST_FILE.search(path))
    pool = candidates(project)
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    tasks: list[DeletionTask] = []
    rejected: collections.Counter[str] = collections.Counter()
    tried = 0
    with open_sandbox() as sandbox:
        probe = sandbox.exec(" || ".join(f"python3 -c 'import {p}' 2>/dev/null" for p in project.packages) + " && echo present")
        if "present" in probe.stdout:
            raise ProjectRefused(f"{project.packages} is importable in the sandbox image; its tasks would leak their solution")
        sandbox.put_archive(tar_files(project.files), ".")
        baseline = run_tests(sandbox, project, "baseline", hash_seed=1)
        again = run_tests(sandbox, project, "baseline-again", hash_seed=2)
        # A test function any of whose ids differ between the runs is left out whole: an id that
        # happened to match under these two seeds would still differ under the grader's.
        unstable = {test.split("[", 1)[0] for test in baseline.passed ^ again.passed}
        baseline.passed = {test for test in baseline.passed & again.passed if test.split("[", 1)[0] not in unstable}
        if not baseline.imports:
            raise ProjectRefused(f"{requirement}: {project.packages} do not import in the sandbox")
        if not baseline.passed:
            raise ProjectRefused(
                f"{requirement}: no test passes in the sandbox ({len(baseline.failed)} failed or errored"
                f"{'; the sdist may ship no tests' if not baseline.failed else '; missing test dependencies?'})"
            )
        timeout_s = min(RUN_TIMEOUT_S, max(MIN_RUN_TIMEOUT_S, RUN_TIMEOUT_FACTOR * baseline.seconds))
        log(f"{project.key}: baseline {len(baseline.passed)} passed, {len(baseline.failed)} not, {len(unstable)} test functions "
            f"left out (ids or results change between runs); {baseline.seconds:.1f} s; {len(pool)} candidates")
        for position in order:
            if len(tasks) >= n or (max_tries is not None and tried >= max_tries):
                break
            tried += 1
            path, qualname, first, last = pool[position]
            modified = delete_body(project.files[path], first, last)
            sandbox.write_file(path, modified)
            run = run_tests(sandbox, project, f"candidate-{position}", timeout_s)
            sandbox.write_file(path, project.files[path])
            graded = sorted(baseline.passed - run.passed)
            hidden = sorted({file for test in graded if (file := _test_file_for(test, test_files))})
            if run.timed_out:
                reasons = ["tests time out"]
            elif not run.imports:
                reasons = ["package does not import"]
            elif not graded:
                reasons = ["no failing test"]
            elif not hidden:
                reasons = ["failing tests not in test files"]
            else:
                task = DeletionTask(path=path, qualname=qualname, modified=modified, hidden=hidden, graded=graded, grade_timeout_s=timeout_s)
                try:
                    verdict = validate_task(task_spec(project, task), sandbox)
                    reasons, detail = rejection_reasons(verdict), _verdict_text(verdict)
                except Exception as error:  # one candidate the gate cannot check is refused; the sweep goes on
                    if not sandbox.is_alive():
                        raise
                    reasons, detail = [f"gate error: {type(error).__name__}"], str(error)[:200]
                _restore(sandbox, project)
                if not reasons:
                    tasks.append(task)
                    log(f"  kept {path}:{qualname} ({len(graded)} tests fail; {detail})")
                    continue
                log(f"  refused by the gate {path}:{qualname}: {'; '.join(reasons)} ({detail})")
            rejected.update(reasons)
    directory = cache_dir / SUITE / project.key
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "project.json").write_text(project.model_dump_json())
    (directory / f"tasks-seed{seed}.jsonl").write_text("".join(task.model_dump_json() + "\n" for task in tasks))
    seconds = time.perf_counter() - started
    return GenerationReport(
        project=project.key, baseline_tests=len(baseline.passed), candidates=len(pool), tried=tried, valid=len(tasks),
        rejected=dict(sorted(rejected.items())), seconds=seconds, seconds_per_valid=seconds / len(tasks) if tasks else None,
    )


def task_spec(project: Project, task: DeletionTask) -> TaskSpec:
    module = PurePosixPath(task.path).with_suffix("").as_posix().removeprefix(f"{project.source_root}/")
    module = module.removesuffix("/__init__").replace("/", ".")
    hidden = set(task.hidden)
    files = {path: text for path, text in project.files.items() if path not in hidden and not _TEST_FILE.search(path)}
    files[task.path] = task.modified
    visible = {path: text for path, text in project.files.items() if _TEST_FILE.search(path) and path not in hidden}
    return TaskSpec(
        id=f"{SUITE}/{project.key}/{module}.{task.qualname}",
        prompt=(
            f"This is the {project.name} {project.version} project. The body of `{task.qualname}` in "
            f"{task.path} was removed; it now raises NotImplementedError. Implement it so that the "
            f"project's behaviour is restored. Run the tests with `{test_command(project)}`. The tests "
            f"that exercise it most are not in the workspace; they will grade your work."
        ),
        files=files,
        visible_tests=visible,
        test_command=test_command(project),
        hidden_tests={path: project.files[path] for path in task.hidden},
        grade_command=test_command(project),
        limits=TaskLimits(max_steps=40, grade_timeout_s=task.grade_timeout_s),
        metadata={
            "source": f"{project.name}=={project.version} sdist",
            "license": project.license,
            "package": project.packages[0],
            "packages": project.packages,
            "graded_test_ids": task.graded,
            "solution": {task.path: project.files[task.path]},
        },
    )


class FeatureDeletionSuite(StaticSuite):
    """Every generated task found under `cache_dir/feature_deletion/`."""

    def __init__(self, cache_dir: Path) -> None:
        specs = []
        for directory in sorted((cache_dir / SUITE).glob("*/")):
            project_file = directory / "project.json"
            if not project_file.exists():
                continue
            project = Project.model_validate_json(project_file.read_text())
            for tasks_file in sorted(directory.glob("tasks-seed*.jsonl")):
                for line in tasks_file.read_text().splitlines():
                    if line:
                        specs.append(task_spec(project, DeletionTask.model_validate_json(line)))
        super().__init__(specs)
