"""Classification of tool outcomes into the closed `ErrorKind` enum: the one place that decides a
kind from what happened (a command's result, a file operation's errno, a sandbox's death), which
kinds are the service's own messages, and when a kind repeats into `repeated_failure`.

The rules are ordered, first match wins; docs/api.md ("Error kinds") states them for clients.
"""

from __future__ import annotations

import errno
import re

from env_server.models import ErrorKind
from sandbox.base import ExecResult, SandboxError

REPEAT_THRESHOLD = 3
"""The same kind this many times in a row is reported as `repeated_failure`."""

_PYTEST_FAILED = re.compile(r"\b\d+ (failed|error|errors)\b")
_PYTHON_SYNTAX_ERROR = re.compile(r"^(SyntaxError|IndentationError|TabError)\b", re.MULTILINE)
_PERMISSION_DENIED = re.compile(r"Permission denied|Operation not permitted|Read-only file system")
_NO_SUCH_FILE = re.compile(r"No such file or directory|can't open file|FileNotFoundError")


def classify_exec(result: ExecResult, *, tests_expected: bool = False) -> ErrorKind | None:
    """Kind of a command's outcome; `tests_expected` marks a run of the task's test command."""
    if result.oom_killed:
        return ErrorKind.OOM
    if result.timed_out:
        return ErrorKind.TIMEOUT
    if result.exit_code == 0:
        return None
    if result.exit_code == 127:
        return ErrorKind.COMMAND_NOT_FOUND
    text = f"{result.stdout}\n{result.stderr}"
    if tests_expected or (result.exit_code == 1 and _PYTEST_FAILED.search(result.stdout)):
        return ErrorKind.TEST_FAILURE
    if result.exit_code == 126 or _PERMISSION_DENIED.search(result.stderr):
        return ErrorKind.PERMISSION_DENIED
    if _PYTHON_SYNTAX_ERROR.search(text):
        return ErrorKind.SYNTAX_ERROR
    if _NO_SUCH_FILE.search(result.stderr):
        return ErrorKind.FILE_NOT_FOUND
    return ErrorKind.NONZERO_EXIT


_ERRNO_KINDS = {
    errno.ENOENT: ErrorKind.FILE_NOT_FOUND,
    errno.ENOTDIR: ErrorKind.FILE_NOT_FOUND,
    errno.EACCES: ErrorKind.PERMISSION_DENIED,
    errno.EPERM: ErrorKind.PERMISSION_DENIED,
    errno.EROFS: ErrorKind.PERMISSION_DENIED,
}


def classify_os_error(exc: OSError) -> ErrorKind:
    """Kind of a file operation's failure, from its errno (anything unlisted: the tool failed)."""
    return _ERRNO_KINDS.get(exc.errno, ErrorKind.RUNTIME_ERROR)


def classify_sandbox_death(exc: SandboxError) -> ErrorKind:
    """Kind of the failure that killed the agent's sandbox, from its typed cause: memory exhausted
    by what ran in it, else the sandbox failed."""
    return ErrorKind.OOM if exc.oom_killed else ErrorKind.SANDBOX_ERROR


RAW_TEXT_KINDS = frozenset(
    {ErrorKind.TOOL_NOT_FOUND, ErrorKind.JSON_DECODE, ErrorKind.TYPE_ERROR, ErrorKind.RUNTIME_ERROR, ErrorKind.TOO_MANY_CALLS}
)
"""Kinds whose error message comes from the service itself and is short and exact."""


class FailureStreak:
    """Counts consecutive steps that failed with the same kind."""

    def __init__(self) -> None:
        self._kind: ErrorKind | None = None
        self._count = 0

    def observe(self, kind: ErrorKind | None) -> ErrorKind | None:
        """Record one step's kind; return the kind to report (`repeated_failure` on a streak)."""
        if kind is None or kind is ErrorKind.SANDBOX_ERROR:
            # Infrastructure failures are not the policy's doing and never count as a streak.
            self._kind, self._count = None, 0
            return kind
        self._count = self._count + 1 if kind is self._kind else 1
        self._kind = kind
        return ErrorKind.REPEATED_FAILURE if self._count >= REPEAT_THRESHOLD else kind
