"""What a sandbox answers: a command's result and the errors of the sandbox itself."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field


class ExecResult(BaseModel):
    """Outcome of one command run inside a sandbox."""

    exit_code: int | None
    """Process exit status; None when the command was killed by a signal or never started."""

    stdout: str = ""
    """Captured standard output, decoded as UTF-8 with replacement, capped head+tail."""

    stderr: str = ""
    """Captured standard error, decoded and capped like stdout."""

    timed_out: bool = False
    """The timeout expired and the whole process group was killed."""

    truncated: bool = False
    """At least one stream exceeded the output cap; its middle was dropped."""

    oom_killed: bool = False
    """The kernel's OOM killer ended the command (or the sandbox)."""

    signal: int | None = None
    """Signal number that terminated the command, if any."""

    duration_ms: float = Field(default=0.0, ge=0)
    """Wall-clock time of the command inside the sandbox."""


class SandboxError(RuntimeError):
    """The sandbox infrastructure failed (not the command): dead container, broken channel."""

    def __init__(self, message: str, *, oom_killed: bool = False) -> None:
        super().__init__(message)
        self.oom_killed = oom_killed
        """The cause, where the backend knows it: the kernel's OOM killer ended the sandbox (so what
        ran in it exhausted its memory), as `ExecResult.oom_killed` says of one command."""


@dataclass(frozen=True)
class FailureReport:
    """Why a sandbox's channel died, as its backend found out: the text for people, the cause typed."""

    detail: str
    oom_killed: bool = False


class ArchiveTooLarge(SandboxError):
    """`get_archive` refused: the files under the path add up to more than `max_bytes`.

    Decided inside the sandbox from file sizes before anything is read; the sandbox is fine."""


class FileTooLarge(SandboxError):
    """`read_file` refused: the file is larger than `max_bytes` (checked before reading)."""


class SealingUnavailable(SandboxError):
    """`put_sealed_archive` refused: this backend runs commands with the supervisor's own identity
    (bubblewrap, one uid), so nothing it could write would be out of their reach. The sandbox is fine."""
