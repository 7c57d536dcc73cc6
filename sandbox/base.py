"""The surface every sandbox backend offers: run a command, move files, die cleanly."""

from __future__ import annotations

import abc
from typing import Self

from pydantic import BaseModel, Field

from sandbox.spec import SandboxSpec


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


class ArchiveTooLarge(SandboxError):
    """`get_archive` refused: the files under the path add up to more than `max_bytes`.

    Decided inside the sandbox from file sizes before anything is read; the sandbox is fine."""


class FileTooLarge(SandboxError):
    """`read_file` refused: the file is larger than `max_bytes` (checked before reading)."""


class Sandbox(abc.ABC):
    """One isolated workspace. Paths are relative to the workspace unless absolute."""

    spec: SandboxSpec
    id: str

    @abc.abstractmethod
    def exec(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None) -> ExecResult:
        """Run `command` with `bash -c` in its own process group under a timeout."""

    @abc.abstractmethod
    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Return the bytes of a regular file; raises FileNotFoundError, PermissionError,
        IsADirectoryError, OSError (not a regular file), or FileTooLarge beyond `max_bytes`
        (default: the spec's `max_transfer_mb`)."""

    @abc.abstractmethod
    def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file, creating parent directories."""

    @abc.abstractmethod
    def put_archive(self, tar_bytes: bytes, dest: str = ".") -> None:
        """Extract an uncompressed tar archive under `dest`."""

    @abc.abstractmethod
    def get_archive(self, path: str = ".", max_bytes: int | None = None) -> bytes:
        """Return an uncompressed tar archive of `path` (symlinks, FIFOs kept as such; sockets
        skipped); raises ArchiveTooLarge when its files add up to more than `max_bytes`
        (default: the spec's `max_transfer_mb`), OSError for an unreadable member."""

    @abc.abstractmethod
    def is_alive(self) -> bool:
        """Cheap liveness probe: the supervisor answers."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop and remove the sandbox. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
