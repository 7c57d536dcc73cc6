"""Feature-deletion tasks: a real library with one function body removed; its tests grade.

Generation (`coding-env tasks generate feature-deletion --project NAME==VERSION`):
1. `pip download --no-binary :all: --no-deps` the sdist (third-party code lives only in the
   cache directory, never in this repository) and keep its text files, minus build metadata.
2. Run the project's tests once in a sandbox: the tests that pass are the baseline.
3. Candidates are function and method bodies of the package (AST-located; not tests), tried
   in an order fixed by the seed. A candidate's body is replaced by `raise NotImplementedError`
   (its docstring kept, so the module still imports); the tests run again.
4. A candidate becomes a task only if the package still imports and at least one baseline
   test now fails. Those tests are graded; the test files that hold them are hidden.

The cache holds, per project, the pristine files once and one JSON line per task.
"""

from __future__ import annotations

import ast
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from env_server.grading import GRADE_ENV, parse_junit, pytest_command, tar_files
from env_server.models import TaskLimits, TaskSpec
from env_server.tasks import StaticSuite
from sandbox import Sandbox

SUITE = "feature_deletion"
MIN_BODY_LINES = 3
MAX_FILE_BYTES = 512 * 1024
RUN_TIMEOUT_S = 300.0
# Build metadata and VCS leftovers are no part of the task (an sdist's SOURCES.txt is harmless,
# but nothing in them is needed to solve or grade it).
_SKIPPED_PARTS = re.compile(r"(^|/)([^/]+\.egg-info|\.git|__pycache__|build|dist)(/|$)|\.py[co]$")
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
_DELETED_BODY = "raise NotImplementedError"


class Project(BaseModel):
    """One downloaded project: what every task of it starts from."""

    name: str
    """Distribution name as given, e.g. `toolz`."""
    version: str
    packages: list[str]
    """Import names of the project's top-level packages (the monitor watches for copies)."""
    source_root: str
    """Directory the packages live in, relative to the project root: '' or `src`."""
    files: dict[str, str]
    """Project files (relative path -> text): sources, tests, test configuration."""

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


class GenerationReport(BaseModel):
    """What one `generate` call did."""

    project: str
    candidates: int
    """Function bodies available for deletion."""
    tried: int
    """Candidates whose deletion was tested."""
    valid: int
    """Tasks kept."""
    seconds: float
    """Wall-clock time, download and baseline run included."""


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
    packages = top_level[0].read_text().split() if top_level else [name.replace("-", "_").lower()]
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or _SKIPPED_PARTS.search(relative) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            files[relative] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    source_root = "src" if any(path.startswith("src/") for path in files) else ""
    return Project(name=name, version=version, packages=packages, source_root=source_root, files=files)


def test_command(project: Project) -> str:
    """The project's test run: the grader's safe pytest command, the package importable."""
    return pytest_command(project.source_root or ".")


def is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.search(path)) or PurePosixPath(path).name == "conftest.py" or "/tests/" in f"/{path}"


def candidates(project: Project) -> list[tuple[str, str, int, int]]:
    """(path, qualname, first body line, last body line) of deletable bodies, in source order.

    Bodies shorter than MIN_BODY_LINES, on the `def` line, or nested in functions are skipped.
    """
    found = []
    for path, text in sorted(project.files.items()):
        if not path.endswith(".py") or is_test_file(path) or PurePosixPath(path).name in ("setup.py", "versioneer.py"):
            continue
        if PurePosixPath(path).relative_to(project.source_root or ".").parts[0] not in project.packages:
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


def run_tests(sandbox: Sandbox, project: Project, report_name: str) -> tuple[set[str], set[str], bool]:
    """(passed, not passed, package imports) for the workspace's current state."""
    imports = " && ".join(f"python3 -c 'import {package}'" for package in project.packages)
    prefix = f"cd {project.source_root} && " if project.source_root else ""
    report = f"/tmp/{report_name}.xml"
    result = sandbox.exec(
        f"( {prefix}{imports} ) >/dev/null 2>&1; echo imports=$?; "
        f"{test_command(project)} --junitxml={report} -o junit_family=xunit2 >/dev/null 2>&1; true",
        timeout_s=RUN_TIMEOUT_S, env=GRADE_ENV,
    )
    try:
        passed, failed = parse_junit(sandbox.read_file(report).decode(errors="replace"))
    except FileNotFoundError:
        passed, failed = [], []
    return set(passed), set(failed), "imports=0" in result.stdout


def _test_file_for(test_id: str, test_files: list[str]) -> str | None:
    """Test file of a junit-derived test id (`pkg/tests/test_x/Class::name` -> `pkg/tests/test_x.py`)."""
    module = test_id.split("::", 1)[0]
    matches = [path for path in test_files if module == path[:-3] or module.startswith(path[:-3] + "/")]
    return max(matches, key=len) if matches else None


def generate(
    requirement: str, n: int, seed: int, cache_dir: Path, open_sandbox: Callable[[], Sandbox],
    log: Callable[[str], None] = lambda _: None,
) -> GenerationReport:
    """Generate up to `n` tasks for one project into `cache_dir`; deterministic for a seed."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        project = download(requirement, Path(scratch))
    test_files = sorted(path for path in project.files if path.endswith(".py") and _TEST_FILE.search(path))
    pool = candidates(project)
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    tasks: list[DeletionTask] = []
    tried = 0
    with open_sandbox() as sandbox:
        probe = sandbox.exec(" || ".join(f"python3 -c 'import {p}' 2>/dev/null" for p in project.packages) + " && echo present")
        if "present" in probe.stdout:
            raise RuntimeError(f"{project.packages} is importable in the sandbox image; its tasks would leak their solution")
        sandbox.put_archive(tar_files(project.files), ".")
        baseline, broken, imports = run_tests(sandbox, project, "baseline")
        if not baseline or not imports:
            raise RuntimeError(f"{requirement}: the tests do not run in the sandbox ({len(baseline)} passed, {len(broken)} failed)")
        log(f"{project.key}: baseline {len(baseline)} passed, {len(broken)} not; {len(pool)} candidates")
        for position in order:
            if len(tasks) >= n:
                break
            path, qualname, first, last = pool[position]
            modified = delete_body(project.files[path], first, last)
            sandbox.write_file(path, modified)
            passed, failed, imports = run_tests(sandbox, project, f"candidate-{position}")
            sandbox.write_file(path, project.files[path])
            tried += 1
            graded = sorted(baseline - passed)
            hidden = sorted({file for test in graded if (file := _test_file_for(test, test_files))})
            if imports and graded and hidden:
                tasks.append(DeletionTask(path=path, qualname=qualname, modified=modified, hidden=hidden, graded=graded))
                log(f"  kept {path}:{qualname} ({len(graded)} tests fail)")
    directory = cache_dir / SUITE / project.key
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "project.json").write_text(project.model_dump_json())
    (directory / f"tasks-seed{seed}.jsonl").write_text("".join(task.model_dump_json() + "\n" for task in tasks))
    return GenerationReport(project=project.key, candidates=len(pool), tried=tried, valid=len(tasks),
                            seconds=time.perf_counter() - started)


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
        limits=TaskLimits(max_steps=40, grade_timeout_s=RUN_TIMEOUT_S),
        metadata={
            "source": f"{project.name}=={project.version} sdist (see its LICENSE)",
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
