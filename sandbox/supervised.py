"""The Sandbox operations both backends share: each one is a request to the supervisor."""

from __future__ import annotations

from collections.abc import Callable

from sandbox.base import ExecResult, Sandbox, SandboxError
from sandbox.channel import SupervisorChannel, decode_bytes, encode_bytes
from sandbox.spec import SandboxSpec
from sandbox.supervisor import SOURCE

PROTOCOL_VERSION = 1
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
        """Send the supervisor's source over fresh streams and wait until it answers."""
        self._channel = SupervisorChannel(read_chunk, write, describe_failure)
        self._channel.send_raw(SOURCE)
        reply = self._channel.request("ping", timeout_s)
        if reply["protocol"] != PROTOCOL_VERSION:
            raise SandboxError(f"supervisor speaks protocol {reply['protocol']}, host speaks {PROTOCOL_VERSION}")

    def _request(self, op: str, reply_timeout_s: float, **params: object) -> dict:
        if self._channel is None:
            raise SandboxError(f"sandbox {self.id} is closed")
        return self._channel.request(op, reply_timeout_s, **params)

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
        return ExecResult.model_validate({k: v for k, v in reply.items() if k not in ("id", "ok")})

    def read_file(self, path: str) -> bytes:
        return decode_bytes(self._request("read_file", FILE_OP_TIMEOUT_S, path=path)["data"])

    def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        self._request("write_file", FILE_OP_TIMEOUT_S, path=path, data=encode_bytes(content), mode=mode)

    def put_archive(self, tar_bytes: bytes, dest: str = ".") -> None:
        self._request("put_archive", FILE_OP_TIMEOUT_S, dest=dest, data=encode_bytes(tar_bytes))

    def get_archive(self, path: str = ".") -> bytes:
        """Tar of `path`: a directory's members are relative to it, a file keeps its base name."""
        return decode_bytes(self._request("get_archive", FILE_OP_TIMEOUT_S, path=path)["data"])

    def is_alive(self) -> bool:
        if self._channel is None or not self._channel.is_open:
            return False
        try:
            self._channel.request("ping", PING_TIMEOUT_S)
        except SandboxError:
            return False
        return True
