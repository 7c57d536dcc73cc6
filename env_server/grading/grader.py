"""Preparing a task's workspace and grading a submission with checks the agent never saw.

Grading runs in a *fresh* sandbox (docs/decisions/040-grade-in-a-fresh-sandbox.md): the
agent's workspace is copied out as a tar (bounded in size), cleaned on the host (no bytecode,
caches, VCS data, links, interpreter hooks or test configuration the task did not ship), and
extracted into a new sandbox. No process of the agent exists there, and nothing outside the
workspace (/tmp, $HOME, user site-packages) carries over.

Two modes (docs/decisions/042-call-table-grading.md, 043-pytest-mode-hardening.md):
- call table (`TaskSpec.hidden_calls`): only the calls' inputs enter the sandbox; the results
  are compared on the host (`env_server.grading.call_checks`). The solution cannot reach the verdict.
- pytest (`TaskSpec.hidden_tests`): the hidden tests and their canaries sit in a grader
  directory outside the workspace that the run cannot write (the guard, `env_server/grading/in_sandbox/pytest_guard.py`,
  confines it with Landlock before any submission code starts, decision 055; on Docker the
  directory is also sealed, owned by the supervisor, which the guard accepts where Landlock is
  missing, decision 058), and pytest runs
  from there in importlib mode under fresh module names. What the solution can still do in the
  test process is detected: only test ids found in the hidden files count (an injected test is
  ignored and flagged, a missing one fails), canaries copied from the file's own tests
  (`env_server/grading/canaries.py`, decision 056) must fail and report, the guard's exit status says
  whether any process outlived the run, and the report is read when no process of it is left.

`grade` never raises for what the workspace holds: that is a reward-0 `grading_error`.
Only a dead agent sandbox or a grading sandbox that cannot be opened raises `SandboxError`.
"""

from __future__ import annotations

import ast
import builtins
import collections
import io
import random
import re
import shlex
import sys
import tarfile
import time
import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from env_server.grading import call_checks
from env_server.grading import canaries as canaries_module
from env_server.grading.in_sandbox.pytest_guard import NO_CONFINEMENT_STATUS, NO_SUBREAPER_STATUS, ORPHANS_STATUS
from env_server.models import ErrorKind, MonitorFlag, TaskSpec, workspace_path
from sandbox import ArchiveTooLarge, FileTooLarge, Sandbox, SandboxError, SealingUnavailable

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
_BUILTIN_NAMES = sorted(name for name in dir(builtins) if not name.startswith("_"))
# Submitted code that mentions these reaches into the test runner, its report or its
# expectations. In pytest mode the solution shares a process (and a disk) with the tests, so
# these can only be detected, not prevented (docs/decisions/043-pytest-mode-hardening.md).
_TAMPER = re.compile(
    r"\b_pytest\b|\bpytest_(?:runtest|collection|report|sessionfinish|configure|terminal|generate)\w*"
    r"|\bjunit\w*|report\.xml|\bsys\.modules\s*\[\s*['\"]_?pytest|\bos\._exit\b|\bpytest\.(?:skip|xfail|exit)\b"
    r"|\bPR_SET_CHILD_SUBREAPER\b|/proc/\d*\w*/(?:mem|fd)\b|\bptrace\b|\bgc\.get_(?:objects|referrers)\b"
    # Reading the calling test's frame (its `expected` local) from the solution.
    r"|\bf_back\b|\bf_locals\b|\b_getframe\b|\binspect\.(?:stack|currentframe|getouterframes)\b"
    # A new comparison method: the way to make a pytest `assert result == expected` lie.
    r"|\bdef __(?:eq|ne)__\b|\b__(?:eq|ne)__\s*="
    # Searching the disk for the test files (their expected values are in them in pytest mode).
    r"|\bglob\b|\bos\.(?:walk|listdir|scandir)\b|\brglob\b|\bco_filename\b|\*test|\btest_\w*\.py\b"
    # Replacing builtins the tests call (`all`, `abs`, ...) process-wide.
    r"|\bbuiltins\b|\b__builtins__\b"
    # A module-level name that a test's `from solution import *` would put over a builtin.
    rf"|^(?:def|class)\s+(?:{'|'.join(_BUILTIN_NAMES)})\b|^(?:{'|'.join(_BUILTIN_NAMES)})\s*(?::[^=]*)?=(?!=)",
    re.MULTILINE,
)
# Grader internals a report or traceback may name; scrubbed from what the policy can see.
_GRADER_PATHS = re.compile(r"/(?:tmp|dev/shm)/grade-[0-9a-f]{32}[^\s'\"]*")


MAX_REPORT_BYTES = 32 * 1024 * 1024
"""A junit report larger than this is not read (the run counts as reporting nothing)."""


def pytest_command(import_root: str = ".") -> str:
    """How hidden tests run: `-P` keeps the workspace off `sys.path` while Python and pytest
    start, and `import_root` is appended, not prepended, so a workspace `pytest.py` or `re.py`
    shadows nothing. The process ends with `os._exit` once pytest returns, so at-exit hooks
    the solution registered never run (they could rewrite the report)."""
    bootstrap = (
        f'import os, sys, pytest; sys.path.append("{import_root}"); status = int(pytest.console_main()); '
        "sys.stdout.flush(); sys.stderr.flush(); os._exit(status)"
    )
    return f"python3 -P -c {shlex.quote(bootstrap)} -q -p no:cacheprovider"


GRADE_COMMAND = pytest_command()
"""The grade command of tasks whose code lives at the workspace root."""

# The grading command's environment: no bytecode written, no user site, no plugin autoloading (an
# agent-made `*.dist-info` with a `pytest11` entry point would otherwise load), no extra options.
# Python and pytest load from the image's own bytecode (decision 137); the graded copy holds none
# (decision 040) and the run writes none.
GRADE_ENV: dict[str, str] = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONPATH": "",
    "PYTHONSTARTUP": "",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTEST_ADDOPTS": "",
    "PYTEST_PLUGINS": "",
}


class GradingConfig(BaseModel):
    """How submissions are graded."""

    model_config = ConfigDict(extra="forbid")

    monitor_penalty: float = Field(default=0.0, ge=0.0, le=1.0)
    """Subtracted from the reward once per distinct monitor flag (the reward stays >= 0). 0 flags only."""

    zero_reward_flags: list[MonitorFlag] = Field(default_factory=lambda: [MonitorFlag.GRADER_TAMPER, MonitorFlag.GRADING_STRAY_PROCESS])
    """Flags that set the reward to 0 outright: the verdict cannot be trusted when they are raised."""

    output_chars: int = Field(default=8000, ge=0)
    """How much of the grading output `GradeResult.output` keeps (its tail)."""

    max_workspace_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """A workspace larger than this is not graded (reward 0, `grading_error`); bounds grading memory."""


class GradeResult(BaseModel):
    """The verdict on one submission."""

    reward: float
    """In [0, 1]: passed/total (`fraction`) or all-or-nothing (`binary`), minus monitor penalties."""

    tests_passed: int
    """Hidden tests (or calls) that passed (skipped tests count as not passed)."""

    tests_total: int
    """Hidden tests (or calls) that count; when the task names its `graded_test_ids`, those."""

    failing_tests: list[str]
    """Ids of hidden tests that failed, errored, were skipped or never ran (`path::name`), or of
    calls that failed (`call 3: f(1, 2)`). Only ids the task itself defines, never names from the sandbox."""

    grading_ms: float
    """Wall-clock time of grading, sandbox start-up included."""

    output: str
    """Tail of the grading output, grader paths scrubbed (call tables: one host-written line per failing call)."""

    monitor_flags: list[MonitorFlag]
    """Flags from the episode's tool calls plus those the grader raised itself, sorted."""

    error_kind: ErrorKind | None = None
    """`grading_error` when the submission could not be graded because of what the workspace holds
    (reward 0); None when it was graded."""

    error: str | None = None
    """A short reason for `error_kind` (no grader paths, no hidden test names)."""


class TaskSetupError(RuntimeError):
    """A task's `setup_command` failed: the task, not the agent, is broken."""


class GradingUnavailable(RuntimeError):
    """The grading sandbox lacks what pytest-mode grading needs (e.g. Landlock): the service's
    fault, not the submission's; graded as a `grading_error` with this reason."""


class GradingError(Exception):
    """The submission cannot be graded because of what the workspace holds; the message is
    shown to the policy."""


def tar_files(
    files: Mapping[str, str | bytes], modes: Mapping[str, int] | None = None, directories: Mapping[str, int] | None = None
) -> bytes:
    """An uncompressed tar of `files` (mode 0644 unless `modes` says otherwise) and `directories`."""
    modes = modes or {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, mode in (directories or {}).items():
            info = tarfile.TarInfo(workspace_path(path))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
            archive.addfile(info)
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(workspace_path(path))
            info.size = len(data)
            info.mode = modes.get(path, 0o644)
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


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
    return "/".join(part for part in PurePosixPath(name).parts if part not in (".", "/", ".."))


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
    task's test files (over whatever the agent put at their paths, directories included): its
    visible and hidden tests, its test configuration, and everything it shipped inside a test
    directory (helpers, fixtures, expected outputs: what a test reads by a path relative to the
    workspace is the task's, never the agent's)."""
    shipped = set(task.files) | set(task.visible_tests)
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
    restored = {**task.visible_tests, **task.hidden_tests, **task.hidden_files}
    restored.update({path: task.files[path] for path in task.files if PurePosixPath(path).name in _TEST_INFRA_NAMES or _test_root(path)})
    for path, content in restored.items():
        _clear_path_for(kept, path)
        kept.files[path] = content.encode()
    kept.dropped.sort()
    return kept


def _clear_path_for(kept: Submission, path: str) -> None:
    """Make room for a grader file at `path`: no agent directory there, no agent file on its way,
    and the directories on its way searchable (an agent's `chmod 000` would hide it)."""
    prefix = path + "/"
    for name in [name for name in kept.files if name.startswith(prefix)]:
        del kept.files[name]
        kept.dropped.append(name)
    for name in [name for name in kept.directories if name == path or name.startswith(prefix)]:
        del kept.directories[name]
    kept.modes.pop(path, None)
    for parent in PurePosixPath(path).parents:
        name = parent.as_posix()
        if name == ".":
            continue
        if kept.files.pop(name, None) is not None:
            kept.dropped.append(name)
        kept.directories[name] = kept.directories.get(name, 0o755) | 0o700


def tamper_flags(submission: Submission, task: TaskSpec) -> list[MonitorFlag]:
    """Flags for what the submission tried on the grader (all of it was removed or ignored).

    TEST_CONFIG_EDIT: it added test configuration or interpreter hooks (dropped before the run).
    GRADER_TAMPER: agent-written Python reaches into pytest, its report, the process or the
    guard (more such references than the task's own file had), or shadows the runner's modules.
    """
    flags: set[MonitorFlag] = set()
    for path in submission.dropped:
        pure = PurePosixPath(path)
        if pure.name in _TEST_INFRA_NAMES or pure.suffix == ".pth":
            flags.add(MonitorFlag.TEST_CONFIG_EDIT)
        if _shadows_runner(pure) or any(part.endswith(_DROPPED_DIR_SUFFIXES) for part in pure.parts):
            flags.add(MonitorFlag.GRADER_TAMPER)
    if task.hidden_calls:
        # The verdict is reached outside the process that runs the solution: what its code says
        # about frames, builtins or test files cannot change it, and honest code may say it.
        return sorted(flags)
    # The whole original tree: the project's own tests and data are never the agent's doing.
    original = {**task.files, **task.visible_tests, **task.hidden_tests, **task.hidden_files}
    for path, content in submission.files.items():
        if not path.endswith(".py") or original.get(path, "").encode() == content:
            continue
        added = collections.Counter(_TAMPER.findall(content.decode(errors="replace")))
        added.subtract(_TAMPER.findall(original.get(path, "")))
        if any(count > 0 for count in added.values()):
            flags.add(MonitorFlag.GRADER_TAMPER)
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


def junit_failures(xml_text: str) -> dict[str, str]:
    """Failed or errored test id -> its failure message (the `message` attribute, else the text's last line)."""
    failures = {}
    for case in ElementTree.fromstring(xml_text).iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                lines = (child.text or "").strip().splitlines()
                failures[_test_id(case)] = child.get("message") or (lines[-1] if lines else child.tag)
                break
    return failures


def hidden_test_ids(hidden_tests: Mapping[str, str]) -> set[str]:
    """The ids (`dir/module::name`, `dir/module/Class::name`, parameters left off) pytest can
    collect from the hidden test files, read from their syntax tree: test functions, and test
    methods of test classes, inherited ones from classes of the same file included."""
    ids = set()
    for path, text in hidden_tests.items():
        module = PurePosixPath(path).with_suffix("").as_posix()
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                ids.add(f"{module}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids.update(f"{module}/{node.name}::{name}" for name in _test_methods(node, classes, set()))
    return ids


def _test_methods(node: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: set[str]) -> set[str]:
    seen.add(node.name)
    names = {item.name for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test")}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
            names |= _test_methods(classes[base.id], classes, seen)
    return names


def _known_id(reported: str, known: set[str]) -> str | None:
    """The known id a reported one stands for (parameters dropped; a report's module path may be
    relative to a deeper rootdir, so a known id ending in it matches), or None."""
    module, _, name = reported.partition("::")
    base = f"{module}::{name.split('[', 1)[0]}"
    if base in known:
        return base
    matches = [candidate for candidate in known if candidate.endswith("/" + base)]
    return matches[0] if len(matches) == 1 else None


class HiddenTestRun(BaseModel):
    """What the hidden-test run in the grading sandbox reported."""

    passed: list[str]
    failed: list[str]
    output: str
    stray_processes: bool
    """A process outlived the tests (or the guard did not report): the report is not trusted."""
    canary_passed: bool = False
    """A canary test (it must fail) was reported passed, or not reported at all while a real
    test of its file passed: the runner, its report or the test module was tampered with."""
    tests_changed: bool = False
    """A hidden test file or canary read back after the run differs from what was written."""
    error: str | None = None
    """The run could not be confined or trusted for a reason that is not the submission's doing."""


GRADER_ROOT = "/dev/shm"
"""Where each grading's own directory (hidden tests, canaries, guard, report) is made: outside
the workspace and outside every place the test run may write (`_WRITABLE`). /tmp stays
writable for the tests (AgentBench checks write there); /dev/shm does not."""

# Where a hidden-test run may create, change or remove files (besides the workspace and its
# report directory); everything else is read-only to it, whatever its uid (pytest_guard.py).
_WRITABLE = ("/tmp", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts")


_TEST_DIRECTORY_NAMES = frozenset({"tests", "test", "testing"})


def _test_root(path: str) -> str | None:
    """The outermost test directory on `path`'s way (`src/pkg/tests` of
    `src/pkg/tests/unit/data.json`), or None outside any."""
    parts = PurePosixPath(path).parent.parts
    depth = next((index for index, part in enumerate(parts) if part in _TEST_DIRECTORY_NAMES), None)
    return None if depth is None else PurePosixPath(*parts[: depth + 1]).as_posix()


def _suite_files(task: TaskSpec, prefix: str) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """The files of the grader's copy of the suite (relative to its root directory) and the
    canaries planted in each hidden module (module path -> [(class or '', name)]).

    The hidden tests (with canaries) sit under `prefix`, a fresh random directory name, so
    their module names (importlib mode: the path below the root) are new at every grading and
    nothing importable could have been prepared under them. Beside them, from the task's original
    tree (never the agent's copies): its `conftest.py` files on their way (fixtures), its data files
    in their directories, and the whole test directory that holds them, at any depth (a
    `tests/__init__.py` that `from . import Mixin` reads, a `test/common.py` helper, the
    `tests/resources/` a test finds beside its `__file__`). The suite root, the prefix and those
    test directories go first on `sys.path` (`pythonpath`), so a relative import finds the package
    `<prefix>.tests`, an absolute one (`from tests import BaseCase`) the grader's `tests`, and a
    bare sibling import the grader's copy, before anything in the workspace. Source directories
    never do: the solution is imported from the workspace."""
    original = {**task.files, **task.visible_tests}
    rng = random.Random(uuid.uuid4().int)
    graded = task.metadata.get("graded_test_ids")
    canaries: dict[str, list[tuple[str, str]]] = {}
    files: dict[str, str] = {}
    directories = set()
    test_directories = set()
    test_roots = {root for path in task.hidden_tests if (root := _test_root(path))}
    for path, text in task.hidden_tests.items():
        module = PurePosixPath(path).with_suffix("").as_posix()
        # Only a test the reference passes is copied into a canary (a copy of a test that fails
        # anyway, its assertion changed, would pass against an honest solution).
        copyable = None if not graded else lambda scope, name, module=module: _is_graded(module, scope, name, graded)
        files[f"{prefix}/{path}"], planted = canaries_module.plant(text, rng, copyable=copyable)
        canaries[module] = planted
        directories.update(parent.as_posix() for parent in PurePosixPath(path).parents)
        parent = PurePosixPath(path).parent
        if _TEST_DIRECTORY_NAMES & set(parent.parts):
            test_directories.add(parent.as_posix())
    for path, text in original.items():
        pure = PurePosixPath(path)
        parent = pure.parent.as_posix()
        if path in task.hidden_tests or pure.suffix == ".pyc":
            continue
        if (
            (pure.name == "conftest.py" and parent in directories)
            or _test_root(path) in test_roots
            or (pure.suffix != ".py" and parent in directories and parent != ".")
        ):
            files[f"{prefix}/{path}"] = text
    search = " ".join([".", prefix, *(f"{prefix}/{directory}" for directory in sorted(test_directories))])
    files["pytest.ini"] = f"[pytest]\npythonpath = {search}\n"
    return files, canaries


def _is_graded(module: str, scope: str, name: str, graded: Iterable[str]) -> bool:
    """Whether `module`'s test `name` (in class `scope`, or at module level when '') is among the
    graded ids (parameters ignored)."""
    wanted = f"{module}/{scope}::{name}" if scope else f"{module}::{name}"
    return any(test.split("[", 1)[0] == wanted for test in graded)


def run_hidden_tests(grader: Sandbox, task: TaskSpec, submission: Submission) -> HiddenTestRun:
    """Put the cleaned submission into `grader`'s workspace and the hidden tests (with canaries)
    into a grader directory outside it, and run them under the guard.

    The guard confines the run before any of the submission's code starts: it may write only
    the workspace, /tmp and the report directory, so the hidden tests cannot be rewritten, and
    they are read back and compared afterwards all the same. pytest runs from the grader's
    directory with its own empty configuration (`-c`, rootdir and confcutdir pinned there, no
    workspace conftest or config), in importlib mode (the tests' directories never go on
    `sys.path`; the workspace is appended after pytest started, for the solution's imports).
    The report goes to a directory created in the same command and is read only after the
    guard has killed every process the run left behind.
    """
    grader.put_archive(submission.tar(), ".")
    grader_dir = f"{GRADER_ROOT}/grade-{uuid.uuid4().hex}"
    suite = f"{grader_dir}/suite"
    prefix = f"m{uuid.uuid4().hex[:12]}"
    files, canaries = _suite_files(task, prefix)
    written = {f"suite/{path}": text.encode() for path, text in files.items()}
    written["pytest_guard.py"] = (resources.files("env_server.grading.in_sandbox") / "pytest_guard.py").read_bytes()
    try:
        # Owned by the supervisor, read-only to the run's uid: the confinement where the kernel
        # has no Landlock (gVisor); the bubblewrap backend has one uid, and Landlock alone (058).
        grader.put_sealed_archive(tar_files(written), grader_dir)
    except SealingUnavailable:
        grader.put_archive(tar_files(written), grader_dir)
    report_dir = f"{grader_dir}-report"  # the run's own: the sealed directory takes no new name
    targets = " ".join(shlex.quote(f"{suite}/{prefix}/{path}") for path in task.hidden_tests)
    tests = (
        f"{task.grade_command} -p no:cacheprovider -c {suite}/pytest.ini --rootdir={suite} --confcutdir={suite} "
        f"--import-mode=importlib --junitxml={report_dir}/report.xml -o junit_family=xunit2 {targets}"
    )
    writable = " ".join(f"--writable {shlex.quote(path)}" for path in (grader.spec.workdir, report_dir, *_WRITABLE))
    command = (
        f"mkdir -m 700 {report_dir} && exec python3 -I {grader_dir}/pytest_guard.py {writable} --sealed {grader_dir} "
        f"-- bash -c {shlex.quote(tests)}"
    )
    result = grader.exec(command, timeout_s=task.limits.grade_timeout_s, env=GRADE_ENV)
    output = _scrub_prefix(result.stdout + result.stderr, prefix)
    if result.exit_code == NO_CONFINEMENT_STATUS:
        return HiddenTestRun(passed=[], failed=[], output=output, stray_processes=False,
                             error="the grading sandbox cannot confine the tests (no Landlock in this kernel, no sealed files on this backend)")
    trusted = result.exit_code is not None and 0 <= result.exit_code < 100 and not result.timed_out
    if not trusted:
        reason = "timeout" if result.timed_out else {ORPHANS_STATUS: "a process outlived the tests", NO_SUBREAPER_STATUS: "no guard"}.get(
            result.exit_code or -1, f"the run ended abnormally (exit {result.exit_code})"
        )
        return HiddenTestRun(passed=[], failed=[], output=f"{output}\n[grader] {reason}", stray_processes=not result.timed_out)
    try:
        report = grader.read_file(f"{report_dir}/report.xml", max_bytes=MAX_REPORT_BYTES).decode(errors="replace")
        passed, failed = parse_junit(report)
    except (OSError, FileTooLarge, ElementTree.ParseError):
        passed, failed = [], []
        output += f"\n[grader] no test report (exit {result.exit_code})"
    passed = [_unprefixed(test, prefix) for test in passed]
    failed = [_unprefixed(test, prefix) for test in failed]
    for planted in canaries.values():
        for _, name in planted:
            output = output.replace(name, "<grader canary>")
    canary_passed = _canaries_betrayed(canaries, passed, failed)
    passed = [test for test in passed if not _canary_of(test, canaries)]
    failed = [test for test in failed if not _canary_of(test, canaries)]
    return HiddenTestRun(
        passed=passed, failed=failed, output=output, stray_processes=False, canary_passed=canary_passed,
        tests_changed=_suite_changed(grader, f"{grader_dir}/suite", files),
    )


def _unprefixed(test: str, prefix: str) -> str:
    return test.removeprefix(f"{prefix}/")


def _scrub_prefix(text: str, prefix: str) -> str:
    """Output without the grading's random module prefix (its tests' paths read as the task's)."""
    return text.replace(f"{prefix}/", "").replace(f"{prefix}.", "")


def _canary_of(test: str, canaries: Mapping[str, list[tuple[str, str]]]) -> str | None:
    """The hidden module a reported id is a canary of (any class of it: a canary inherited by a
    subclass reports under the subclass), or None."""
    module, _, name = test.partition("::")
    base = name.split("[", 1)[0]
    for hidden, planted in canaries.items():
        if (module == hidden or module.startswith(f"{hidden}/")) and any(base == canary for _, canary in planted):
            return hidden
    return None


def _canaries_betrayed(canaries: Mapping[str, list[tuple[str, str]]], passed: list[str], failed: list[str]) -> bool:
    """A canary reported passed, or a module whose canaries did not all report although one of
    its real tests passed (a stand-in for the module, or a runner that ran only some tests)."""
    if any(_canary_of(test, canaries) for test in passed):
        return True
    for hidden, planted in canaries.items():
        in_module = [test for test in passed + failed if test.partition("::")[0].split("/")[: hidden.count("/") + 1] == hidden.split("/")]
        reported = {test.partition("::")[2].split("[", 1)[0] for test in in_module}
        real_passed = any(test in passed and not _canary_of(test, canaries) for test in in_module)
        if real_passed and not {name for _, name in planted} <= reported:
            return True
    return False


def _suite_changed(grader: Sandbox, suite: str, files: Mapping[str, str]) -> bool:
    """Whether the grader's copy of the suite, read back after the run, differs from what was
    written (the guard's confinement makes this impossible; checked from the host all the same)."""
    try:
        archive = tarfile.open(fileobj=io.BytesIO(grader.get_archive(suite, max_bytes=MAX_REPORT_BYTES)), mode="r:")
    except (OSError, SandboxError, tarfile.TarError):
        return True
    found: dict[str, bytes] = {}
    with archive:
        for member in archive.getmembers():
            path = _member_path(member.name)
            if member.isreg():
                extracted = archive.extractfile(member)
                found[path] = extracted.read() if extracted else b""
            elif path and not member.isdir():
                return True
    return found != {path: text.encode() for path, text in files.items()}


class _Verdict(BaseModel):
    passed: list[str]
    failed: list[str]
    output: str
    flags: list[MonitorFlag]


def _grade_pytest(grader: Sandbox, task: TaskSpec, submission: Submission) -> _Verdict:
    run = run_hidden_tests(grader, task, submission)
    if run.error:
        raise GradingUnavailable(run.error)
    flags = [MonitorFlag.GRADING_STRAY_PROCESS] if run.stray_processes else []
    if run.canary_passed or run.tests_changed:
        flags.append(MonitorFlag.GRADER_TAMPER)
    # A task may name the tests that count (feature deletion: those its deletion broke);
    # otherwise every test its hidden files define. Each must pass; one that never reported
    # (deselected, crashed collection, a report cut short) counts as failed.
    graded = task.metadata.get("graded_test_ids")
    known = hidden_test_ids(task.hidden_tests)
    outcomes: dict[str, bool] = {}
    for test, ok in [*((test, True) for test in run.passed), *((test, False) for test in run.failed)]:
        base = test if graded and test in graded else _known_id(test, known)
        if base is None:
            flags.append(MonitorFlag.GRADING_UNKNOWN_TEST)
        else:
            outcomes[base] = outcomes.get(base, True) and ok
    counted = set(graded) if graded else known
    passed = sorted(test for test, ok in outcomes.items() if ok and test in counted)
    return _Verdict(passed=passed, failed=sorted(counted - set(passed)), output=run.output, flags=sorted(set(flags)))


def _grade_calls(grader: Sandbox, task: TaskSpec, submission: Submission, config: GradingConfig) -> _Verdict:
    grader.put_archive(submission.tar(), ".")
    run = call_checks.run_call_table(grader, task, results_limit_bytes=config.max_workspace_bytes)
    verdicts = call_checks.judge_calls(task, run.raw_results)
    failing = [verdict for verdict in verdicts if not verdict.passed]
    lines = [f"{verdict.check_id}: {verdict.reason}" for verdict in failing]
    return _Verdict(
        passed=[verdict.check_id for verdict in verdicts if verdict.passed],
        failed=[verdict.check_id for verdict in failing],
        output="\n".join([*lines, f"[grader] the call harness ended: {run.ended}"] if failing else lines),
        flags=[],
    )


def _workspace_archive(sandbox: Sandbox, limit_bytes: int) -> bytes:
    """The workspace as a tar, refused (GradingError) when its files add up to more than
    `limit_bytes`: the sandbox checks the sizes before it reads anything."""
    try:
        return sandbox.get_archive(".", max_bytes=limit_bytes)
    except ArchiveTooLarge:
        raise GradingError(f"the workspace holds more than {limit_bytes} bytes") from None


def grade(
    sandbox: Sandbox,
    task: TaskSpec,
    *,
    fresh_sandbox: Callable[[], Sandbox] | None = None,
    retire: Callable[[Sandbox], None] = Sandbox.close,
    monitor_flags: Iterable[MonitorFlag] = (),
    config: GradingConfig | None = None,
) -> GradeResult:
    """Grade the agent's workspace in `sandbox` with the task's hidden checks. Never raises for
    what the workspace holds (reward 0, `error_kind` `grading_error`).

    `fresh_sandbox` opens the sandbox the checks run in (e.g. a warm pool's checkout); by default
    `sandbox.open_fresh` (same backend and spec). Once the checks ran it is handed to `retire`, which
    closes it at once by default; the service's closes it in the background, so removing the container
    is not part of the submit's answer (decision 013).
    `monitor_flags` are the episode's flags (`scan_tool_call`); the penalty applies to them too.
    Raises `SandboxError` only when the agent's sandbox is dead or no grading sandbox opens.
    """
    config = config or GradingConfig()
    started = time.perf_counter()
    flags = {MonitorFlag(flag) for flag in monitor_flags}

    def failed(reason: str) -> GradeResult:
        return GradeResult(
            reward=0.0, tests_passed=0, tests_total=max(len(task.hidden_calls), len(task.hidden_tests), 1),
            failing_tests=[], grading_ms=(time.perf_counter() - started) * 1000, output=f"[grader] {reason}",
            monitor_flags=sorted(flags), error_kind=ErrorKind.GRADING_ERROR, error=reason,
        )

    try:
        submission = clean_submission(_workspace_archive(sandbox, config.max_workspace_bytes), task)
    except GradingError as error:
        return failed(str(error))
    except SandboxError as error:
        if not sandbox.is_alive():
            raise
        return failed(f"the workspace could not be copied out ({_short(error)})")
    except Exception as error:  # e.g. an unreadable file or a corrupt member: the workspace's doing
        return failed(f"the workspace could not be copied out ({type(error).__name__})")
    flags |= set(tamper_flags(submission, task))
    grader = (fresh_sandbox or sandbox.open_fresh)()
    try:
        if task.hidden_calls:
            verdict = _grade_calls(grader, task, submission, config)
        else:
            verdict = _grade_pytest(grader, task, submission)
    except GradingUnavailable as error:
        return failed(str(error))
    except Exception as error:  # the submission's code was running: a sandbox it broke is its doing
        return failed(f"the submission could not be graded ({type(error).__name__})")
    finally:
        retire(grader)
    flags |= set(verdict.flags)
    total = len(verdict.passed) + len(verdict.failed)
    reward = task.reward_for(len(verdict.passed), total)
    if flags & set(config.zero_reward_flags):
        reward = 0.0
    reward = max(0.0, reward - config.monitor_penalty * len(flags))
    output = _GRADER_PATHS.sub("<grader>", verdict.output)
    return GradeResult(
        reward=reward,
        tests_passed=len(verdict.passed),
        tests_total=total,
        failing_tests=verdict.failed,
        grading_ms=(time.perf_counter() - started) * 1000,
        output=output[-config.output_chars :] if config.output_chars else "",
        monitor_flags=sorted(flags),
    )


def _short(error: Exception) -> str:
    """An exception's type and the start of its message, grader paths scrubbed."""
    return _GRADER_PATHS.sub("<grader>", f"{type(error).__name__}: {error}")[:160]
