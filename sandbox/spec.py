"""What a sandbox is allowed to be: limits and hardening every backend applies (`SandboxSpec`),
plus one spec type per backend for what only it has (`DockerSpec`, `LocalSpec`).

The spec's type chooses the backend: `open_sandbox(DockerSpec(...))` starts a container,
`open_sandbox(LocalSpec(...))` a bubblewrap sandbox. A plain `SandboxSpec` carries no backend
fields and runs on whichever backend is named (`backend_spec`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

Backend = Literal["docker", "local"]
"""Where a sandbox lives: a hardened Docker container or bubblewrap namespaces on this host."""

DEFAULT_IMAGE = "coding-env-sandbox:latest"

# Binaries that let an agent inspect bytecode or binaries instead of solving the task.
DEFAULT_REMOVED_BINARIES: tuple[str, ...] = (
    "strings",
    "objdump",
    "readelf",
    "gdb",
    "strace",
    "ltrace",
    "xxd",
    "hexdump",
    "od",
    "uncompyle6",
    "decompyle3",
    "pycdc",
)


class SandboxSpec(BaseModel):
    """Resources and hardening every backend applies. Defaults are the hardened configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int = Field(default=1024, ge=32)
    """Memory for the sandbox's processes in MiB; no swap beyond it. The Docker backend's cgroup
    limit is `memory_mb + workspace_mb + tmp_mb + shm_mb`, because tmpfs pages are charged to
    the cgroup too: a full disk then still leaves `memory_mb` to processes, so filling it gives
    ENOSPC, never an OOM kill of the sandbox (decision 008)."""

    pids: int = Field(default=256, ge=16)
    """Maximum number of processes and threads inside the sandbox (fork-bomb guard)."""

    nofile: int = Field(default=1024, ge=64)
    """Open file descriptor limit (soft and hard)."""

    workspace_mb: int = Field(default=256, ge=1)
    """Size of the tmpfs mounted at `workdir`; writes beyond it fail with ENOSPC inside."""

    tmp_mb: int = Field(default=128, ge=1)
    """Size of the tmpfs mounted at /tmp."""

    shm_mb: int = Field(default=64, ge=1)
    """Size of the tmpfs at /dev/shm (POSIX shared memory, multiprocessing)."""

    max_transfer_mb: int = Field(default=256, ge=1)
    """Default bound on one `read_file` or `get_archive` (both are buffered whole on the host);
    larger ones raise FileTooLarge / ArchiveTooLarge before anything is read."""

    workdir: str = "/workspace"
    """Absolute path of the agent's workspace inside the sandbox; relative paths resolve against it."""

    output_cap_bytes: int = Field(default=64 * 1024, ge=1024)
    """Per-stream cap on captured stdout/stderr; head and tail are kept, the middle is dropped."""

    default_timeout_s: float = Field(default=30.0, gt=0)
    """Timeout of `exec` when the caller gives none; the whole process group is killed on expiry."""

    network: bool = False
    """Give the sandbox a network. Off by default: only the loopback interface exists."""

    user: str = "1000:1000"
    """Numeric `uid:gid` that commands run as; never root. On Docker the supervisor runs as root
    with only SETUID, SETGID and KILL, out of these commands' reach (decision 006)."""

    env: dict[str, str] = Field(default_factory=dict, validation_alias=AliasChoices("env", "environment"))
    """Extra environment variables for every command."""

    removed_binaries: tuple[str, ...] = DEFAULT_REMOVED_BINARIES
    """Introspection tools deleted from the image at build time and hidden at run time."""

    inbox_root: str | None = None
    """Host directory under which each sandbox gets an inbox of its own, mounted read-only at
    `/run/inbox`: a workspace copy (a fork) is then written on the host once and hard-linked
    into every target's inbox, instead of being streamed through each target's channel
    (decision 012). The path must mean the same directory to this process and to the Docker
    engine (in compose: a host directory bound at the same path). None: archives always travel
    over the channel."""

    @field_validator("user")
    @classmethod
    def _user_is_numeric_and_not_root(cls, user: str) -> str:
        uid, sep, gid = user.partition(":")
        if not (uid.isdigit() and sep and gid.isdigit()):
            raise ValueError(f"user must be numeric 'uid:gid' (e.g. '1000:1000'), got {user!r}")
        if int(uid) == 0 or int(gid) == 0:
            raise ValueError("commands never run as root (uid or gid 0): the supervisor's identity must stay out of their reach")
        return user

    @field_validator("inbox_root")
    @classmethod
    def _inbox_root_is_absolute(cls, inbox_root: str | None) -> str | None:
        if inbox_root is not None and not inbox_root.startswith("/"):
            raise ValueError(f"inbox_root must be an absolute host path, got {inbox_root!r}")
        return inbox_root

    @field_validator("workdir")
    @classmethod
    def _workdir_is_its_own_mount(cls, workdir: str) -> str:
        if not workdir.startswith("/") or workdir.rstrip("/") in ("", "/tmp", "/dev", "/dev/shm", "/proc"):
            raise ValueError(f"workdir must be an absolute path of its own (not /, /tmp, /dev, /proc), got {workdir!r}")
        return workdir


class DockerSpec(SandboxSpec):
    """A sandbox in a hardened Docker container (`sandbox.docker_backend`)."""

    backend: ClassVar[Backend] = "docker"

    image: str = DEFAULT_IMAGE
    """Container image; its python3 hosts the supervisor."""

    cpus: float = Field(default=1.0, gt=0)
    """CPU quota in cores (Docker `nano_cpus`)."""

    runtime: Literal["runc", "runsc"] = "runc"
    """OCI runtime: `runc` (Docker's default) or `runsc` (gVisor, a user-space kernel between the
    sandbox and the host's; the engine must have it registered)."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Extra container labels (the backend always adds its own service labels)."""


class LocalSpec(SandboxSpec):
    """A sandbox in bubblewrap namespaces on this host, seeing its /usr read-only (`sandbox.local_backend`)."""

    backend: ClassVar[Backend] = "local"

    cpu_time_s: int = Field(default=3600, ge=1)
    """RLIMIT_CPU: CPU seconds any one process (the supervisor included) may use; there is no
    CPU quota as on Docker."""

    host_paths: tuple[str, ...] = ()
    """Extra host paths bound read-only at the same place (e.g. a virtualenv)."""


BackendSpec = DockerSpec | LocalSpec
"""A spec that names its backend by its type."""

SPEC_TYPES: dict[Backend, type[BackendSpec]] = {spec_type.backend: spec_type for spec_type in (DockerSpec, LocalSpec)}
"""The spec type of each backend."""


def backend_spec(spec: SandboxSpec | dict[str, object] | None = None, backend: Backend | None = None) -> BackendSpec:
    """`spec` as the spec type of `backend`: a backend spec is returned as it is (and must not
    contradict `backend`); a plain `SandboxSpec` or a dict becomes the spec of `backend` (default
    docker), so fields of another backend are refused."""
    if isinstance(spec, DockerSpec | LocalSpec):
        if backend not in (None, spec.backend):
            raise ValueError(f"a {type(spec).__name__} runs on the {spec.backend!r} backend, not {backend!r}")
        return spec
    if backend is not None and backend not in SPEC_TYPES:
        raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {sorted(SPEC_TYPES)}")
    fields = spec.model_dump() if isinstance(spec, SandboxSpec) else (spec or {})
    return SPEC_TYPES[backend or "docker"].model_validate(fields)
