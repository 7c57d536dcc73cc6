"""Choosing a backend: `open_sandbox` starts a sandbox of the requested kind."""

from __future__ import annotations

from typing import Literal

from sandbox.base import Sandbox
from sandbox.spec import SandboxSpec

Backend = Literal["docker", "local"]


def open_sandbox(spec: SandboxSpec | None = None, backend: Backend = "docker") -> Sandbox:
    """Start a sandbox and return it once its supervisor answers; close it (or use `with`)."""
    spec = spec or SandboxSpec()
    # Backends are imported on demand: a host with bubblewrap only need not have the docker SDK.
    if backend == "docker":
        from sandbox.docker_backend import DockerSandbox

        return DockerSandbox(spec)
    if backend == "local":
        from sandbox.local_backend import LocalSandbox

        return LocalSandbox(spec)
    raise ValueError(f"unknown sandbox backend {backend!r}; expected 'docker' or 'local'")
