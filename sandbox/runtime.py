"""What you do in a sandbox, whatever its backend: every operation is a request to the
supervisor over the channel opened on the streams its deployment handed back."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import pydantic

from sandbox.base import ExecResult, SandboxError
from sandbox.channel import SupervisorChannel, runs_here
from sandbox.deployment import INBOX_MOUNT, Deployment
from sandbox.supervisor import CODE, SOURCE

PROTOCOL_VERSION = 3
"""Version of the JSON-lines protocol this host speaks (the supervisor reports its own)."""

REPLY_GRACE_S = 15.0
"""How long a reply may lag behind a command's own timeout before the sandbox counts as broken."""

FILE_OP_TIMEOUT_S = 60.0
"""Limit on one file or archive transfer."""

PING_TIMEOUT_S = 5.0
"""Limit on a liveness probe."""


class Sandbox:
    """One isolated workspace, started on construction; `close()` (or `with`) removes it.
    Paths are relative to the workspace unless absolute."""

    def __init__(self, deployment: Deployment, replies_on: asyncio.AbstractEventLoop | None = None):
        """Start `deployment` and wait until its supervisor answers; a failed start stops it again.

        `replies_on`: the event loop that reads the supervisor's replies, instead of a thread of the sandbox's
        own (decision 138). An `exec_async` awaited on that loop then wakes no thread. The loop must be running
        on another thread, from start to `close`, and every blocking call (this constructor included) must
        come from a thread other than the loop's."""
        self.deployment = deployment
        """Where this sandbox lives (backend-specific handles: container id, host pid...)."""
        self.spec = deployment.spec
        self.id = deployment.id
        self.replies_on = replies_on
        """The event loop that reads replies; None: a thread of this sandbox's."""
        self._channel: SupervisorChannel | None = None
        if replies_on is not None and runs_here(replies_on):
            raise RuntimeError("a sandbox whose replies this event loop reads cannot start on it: its start waits for a reply")
        try:
            self._channel = SupervisorChannel(deployment.start(), replies_on)
            self._hand_over_supervisor(deployment.start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _hand_over_supervisor(self, timeout_s: float) -> None:
        """Send the supervisor's source, its code and the channel key and wait until it answers. The key goes
        before any command can run and never into argv or env."""
        self._channel.send_raw(SOURCE + CODE + self._channel.key.hex().encode() + b"\n")
        protocol = self._field("ping", timeout_s, "protocol")
        if protocol != PROTOCOL_VERSION:
            raise SandboxError(f"supervisor speaks protocol {protocol}, host speaks {PROTOCOL_VERSION}")

    def open_fresh(self) -> Sandbox:
        """Start a new sandbox on the same backend with the same spec (nothing of this one's
        workspace in it), e.g. to grade a submission where the agent's processes cannot reach. Its replies
        are read where this sandbox's are."""
        return Sandbox(self.deployment.fresh(), self.replies_on)

    def _request(self, op: str, reply_timeout_s: float, payload: bytes = b"", **params: object) -> dict[str, Any]:
        return self._open_channel().request(op, reply_timeout_s, payload, **params)

    def _open_channel(self) -> SupervisorChannel:
        if self._channel is None:
            raise SandboxError(f"sandbox {self.id} is closed")
        return self._channel

    def _field(self, op: str, reply_timeout_s: float, field: str, **params: object) -> Any:
        """One field of a successful reply; a reply without it is a broken sandbox, not a KeyError."""
        reply = self._request(op, reply_timeout_s, **params)
        if field not in reply:
            raise SandboxError(f"malformed reply to {op!r}: no {field!r}")
        return reply[field]

    def _payload(self, op: str, **params: object) -> bytes:
        """The bytes a successful reply carries (an empty payload is sent as none)."""
        return self._request(op, FILE_OP_TIMEOUT_S, **params).get("payload", b"")

    def exec(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None) -> ExecResult:
        """Run `command` with `bash -c` in its own process group under a timeout (default: the
        spec's `default_timeout_s`)."""
        reply_timeout_s, params = self._exec_request(command, timeout_s, env)
        return _exec_result(self._request("exec", reply_timeout_s, **params))

    async def exec_async(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None) -> ExecResult:
        """`exec` awaited on the caller's event loop, no thread waiting on the reply (the service's steps)."""
        reply_timeout_s, params = self._exec_request(command, timeout_s, env)
        return _exec_result(await self._open_channel().request_async("exec", reply_timeout_s, **params))

    def _exec_request(self, command: str, timeout_s: float | None, env: dict[str, str] | None) -> tuple[float, dict[str, Any]]:
        """How long to wait for an exec's reply, and the request's parameters."""
        timeout_s = self.spec.default_timeout_s if timeout_s is None else timeout_s
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        params = {"cmd": command, "timeout_s": timeout_s, "env": {**self.spec.env, **(env or {})}, "output_cap": self.spec.output_cap_bytes}
        return timeout_s + REPLY_GRACE_S, params

    def _max_bytes(self, max_bytes: int | None) -> int:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be non-negative, got {max_bytes}")
        return self.spec.max_transfer_mb * 2**20 if max_bytes is None else max_bytes

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Return the bytes of a regular file; raises FileNotFoundError, PermissionError,
        IsADirectoryError, OSError (not a regular file), or FileTooLarge beyond `max_bytes`
        (default: the spec's `max_transfer_mb`)."""
        return self._payload("read_file", path=path, max_bytes=self._max_bytes(max_bytes))

    def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file, creating parent directories."""
        payload = content.encode() if isinstance(content, str) else content
        self._request("write_file", FILE_OP_TIMEOUT_S, payload, path=path, mode=mode)

    def put_archive(self, tar_bytes: bytes, dest: str = ".") -> None:
        """Extract an uncompressed tar archive under `dest`."""
        self._request("put_archive", FILE_OP_TIMEOUT_S, tar_bytes, dest=dest)

    def put_sealed_archive(self, tar_bytes: bytes, dest: str) -> None:
        """Extract an uncompressed tar archive into `dest`, a new directory right under /dev/shm,
        as files this sandbox's commands cannot change: owned by the supervisor's identity, files
        0444 and directories 0555, so they can read them but neither write, remove, rename, chmod
        nor add anything (decision 058). Only regular files and directories at plain relative
        paths; a link, device, absolute path or `..` member is refused (SandboxError) before
        anything is written. FileExistsError if `dest` exists; SealingUnavailable where commands
        run as the supervisor's own uid (bubblewrap)."""
        self._request("put_sealed_archive", FILE_OP_TIMEOUT_S, tar_bytes, dest=dest)

    def get_archive(self, path: str = ".", max_bytes: int | None = None) -> bytes:
        """Return an uncompressed tar archive of `path`: a directory's members are relative to it,
        a file keeps its base name; symlinks and FIFOs are kept as such, sockets skipped. Raises
        ArchiveTooLarge when its files add up to more than `max_bytes` (default: the spec's
        `max_transfer_mb`), OSError for an unreadable member."""
        return self._payload("get_archive", path=path, max_bytes=self._max_bytes(max_bytes))

    def put_archive_from_inbox(self, name: str, dest: str = ".") -> None:
        """Extract the uncompressed tar archive `name`, which the host placed in this sandbox's
        inbox (`SandboxSpec.inbox_root`), under `dest`: no bytes travel over the channel."""
        self._request("put_archive", FILE_OP_TIMEOUT_S, dest=dest, from_file=f"{INBOX_MOUNT}/{name}")

    def get_archive_into_inbox(self, name: str, path: str = ".", max_bytes: int | None = None) -> None:
        """`get_archive`, written by the supervisor into this sandbox's inbox as `name` instead of
        sent over the channel (where `deployment.supervisor_writes_inbox`); `name` must be new."""
        self._request("get_archive", FILE_OP_TIMEOUT_S, path=path, max_bytes=self._max_bytes(max_bytes), to_file=f"{INBOX_MOUNT}/{name}")

    def copy_workspace_to(self, targets: Sequence[Sandbox], max_bytes: int | None = None) -> None:
        """Copy this sandbox's workspace into each of `targets` (fresh sandboxes: an existing file
        at a copied path is replaced, the rest of a target is kept). The archive is taken once,
        as `get_archive` takes it, and extracted by every target at once, one thread each.
        Where every target has an inbox, the archive reaches them as one file hard-linked into
        each inbox (written by this sandbox's supervisor into its own inbox where it may, by the
        host otherwise); else it is sent over each target's channel (decision 012).
        Only the workspace travels: /tmp, $HOME and processes stay behind. Raises what
        `get_archive` raises, or the first target's failure once every target has finished."""
        inboxes = [target.deployment.inbox_dir for target in targets]
        with contextlib.ExitStack() as delivery:
            if targets and all(inboxes):
                name = delivery.enter_context(self._archive_in_inboxes(inboxes, max_bytes))
                put = functools.partial(Sandbox.put_archive_from_inbox, name=name)
            else:
                put = functools.partial(Sandbox.put_archive, tar_bytes=self.get_archive(".", max_bytes))
            with ThreadPoolExecutor(max(len(targets), 1), thread_name_prefix="workspace-copy") as pool:
                puts = [pool.submit(put, target) for target in targets]
        for done in puts:
            done.result()

    @contextlib.contextmanager
    def _archive_in_inboxes(self, inboxes: Sequence[Path], max_bytes: int | None) -> Iterator[str]:
        """An archive of the workspace as one file in every inbox, under the name it yields:
        written once and hard-linked into the others (copied where an inbox is on another file
        system), and removed from all of them on exit. The targets see their inbox read-only."""
        name = f"{secrets.token_hex(8)}.tar"
        # A target closed meanwhile has no inbox left; its own extraction reports that it is closed.
        paths = [inbox / name for inbox in inboxes if inbox.is_dir()]
        placed: list[Path] = []
        try:
            if self.deployment.supervisor_writes_inbox:
                first = self.deployment.inbox_dir / name
                placed.append(first)
                self.get_archive_into_inbox(name, ".", max_bytes)
            else:
                archive = self.get_archive(".", max_bytes)
                first = paths.pop(0) if paths else None
                if first is not None:
                    placed.append(first)
                    first.write_bytes(archive)
            for path in paths:
                placed.append(path)
                try:
                    os.link(first, path)
                except OSError:  # on another file system than the first inbox
                    shutil.copyfile(first, path)
            yield name
        finally:
            for path in placed:
                path.unlink(missing_ok=True)

    def is_alive(self, timeout_s: float = PING_TIMEOUT_S) -> bool:
        """Cheap liveness probe: the supervisor answers within `timeout_s`."""
        if self._channel is None or not self._channel.is_open:
            return False
        try:
            self._channel.request("ping", timeout_s)
        except SandboxError:
            return False
        return True

    def close(self) -> None:
        """Stop and remove the sandbox. Idempotent."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        self.deployment.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exec_result(reply: dict[str, Any]) -> ExecResult:
    try:
        return ExecResult.model_validate({k: v for k, v in reply.items() if k not in ("id", "ok")})
    except pydantic.ValidationError as exc:
        raise SandboxError(f"malformed reply to 'exec': {exc}") from exc
