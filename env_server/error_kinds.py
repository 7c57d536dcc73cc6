"""Classification of tool outcomes into the closed `ErrorKind` enum.

The rules are ordered, first match wins; docs/api.md ("Error kinds") states them for clients.
"""

from __future__ import annotations

import re

from env_server.models import ErrorKind
from sandbox.base import ExecResult

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
