"""Docker backend: one hardened container per sandbox, its supervisor reached over the attached stdin/stdout.

The container's main process is the supervisor (under Docker's init, which reaps zombies).
It is created with an open stdin that closes when the single attached client goes away
(`StdinOnce`) and with `auto_remove`, so a host that dies takes its containers with it:
socket closed -> supervisor sees EOF -> container exits -> Docker removes it. Every
container carries the service labels so `reap_orphans` finds any that remain.
Hardening choices are explained in docs/decisions/002-sandbox-hardening.md.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import socket
import struct
import time
from collections import deque
from pathlib import Path

import docker
import docker.errors
import requests
from docker.types import LogConfig, Ulimit

from sandbox.base import FailureReport, SandboxError
from sandbox.channel import READ_BYTES, SupervisorStreams
from sandbox.deployment import BASE_ENV, INBOX_MOUNT, Deployment
from sandbox.spec import DockerSpec
from sandbox.supervisor import bootstrap_argv

log = logging.getLogger(__name__)

SERVICE_LABEL = "coding-env.service"
SERVICE_VALUE = "sandbox"
SANDBOX_ID_LABEL = "coding-env.sandbox-id"
CREATED_AT_LABEL = "coding-env.created-at"
OWNER_LABEL = "coding-env.owner"
"""`host:pid:start-ticks` of the process that started the container; reaping spares live owners.

The start time tells a live owner from a new process that reuses its pid, which is the rule
inside a restarted service container (always pid 1 on the same hostname)."""

SUPERVISOR_USER = "0:0"
"""The container's main process, the supervisor, is root (in the container's uid space) so that
commands, which it runs as `spec.user`, cannot signal, trace or read it (decision 006)."""

SUPERVISOR_CAPABILITIES = ["SETUID", "SETGID", "KILL"]
"""All the supervisor keeps: drop to `spec.user` for each command and file operation, kill a
command's process group. No DAC override: it never touches the agent's files itself."""


def memory_limit_mb(spec: DockerSpec) -> int:
    """The cgroup limit: processes' memory plus every tmpfs, whose pages the cgroup is charged
    for, so a full disk can never push the processes into an OOM kill (decision 008)."""
    return spec.memory_mb + spec.workspace_mb + spec.tmp_mb + spec.shm_mb


@functools.cache
def default_client() -> docker.DockerClient:
    """One client per process; its connection pool is sized for many concurrent sandboxes."""
    return docker.from_env(max_pool_size=128)


def _process_start_ticks(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after it are plain.
    return stat.rpartition(")")[2].split()[19]


def current_owner() -> str:
    """The owner label value of containers this process starts."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start_ticks(pid)}"


class DockerDeployment(Deployment):
    """A sandbox in a hardened Docker container; `stop()` removes it."""

    default_start_timeout_s = 60.0

    def __init__(self, spec: DockerSpec, client: docker.DockerClient | None = None, start_timeout_s: float | None = None):
        super().__init__(spec, start_timeout_s)
        self._client = client or default_client()
        self._api = self._client.api
        self._stderr_tail: deque[bytes] = deque(maxlen=16)  # supervisor's own stderr, for error messages
        self._container_id: str | None = None
        self._socket: socket.socket | None = None
        # The inbox directory belongs to this process's uid; the supervisor (container root,
        # without CAP_DAC_OVERRIDE) can write there only if that uid is root, and the sandbox's
        # commands, never root (`SandboxSpec.user`), cannot write there at all.
        self.supervisor_writes_inbox = self.inbox_dir is not None and os.geteuid() == 0

    @property
    def container_id(self) -> str | None:
        return self._container_id

    def fresh(self) -> DockerDeployment:
        return DockerDeployment(self.spec, self._client, self.start_timeout_s)

    def _host_config(self) -> dict:
        uid, _, gid = self.spec.user.partition(":")
        tmpfs_options = "rw,exec,nosuid,nodev"
        return self._api.create_host_config(
            network_mode="bridge" if self.spec.network else "none",
            read_only=True,
            tmpfs={
                self.spec.workdir: f"{tmpfs_options},size={self.spec.workspace_mb}m,uid={uid},gid={gid or uid},mode=0755",
                "/tmp": f"{tmpfs_options},size={self.spec.tmp_mb}m,mode=1777",
            },
            shm_size=f"{self.spec.shm_mb}m",
            cap_drop=["ALL"],
            cap_add=SUPERVISOR_CAPABILITIES,
            security_opt=["no-new-privileges"],
            pids_limit=self.spec.pids,
            mem_limit=f"{memory_limit_mb(self.spec)}m",
            memswap_limit=f"{memory_limit_mb(self.spec)}m",
            nano_cpus=int(self.spec.cpus * 1e9),
            ulimits=[Ulimit(name="nofile", soft=self.spec.nofile, hard=self.spec.nofile)],
            init=True,
            auto_remove=True,
            runtime=self.spec.runtime,
            binds={str(self.inbox_dir): {"bind": INBOX_MOUNT, "mode": "rw" if self.supervisor_writes_inbox else "ro"}} if self.inbox_dir else None,
            # The attached stream carries every reply (file contents included): never log it.
            log_config=LogConfig(type=LogConfig.types.NONE),
        )

    def start(self) -> SupervisorStreams:
        self._create_inbox()
        try:
            created = self._api.create_container(
                self.spec.image,
                command=bootstrap_argv(self.spec.workdir, run_as=self.spec.user),
                user=SUPERVISOR_USER,
                environment=BASE_ENV,
                working_dir=self.spec.workdir,
                labels={
                    **self.spec.labels,
                    SERVICE_LABEL: SERVICE_VALUE,
                    SANDBOX_ID_LABEL: self.id,
                    CREATED_AT_LABEL: f"{time.time():.3f}",
                    OWNER_LABEL: current_owner(),
                },
                # detach=False + stdin_open=True is what makes Docker set StdinOnce.
                detach=False,
                stdin_open=True,
                host_config=self._host_config(),
            )
            self._container_id = created["Id"]
            # Attach before start so not a byte of the supervisor's output is missed.
            attached = self._api.attach_socket(self._container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._socket = socket.socket(fileno=os.dup(attached.fileno()))
            self._socket.setblocking(True)  # `read` below waits in recv (docker-py polled before each read)
            attached.close()
            self._api.start(self._container_id)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot start a sandbox from {self.spec.image}: {exc}") from exc
        sock, attached_stream = self._socket, _AttachedStream(self._stderr_tail)

        def read() -> bytes | None:
            try:
                data = sock.recv(READ_BYTES)
            except BlockingIOError:  # polled readable, yet nothing there: the descriptor may be non-blocking
                return b""
            return attached_stream.stdout_in(data) if data else None

        return SupervisorStreams(read, functools.partial(_send_all, sock), sock.fileno(), self._describe_failure)

    def _describe_failure(self) -> FailureReport:
        if self._container_id is None:
            return FailureReport("sandbox was closed")
        details = []
        oom_killed = False
        try:
            state = self._api.inspect_container(self._container_id)["State"]
            details.append(f"container status {state['Status']}, exit code {state['ExitCode']}")
            if state["OOMKilled"]:
                oom_killed = True
                details.append("killed by the OOM killer")
        except docker.errors.NotFound:
            details.append("container is gone")
        except docker.errors.DockerException as exc:
            details.append(f"cannot inspect the container: {exc}")
        stderr = b"".join(self._stderr_tail).decode(errors="replace").strip()
        if stderr:
            details.append(f"supervisor stderr: {stderr[-2000:]}")
        return FailureReport("; ".join(details), oom_killed=oom_killed)

    def stop(self) -> None:
        container_id, self._container_id = self._container_id, None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if container_id is not None:
            _remove(self._api, container_id)
        self._remove_inbox()


def _send_all(sock: socket.socket, data: bytes) -> None:
    """`sock.sendall`, also once the socket's descriptor is non-blocking: libuv makes a descriptor it polls
    non-blocking, and with it the socket's file description, so uvloop reading the replies (decision 138) turns
    the writes to the same socket non-blocking. A payload then waits until the supervisor has read enough."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            writable = select.poll()
            writable.register(sock, select.POLLOUT)
            writable.poll()


class _AttachedStream:
    """Docker's attached stream, read back into the supervisor's stdout: every frame is a header of 8 bytes
    (the stream's number, 3 zero bytes, the size) and its data. What the supervisor writes to stderr is kept
    for diagnostics."""

    HEADER = struct.Struct(">BxxxL")
    STDOUT = 1

    def __init__(self, stderr_tail: deque[bytes]):
        self._stderr_tail = stderr_tail
        self._buffer = bytearray()

    def stdout_in(self, data: bytes) -> bytes:
        """The stdout bytes of the frames that `data` completes (a frame may span reads)."""
        self._buffer += data
        stdout = bytearray()
        start = 0
        while len(self._buffer) - start >= self.HEADER.size:
            stream, size = self.HEADER.unpack_from(self._buffer, start)
            end = start + self.HEADER.size + size
            if len(self._buffer) < end:
                break
            frame = self._buffer[start + self.HEADER.size : end]
            if stream == self.STDOUT:
                stdout += frame
            else:
                self._stderr_tail.append(bytes(frame))
            start = end
        del self._buffer[:start]
        return bytes(stdout)


def _remove(api: docker.APIClient, container_id: str) -> None:
    try:
        api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: auto-removal is already under way
            raise


def owner_is_alive(owner: str) -> bool:
    """Whether the process named by an owner label still runs (unknown hosts count as alive)."""
    host, pid, start_ticks = (owner.split(":") + ["", "", ""])[:3]
    if host != socket.gethostname():
        return True  # another machine's process: cannot tell, so it is not ours to reap
    try:
        ticks_now = _process_start_ticks(int(pid))
    except ValueError:
        return True  # not a label we wrote: leave it alone
    if ticks_now is None:
        return False
    return not start_ticks or ticks_now == start_ticks


REAP_WAIT_S = 30.0
"""How long reaping waits for a container whose removal Docker had already begun."""


def reap_orphans(
    client: docker.DockerClient | None = None, all_owners: bool = False, older_than_s: float = 0.0, label: str | None = None
) -> list[str]:
    """Remove sandbox containers whose owner process is gone (or all of them with `all_owners`).

    Only containers created more than `older_than_s` seconds ago, and carrying `label`
    (`key=value`) when given, are touched. Returns the ids of the containers removed.
    """
    api = (client or default_client()).api
    now = time.time()
    removed = []
    wanted = [f"{SERVICE_LABEL}={SERVICE_VALUE}", *([label] if label else [])]
    for container in api.containers(all=True, filters={"label": wanted}):
        labels = container["Labels"]
        if now - float(labels.get(CREATED_AT_LABEL, 0)) < older_than_s:
            continue
        if not all_owners and owner_is_alive(labels.get(OWNER_LABEL, "")):
            continue
        _remove(api, container["Id"])
        removed.append(container["Id"])
    # A container whose auto-removal was already under way (409 above) may still be listed: when
    # this returns, none of them is.
    for container_id in removed:
        try:
            api.wait(container_id, timeout=REAP_WAIT_S, condition="removed")
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            log.warning("sandbox %s is still being removed: %s", container_id[:12], exc)
    return removed
