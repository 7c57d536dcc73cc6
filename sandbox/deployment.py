"""Where a sandbox lives: the surface a backend offers to start one and remove it again.

A deployment starts the sandbox with the supervisor's bootstrap (`sandbox.supervisor.
bootstrap_argv`) as its main process and hands back that process's stdin and stdout; everything
done in the sandbox afterwards (commands, files, archives) goes over the channel the runtime opens
on them and belongs to `sandbox.runtime.Sandbox`, the same for every backend.
"""

from __future__ import annotations

import abc
import shutil
import uuid
from pathlib import Path
from typing import ClassVar, Self

from sandbox.channel import SupervisorStreams
from sandbox.spec import BackendSpec

BASE_ENV = {"HOME": "/tmp", "LANG": "C.UTF-8"}
"""Environment every backend gives the supervisor and so every command: the root filesystem is
read-only, so HOME points at the writable /tmp."""


INBOX_MOUNT = "/run/inbox"
"""Where a sandbox sees its inbox (`SandboxSpec.inbox_root`); its commands can never write there."""


class Deployment(abc.ABC):
    """One sandbox's place on a backend. Holds nothing until `start`; `stop` frees everything."""

    default_start_timeout_s: ClassVar[float]
    """The backend's limit on start-up until the supervisor answers its first ping."""

    def __init__(self, spec: BackendSpec, start_timeout_s: float | None = None):
        """`start_timeout_s` replaces the backend's default limit on start-up (the service sets its
        `sandbox_start_timeout_s`, so a hung start ends when the request waiting for it gave up)."""
        self.spec = spec
        self.id = uuid.uuid4().hex[:16]
        """Names the sandbox in logs and labels."""
        self.start_timeout_s = start_timeout_s or self.default_start_timeout_s
        """Limit on start-up until the supervisor answers its first ping."""
        self.inbox_dir = None if spec.inbox_root is None else Path(spec.inbox_root) / self.id
        """This sandbox's inbox on the host, seen inside at `INBOX_MOUNT`; None without one."""
        self.supervisor_writes_inbox = False
        """Whether the sandbox's supervisor, and nothing else in it, may write into its inbox, so
        an archive of the workspace can reach the host without crossing the channel. Only where
        the supervisor has an identity of its own (Docker: root, owning the inbox, while commands
        run as `spec.user`); a backend that can grant it sets it."""

    def _create_inbox(self) -> None:
        """Make the inbox directory before the sandbox mounts it (readable, not writable, by the
        sandbox's user: only the host, and a supervisor with `supervisor_writes_inbox`, put files there)."""
        if self.inbox_dir is not None:
            self.inbox_dir.mkdir(mode=0o755, parents=True, exist_ok=True)

    def _remove_inbox(self) -> None:
        if self.inbox_dir is not None:
            shutil.rmtree(self.inbox_dir, ignore_errors=True)

    @abc.abstractmethod
    def start(self) -> SupervisorStreams:
        """Start the sandbox and return its supervisor's stdin and stdout, on which nothing has been
        sent yet (the runtime opens its channel over them and sends the supervisor's source and key).
        Called once."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop and remove the sandbox. Idempotent, and safe after a failed or no `start`."""

    @abc.abstractmethod
    def fresh(self) -> Self:
        """A new, unstarted deployment on the same backend (engine, client) with the same spec:
        where to start "a fresh sandbox like this one"."""
