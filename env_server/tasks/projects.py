"""Real projects as task material: a PyPI sdist read into memory, and its tests run in a sandbox.

Both real-repository generators (feature deletion, bug injection) start here:
1. `download` fetches `NAME==VERSION` as an sdist with pip (third-party code lives only in the
   cache directory, never in this repository) and keeps its text files, minus build metadata.
   The packages are found at the root (flat layout, single modules like `six.py` included) or
   under `src/`; tests, docs and build scripts may sit anywhere beside them.
2. `establish_baseline` runs the project's tests twice in a sandbox, under two string-hash seeds:
   the tests that pass in both runs are the baseline, less every test function whose ids or
   results differ between the runs (a test parametrized over a set gets ids that change from run
   to run, e.g. isodate's `test_format[4-19-expected21-%C]`; the grader could not find it again).
3. `run_tests` runs them again over a changed workspace: which baseline tests a change breaks is
   what a generator builds its task from.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from functools import cached_property
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from env_server.grading.grader import GRADE_ENV, grade, junit_failures, parse_junit, pytest_command, tar_files
from env_server.models import TaskLimits, TaskSpec
from env_server.tasks.validation import clear_workspace
from sandbox import Sandbox

DEFAULT_PROJECTS = (
    # Pure-Python sdists whose tests run in the sandbox image with pytest alone, pinned: each gave
    # gate-valid tasks on 2026-11-27 (docs/benchmarks.md, "Real-repository tasks at scale"). Flat
    # packages (toolz, boltons, click, ...), src layouts with files beside src/ (cachetools, isodate),
    # single modules (six, parse, xmltodict), tests inside the package (toolz, pyflakes, simplejson).
    "boltons==26.2.0", "cachetools==8.0.2", "click==8.1.7", "idna==3.7", "inflection==0.5.1", "isodate==0.7.2",
    "jmespath==1.0.1", "mistune==2.0.5", "ordered-set==4.1.0", "parse==1.20.2", "pathspec==0.12.1", "pyasn1==0.6.5",
    "pyflakes==4.1.0", "simplejson==4.3.0", "six==1.17.0", "sqlparse==0.6.1", "tabulate==0.10.0", "toolz==1.2.0",
    "Unidecode==1.4.0", "webencodings==0.6.1", "xmltodict==1.0.4",
)
"""The projects `coding-env tasks generate` draws from when none is given."""

MAX_FILE_BYTES = 512 * 1024
RUN_TIMEOUT_S = 300.0
"""The most a test run (or a grading run of a task) may take."""
MIN_RUN_TIMEOUT_S = 60.0
RUN_TIMEOUT_FACTOR = 10.0
"""A changed project's test run, and its task's grading, may take this many times the baseline run
(at least MIN_RUN_TIMEOUT_S, at most RUN_TIMEOUT_S): a change that makes a test loop costs
minutes, not five minutes per run."""
# Build metadata and VCS leftovers are no part of a task (an sdist's SOURCES.txt is harmless,
# but nothing in them is needed to solve or grade it).
_SKIPPED_PARTS = re.compile(r"(^|/)([^/]+\.egg-info|\.git|__pycache__|build|dist)(/|$)|\.py[co]$")
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
# Test helpers (`tests/common.py`, `pkg/test/harness.py`) are test code too: never changed.
_TEST_DIRECTORY = re.compile(r"(^|/)(tests?|testing)/")
_NOT_A_PACKAGE = frozenset({"tests", "test", "testing", "docs", "doc", "documentation", "examples", "example", "benchmarks", "scripts", "bin"})
_NOT_SOURCE = frozenset({"setup.py", "versioneer.py", "conftest.py", "_version.py"})
_SDIST_SUFFIXES = (".tar.gz", ".tar.bz2", ".tgz")
MAX_MESSAGE_CHARS = 400


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

    @cached_property
    def test_files(self) -> list[str]:
        return sorted(path for path in self.files if path.endswith(".py") and _TEST_FILE.search(path))

    def source_files(self) -> Iterator[tuple[str, ast.Module]]:
        """(path, syntax tree) of each module of the project's packages: not tests, build scripts or docs."""
        for path, text in sorted(self.files.items()):
            if not path.endswith(".py") or is_test_file(path) or PurePosixPath(path).name in _NOT_SOURCE:
                continue
            if package_of(self, path) is None:
                continue
            try:
                yield path, ast.parse(text)
            except SyntaxError:
                continue


class ProjectRun(BaseModel):
    """The project's tests run once over the workspace's current state."""

    passed: set[str]
    failed: set[str]
    """Failed, errored or skipped."""
    failures: dict[str, str] = {}
    """Failed or errored test -> the start of its failure message (what a developer would see first)."""
    imports: bool
    """Every package of the project imports."""
    timed_out: bool
    seconds: float


class Baseline(BaseModel):
    """The tests a project passes untouched, in two runs under different hash seeds."""

    passed: set[str]
    """Passed in both runs, less every test function whose ids or results differ between them."""
    failed: int
    """Tests that failed, errored or were skipped in the first run."""
    unstable: int
    """Test functions left out: their ids or results change between runs."""
    not_graded: int = 0
    """Tests left out because the real grader does not pass them on the untouched project."""
    seconds: float
    """The first run's wall-clock time."""

    @property
    def timeout_s(self) -> float:
        """How long a run of the changed project, and its task's grading, may take."""
        return min(RUN_TIMEOUT_S, max(MIN_RUN_TIMEOUT_S, RUN_TIMEOUT_FACTOR * self.seconds))


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
        downloaded = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps", "-d", str(into), requirement],
            capture_output=True, text=True, check=False,
        )
        if downloaded.returncode != 0:
            raise ProjectRefused(f"{requirement}: pip could not download its sdist ({downloaded.stderr.strip().splitlines()[-1:]})")
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


def module_name(project: Project, path: str) -> str:
    """The import name of the project module at `path` (`src/pkg/sub/__init__.py` -> `pkg.sub`)."""
    module = PurePosixPath(path).with_suffix("").as_posix().removeprefix(f"{project.source_root}/")
    return module.removesuffix("/__init__").replace("/", ".")


def test_command(project: Project) -> str:
    """The project's test run: the grader's safe pytest command, the package importable."""
    return pytest_command(project.source_root or ".")


def is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.search(path) or _TEST_DIRECTORY.search(path)) or PurePosixPath(path).name == "conftest.py"


def test_file_for(test_id: str, test_files: list[str]) -> str | None:
    """Test file of a junit-derived test id (`pkg/tests/test_x/Class::name` -> `pkg/tests/test_x.py`)."""
    module = test_id.split("::", 1)[0]
    matches = [path for path in test_files if module == path[:-3] or module.startswith(path[:-3] + "/")]
    return max(matches, key=len) if matches else None


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
        xml_text = sandbox.read_file(report).decode(errors="replace")
        passed, failed = parse_junit(xml_text)
        failures = {test: message[:MAX_MESSAGE_CHARS] for test, message in junit_failures(xml_text).items()}
    except FileNotFoundError:
        passed, failed, failures = [], [], {}
    return ProjectRun(
        passed=set(passed), failed=set(failed), failures=failures, imports="imports=0" in result.stdout,
        timed_out=result.timed_out, seconds=seconds,
    )


def establish_baseline(sandbox: Sandbox, project: Project) -> Baseline:
    """Put the project into `sandbox`'s empty workspace and find the tests it passes stably.
    Raises ProjectRefused when the sandbox image has the project, it does not import, or no test passes."""
    probe = sandbox.exec(" || ".join(f"python3 -c 'import {p}' 2>/dev/null" for p in project.packages) + " && echo present")
    if "present" in probe.stdout:
        raise ProjectRefused(f"{project.packages} is importable in the sandbox image; its tasks would leak their solution")
    sandbox.put_archive(tar_files(project.files), ".")
    first = run_tests(sandbox, project, "baseline", hash_seed=1)
    again = run_tests(sandbox, project, "baseline-again", hash_seed=2)
    if not first.imports:
        raise ProjectRefused(f"{project.key}: {project.packages} do not import in the sandbox")
    # A test function any of whose ids differ between the runs is left out whole: an id that
    # happened to match under these two seeds would still differ under the grader's.
    unstable = {test.split("[", 1)[0] for test in first.passed ^ again.passed}
    passed = {test for test in first.passed & again.passed if test.split("[", 1)[0] not in unstable}
    if not passed:
        raise ProjectRefused(
            f"{project.key}: no test passes in the sandbox ({len(first.failed)} failed or errored"
            f"{'; the sdist may ship no tests' if not first.failed else '; missing test dependencies?'})"
        )
    baseline = Baseline(passed=passed, failed=len(first.failed), unstable=len(unstable), seconds=first.seconds)
    not_graded = _not_graded(sandbox, project, baseline)
    baseline.passed -= not_graded
    baseline.not_graded = len(not_graded)
    if not baseline.passed:
        raise ProjectRefused(f"{project.key}: the grader passes none of the {len(passed)} tests the project passes")
    return baseline


def _not_graded(sandbox: Sandbox, project: Project, baseline: Baseline) -> set[str]:
    """Baseline tests in test files that the real grader fails on the untouched project (its
    importlib mode and its own configuration differ from the project's): a task that counted them
    would fail its own reference, so no task counts them. Grades `sandbox`'s workspace."""
    test_files = project.test_files
    graded = sorted(test for test in baseline.passed if test_file_for(test, test_files))
    if not graded:
        return set()
    untouched = TaskSpec(
        id=f"baseline/{project.key}", prompt="the untouched project",
        files={path: text for path, text in project.files.items() if path not in set(test_files)},
        hidden_tests={path: project.files[path] for path in test_files}, grade_command=test_command(project),
        limits=TaskLimits(grade_timeout_s=baseline.timeout_s), metadata={"graded_test_ids": graded},
    )
    result = grade(sandbox, untouched)
    return set() if result.error_kind else set(result.failing_tests)


def restore(sandbox: Sandbox, project: Project) -> None:
    """The workspace holds the pristine project again, and nothing else."""
    clear_workspace(sandbox)
    sandbox.put_archive(tar_files(project.files), ".")
