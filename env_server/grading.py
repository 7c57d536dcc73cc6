"""Preparing a task's workspace and grading a submission with tests the agent never saw.

Grading runs in a *fresh* sandbox (docs/decisions/040-grade-in-a-fresh-sandbox.md): the
agent's workspace is copied out as a tar, cleaned on the host (no bytecode, caches, VCS
data, links, interpreter hooks or test configuration the task did not ship), and extracted
into a new sandbox together with the hidden tests. No process of the agent exists there, and
nothing outside the workspace (/tmp, $HOME, user site-packages) carries over.
"""

from __future__ import annotations

import io
import re
import shlex
import sys
import tarfile
import time
import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from env_server.models import TaskSpec
from env_server.monitor import GRADER_TAMPER, TEST_CONFIG_EDIT
from sandbox.base import Sandbox

# Nothing under these directory names reaches the grader: bytecode and tool caches can hold
# a deleted function's compiled body, VCS data its history, package metadata a plugin entry point.
_DROPPED_DIRS = frozenset(
    {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".pytype", ".pyre", ".hypothesis",
     ".git", ".hg", ".svn", ".tox", ".nox", ".venv", ".local", ".cache"}
)
_DROPPED_DIR_SUFFIXES = (".dist-info", ".egg-info")
_DROPPED_SUFFIXES = (".pyc", ".pyo", ".pth")
# Files that change how Python or pytest start; only the task's own copies are kept.
_TEST_INFRA_NAMES = frozenset(
    {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".pytest.ini",
     "sitecustomize.py", "usercustomize.py"}
)
# Top-level modules that would shadow the test runner or the standard library (pytest puts a
# test's root directory first on sys.path while collecting it).
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", *sys.stdlib_module_names})
# Submitted code that mentions these reaches into the test runner or its report.
_TAMPER = re.compile(
    r"\b_pytest\b|\bpytest_(?:runtest|collection|report|sessionfinish|configure|terminal)\w*"
    r"|\bjunit\w*|report\.xml|\bsys\.modules\s*\[\s*['\"]_?pytest|\bos\._exit\b|\bpytest\.(?:skip|xfail|exit)\b"
)
STRAY_PROCESS = "grading_stray_process"
"""Flag: a process other than the test run was alive when it ended; the report is not trusted."""


def pytest_command(import_root: str = ".") -> str:
    """How hidden tests run: `-P` keeps the workspace off `sys.path` while Python and pytest
    start, and `import_root` is appended, not prepended, so a workspace `pytest.py` or `re.py`
    shadows nothing."""
    bootstrap = f'import sys, pytest; sys.path.append("{import_root}"); sys.exit(pytest.console_main())'
    return f"python3 -P -c {shlex.quote(bootstrap)} -q -p no:cacheprovider"


GRADE_COMMAND = pytest_command()
"""The grade command of tasks whose code lives at the workspace root."""

# The grading command's environment: no user site, no plugin autoloading (an agent-made
# `*.dist-info` with a `pytest11` entry point would otherwise load), no extra options.
GRADE_ENV: dict[str, str] = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONPYCACHEPREFIX": "/tmp/.grader-pycache",
    "PYTHONNOUSERSITE": "1",
    "PYTHONPATH": "",
    "PYTHONSTARTUP": "",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTEST_ADDOPTS": "",
    "PYTEST_PLUGINS": "",
}

def prewarm_grader(sandbox: Sandbox) -> Sandbox:
    """Compile Python's and pytest's bytecode into the grading cache of a sandbox no agent has
    touched (a warm pool's `start` hook), so `import pytest` at grade time takes about 0.3 s
    instead of 1 s. The cache sits outside the workspace and holds no task code."""
    scratch = "/tmp/.grader-prewarm"
    sandbox.exec(
        f"mkdir -p {scratch} && cd {scratch} && echo 'def test_x(): pass' > test_x.py && "
        f"PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX={GRADE_ENV['PYTHONPYCACHEPREFIX']} "
        f"{GRADE_COMMAND} --junitxml=r.xml test_x.py >/dev/null; cd / && rm -rf {scratch}",
        timeout_s=60,
    )
    return sandbox


# Runs after the tests, in the same command: counts processes other than init, the supervisor
# (session 1), this command's shell and itself. One left alive (e.g. started by the submission
# at import, in a new session) could rewrite the report before the grader reads it.
_COUNT_STRAYS = (
    "python3 -I -c 'import os\nme = {os.getpid(), os.getppid(), 1}\nn = 0\n"
    "for p in filter(str.isdigit, os.listdir(\"/proc\")):\n"
    "    try:\n        n += int(p) not in me and os.getsid(int(p)) != 1\n"
    "    except OSError:\n        pass\nprint(\"grading-strays=%d\" % n)'"
)
_STRAYS_LINE = re.compile(r"^grading-strays=(\d+)$", re.MULTILINE)


class GradingConfig(BaseModel):
    """How submissions are graded."""

    model_config = ConfigDict(extra="forbid")

    monitor_penalty: float = Field(default=0.0, ge=0.0, le=1.0)
    """Subtracted from the reward once per distinct monitor flag (the reward stays >= 0). 0 flags only."""

    output_chars: int = Field(default=8000, ge=0)
    """How much of the test run's output `GradeResult.output` keeps (its tail)."""


class GradeResult(BaseModel):
    """The verdict on one submission."""

    reward: float
    """In [0, 1]: passed/total (`fraction`) or all-or-nothing (`binary`), minus monitor penalties."""

    tests_passed: int
    """Hidden tests that passed (skipped tests count as not passed)."""

    tests_total: int
    """Hidden tests that ran; when the task names its `graded_test_ids`, those."""

    failing_tests: list[str]
    """Ids (`path::name`) of hidden tests that failed, errored or were skipped."""

    grading_ms: float
    """Wall-clock time of grading, sandbox start-up included."""

    output: str
    """Tail of the test run's stdout and stderr."""

    monitor_flags: list[str]
    """Flags from the episode's tool calls plus those the grader raised itself."""


class TaskSetupError(RuntimeError):
    """A task's `setup_command` failed: the task, not the agent, is broken."""


def tar_files(
    files: Mapping[str, str | bytes], modes: Mapping[str, int] | None = None, directories: Mapping[str, int] | None = None
) -> bytes:
    """An uncompressed tar of `files` (mode 0644 unless `modes` says otherwise) and `directories`."""
    modes = modes or {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, mode in (directories or {}).items():
            info = tarfile.TarInfo(_relative(path))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
            archive.addfile(info)
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(_relative(path))
            info.size = len(data)
            info.mode = modes.get(path, 0o644)
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _relative(path: str) -> str:
    """A task-relative path, refusing anything that could land outside the workspace."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ValueError(f"task file path must be relative and inside the workspace: {path!r}")
    return pure.as_posix()


def prepare_workspace(sandbox: Sandbox, task: TaskSpec) -> None:
    """Write the task's files and visible tests, then run its setup command. Nothing hidden."""
    files = {**task.files, **task.visible_tests}
    if files:
        sandbox.put_archive(tar_files(files), ".")
    if task.setup_command:
        result = sandbox.exec(task.setup_command, timeout_s=task.limits.grade_timeout_s)
        if result.exit_code != 0:
            raise TaskSetupError(
                f"setup of {task.id} failed (exit {result.exit_code}): {(result.stderr or result.stdout)[-2000:]}"
            )


def _member_path(name: str) -> str:
    """Workspace-relative path of a `get_archive` member (`./x` -> `x`; the root -> '')."""
    return "/".join(part for part in PurePosixPath(name).parts if part not in (".", "/"))


class Submission(BaseModel):
    """The agent's workspace after cleaning: what the grader will see."""

    files: dict[str, bytes]
    """Regular files kept, workspace-relative."""
    modes: dict[str, int]
    """Permission bits of the kept files (set-id and sticky bits cleared)."""
    directories: dict[str, int]
    """Directories (empty ones too) and their permission bits."""
    dropped: list[str]
    """Paths removed: links, caches, bytecode, test infrastructure the task did not ship."""

    def tar(self) -> bytes:
        return tar_files(self.files, self.modes, self.directories)


def _shadows_runner(pure: PurePosixPath) -> bool:
    """A top-level module or package file that `import pytest`/`import re` could pick up."""
    top = pure.parts[0].split(".", 1)[0]
    return top in _RUNNER_MODULES and pure.suffix in (".py", ".so")


def _dropped(path: str, member: tarfile.TarInfo, shipped: set[str]) -> bool:
    pure = PurePosixPath(path)
    if member.isdir():
        return any(part in _DROPPED_DIRS or part.endswith(_DROPPED_DIR_SUFFIXES) for part in pure.parts)
    return (
        not member.isreg()
        or any(part in _DROPPED_DIRS or part.endswith(_DROPPED_DIR_SUFFIXES) for part in pure.parts[:-1])
        or pure.suffix in _DROPPED_SUFFIXES
        or path not in shipped and (pure.name in _TEST_INFRA_NAMES or _shadows_runner(pure))
    )


def clean_submission(workspace_tar: bytes, task: TaskSpec) -> Submission:
    """Keep regular files and directories only, drop what could leak or subvert, restore the
    task's test files."""
    shipped = {_relative(path) for path in task.files}
    kept = Submission(files={}, modes={}, directories={}, dropped=[])
    with tarfile.open(fileobj=io.BytesIO(workspace_tar), mode="r:*") as archive:
        for member in archive.getmembers():
            path = _member_path(member.name)
            if not path:
                continue
            if _dropped(path, member, shipped):
                kept.dropped.append(path)
            elif member.isdir():
                kept.directories[path] = member.mode & 0o777
            else:
                extracted = archive.extractfile(member)
                kept.files[path] = extracted.read() if extracted else b""
                kept.modes[path] = member.mode & 0o777
    # The task's own tests and test configuration are the grader's, whatever the agent did to them.
    for path, content in {**task.visible_tests, **task.hidden_tests}.items():
        kept.files[_relative(path)] = content.encode()
        kept.modes.pop(_relative(path), None)
    for path in shipped:
        if PurePosixPath(path).name in _TEST_INFRA_NAMES:
            kept.files[path] = task.files[path].encode()
            kept.modes.pop(path, None)
    kept.dropped.sort()
    return kept


def tamper_flags(submission: Submission, task: TaskSpec) -> list[str]:
    """Flags for what the submission tried on the grader (all of it was removed or ignored).

    TEST_CONFIG_EDIT: it added test configuration or interpreter hooks (dropped before the run).
    GRADER_TAMPER: agent-written Python reaches into pytest, its report or the process, or
    shadows the runner's own modules.
    """
    flags = set()
    for path in submission.dropped:
        pure = PurePosixPath(path)
        if pure.name in _TEST_INFRA_NAMES or pure.suffix == ".pth":
            flags.add(TEST_CONFIG_EDIT)
        if _shadows_runner(pure) or any(part.endswith(_DROPPED_DIR_SUFFIXES) for part in pure.parts):
            flags.add(GRADER_TAMPER)
    original = {_relative(path): text for path, text in {**task.files, **task.hidden_tests}.items()}
    for path, content in submission.files.items():
        if not path.endswith(".py") or original.get(path, "").encode() == content:
            continue
        if _TAMPER.search(content.decode(errors="replace")):
            flags.add(GRADER_TAMPER)
    return sorted(flags)


def _test_id(case: ElementTree.Element) -> str:
    module = case.get("classname", "").replace(".", "/")
    return f"{module}::{case.get('name', '?')}" if module else case.get("name", "?")


def parse_junit(xml_text: str) -> tuple[list[str], list[str]]:
    """(passed ids, not-passed ids) from a pytest junit report."""
    passed: list[str] = []
    failed: list[str] = []
    for case in ElementTree.fromstring(xml_text).iter("testcase"):
        outcome = {child.tag for child in case}
        (failed if outcome & {"failure", "error", "skipped"} else passed).append(_test_id(case))
    return passed, failed


def _reward(passed: int, total: int, task: TaskSpec) -> float:
    if total == 0:
        return 0.0
    if task.reward_mode == "binary":
        return 1.0 if passed == total else 0.0
    return passed / total


class HiddenTestRun(BaseModel):
    """What the hidden-test run in the grading sandbox reported."""

    passed: list[str]
    failed: list[str]
    output: str
    stray_processes: bool
    """A process outlived the tests (or the count is missing): the report is not trusted."""


def run_hidden_tests(grader: Sandbox, task: TaskSpec, submission: Submission) -> HiddenTestRun:
    """Put the cleaned submission and hidden tests into `grader` and run them.

    The report goes to a fresh, randomly named directory outside the workspace, created in the
    same command that runs pytest, so no file the agent wrote can stand in for it.
    """
    grader.put_archive(submission.tar(), ".")
    report_dir = f"/tmp/grade-{uuid.uuid4().hex}"
    targets = " ".join(shlex.quote(_relative(path)) for path in task.hidden_tests)
    command = (
        f"mkdir -m 700 {report_dir} && {task.grade_command} -p no:cacheprovider "
        f"--junitxml={report_dir}/report.xml -o junit_family=xunit2 {targets}; status=$?; {_COUNT_STRAYS}; exit $status"
    )  # the exit status is the test run's, so a missing report names why pytest ended
    result = grader.exec(command, timeout_s=task.limits.grade_timeout_s, env=GRADE_ENV)
    counts = [int(found) for found in _STRAYS_LINE.findall(result.stdout)]
    strays = not counts or max(counts) > 0
    try:
        report = grader.read_file(f"{report_dir}/report.xml").decode(errors="replace")
        passed, failed = parse_junit(report)
    except (FileNotFoundError, ElementTree.ParseError):
        reason = "timeout" if result.timed_out else f"exit {result.exit_code}"
        passed, failed = [], [f"<no test report: {reason}>"]
    return HiddenTestRun(passed=passed, failed=failed, output=result.stdout + result.stderr, stray_processes=strays)


def grade(
    sandbox: Sandbox,
    task: TaskSpec,
    *,
    fresh_sandbox: Callable[[], Sandbox] | None = None,
    monitor_flags: Iterable[str] = (),
    config: GradingConfig | None = None,
) -> GradeResult:
    """Grade the agent's workspace in `sandbox` with the task's hidden tests.

    `fresh_sandbox` opens the sandbox the tests run in (e.g. a warm pool's checkout); it is
    closed afterwards. By default it opens one like `sandbox` with the same backend.
    `monitor_flags` are the episode's flags (`scan_tool_call`); the penalty applies to them too.
    """
    config = config or GradingConfig()
    started = time.perf_counter()
    submission = clean_submission(sandbox.get_archive("."), task)
    flags = sorted(set(monitor_flags) | set(tamper_flags(submission, task)))
    with (fresh_sandbox or _same_kind_as(sandbox))() as grader:
        run = run_hidden_tests(grader, task, submission)
    passed, failed = run.passed, run.failed
    if run.stray_processes:
        flags = sorted({*flags, STRAY_PROCESS})
        passed, failed = [], sorted({*passed, *failed}) or ["<stray process during grading>"]
    # A task may name the tests that count (feature deletion: those its deletion broke). Each
    # must pass; one that never reported (deselected, crashed collection) counts as failed.
    graded = task.metadata.get("graded_test_ids")
    if graded:
        passed = [test for test in passed if test in set(graded)]
        failed = sorted(set(graded) - set(passed))
    total = len(passed) + len(failed)
    reward = max(0.0, _reward(len(passed), total, task) - config.monitor_penalty * len(flags))
    return GradeResult(
        reward=reward,
        tests_passed=len(passed),
        tests_total=total,
        failing_tests=failed,
        grading_ms=(time.perf_counter() - started) * 1000,
        output=run.output[-config.output_chars :] if config.output_chars else "",
        monitor_flags=flags,
    )


def _same_kind_as(sandbox: Sandbox) -> Callable[[], Sandbox]:
    """Opens a sandbox of the same backend and spec (backends are constructed from a spec)."""
    return lambda: type(sandbox)(sandbox.spec)
