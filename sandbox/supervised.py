"""The Sandbox operations both backends share: each one is a request to the supervisor."""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any

import pydantic

from sandbox.base import ExecResult, Sandbox, SandboxError
from sandbox.channel import SupervisorChannel, decode_bytes, encode_bytes
from sandbox.spec import SandboxSpec
from sandbox.supervisor import SOURCE

PROTOCOL_VERSION = 2
"""Version of the JSON-lines protocol this host speaks (the supervisor reports its own)."""

REPLY_GRACE_S = 15.0
"""How long a reply may lag behind a command's own timeout before the sandbox counts as broken."""

FILE_OP_TIMEOUT_S = 60.0
"""Limit on one file or archive transfer."""

PING_TIMEOUT_S = 5.0
"""Limit on a liveness probe."""

BASE_ENV = {"HOME": "/tmp", "LANG": "C.UTF-8"}
"""Environment of the supervisor and so of every command: the root filesystem is read-only,
so HOME points at the writable /tmp."""


class SupervisedSandbox(Sandbox):
    """A sandbox driven by the in-sandbox supervisor; a backend supplies the byte streams."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str):
        self.spec = spec
        self.id = sandbox_id
        self._channel: SupervisorChannel | None = None

    def _connect(self, read_chunk: Callable[[], bytes], write: Callable[[bytes], None], describe_failure: Callable[[], str], timeout_s: float) -> None:
        """Send the supervisor's source and the channel key over fresh streams and wait until
        it answers. The key goes before any command can run and never into argv or env."""
        self._channel = SupervisorChannel(read_chunk, write, describe_failure)
        self._channel.send_raw(SOURCE + self._channel.key.hex().encode() + b"\n")
        protocol = self._field("ping", timeout_s, "protocol")
        if protocol != PROTOCOL_VERSION:
            raise SandboxError(f"supervisor speaks protocol {protocol}, host speaks {PROTOCOL_VERSION}")

    def _request(self, op: str, reply_timeout_s: float, **params: object) -> dict[str, Any]:
        if self._channel is None:
            raise SandboxError(f"sandbox {self.id} is closed")
        return self._channel.request(op, reply_timeout_s, **params)

    def _field(self, op: str, reply_timeout_s: float, field: str, **params: object) -> Any:
        """One field of a successful reply; a reply without it is a broken sandbox, not a KeyError."""
        reply = self._request(op, reply_timeout_s, **params)
        if field not in reply:
            raise SandboxError(f"malformed reply to {op!r}: no {field!r}")
        return reply[field]

    def _bytes_field(self, op: str, **params: object) -> bytes:
        data = self._field(op, FILE_OP_TIMEOUT_S, "data", **params)
        try:
            return decode_bytes(data)
        except (TypeError, binascii.Error) as exc:
            raise SandboxError(f"malformed reply to {op!r}: {exc}") from exc

    def exec(self, command: str, timeout_s: float | None = None, env: dict[str, str] | None = None) -> ExecResult:
        timeout_s = self.spec.default_timeout_s if timeout_s is None else timeout_s
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        reply = self._request(
            "exec",
            timeout_s + REPLY_GRACE_S,
            cmd=command,
            timeout_s=timeout_s,
            env={**self.spec.env, **(env or {})},
            output_cap=self.spec.output_cap_bytes,
        )
        try:
            return ExecResult.model_validate({k: v for k, v in reply.items() if k not in ("id", "ok")})
        except pydantic.ValidationError as exc:
            raise SandboxError(f"malformed reply to 'exec': {exc}") from exc

    def _max_bytes(self, max_bytes: int | None) -> int:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be non-negative, got {max_bytes}")
        return self.spec.max_transfer_mb * 2**20 if max_bytes is None else max_bytes

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return self._bytes_field("read_file", path=path, max_bytes=self._max_bytes(max_bytes))

    def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        self._request("write_file", FILE_OP_TIMEOUT_S, path=path, data=encode_bytes(content), mode=mode)

    def put_archive(self, tar_bytes: bytes, dest: str = ".") -> None:
        self._request("put_archive", FILE_OP_TIMEOUT_S, dest=dest, data=encode_bytes(tar_bytes))

    def get_archive(self, path: str = ".", max_bytes: int | None = None) -> bytes:
        """Tar of `path`: a directory's members are relative to it, a file keeps its base name."""
        return self._bytes_field("get_archive", path=path, max_bytes=self._max_bytes(max_bytes))

    def is_alive(self) -> bool:
        if self._channel is None or not self._channel.is_open:
            return False
        try:
            self._channel.request("ping", PING_TIMEOUT_S)
        except SandboxError:
            return False
        return True
