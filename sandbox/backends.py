"""Choosing a backend: the spec's type names it; `open_sandbox` starts a sandbox there."""

from __future__ import annotations

import asyncio

from sandbox.deployment import Deployment
from sandbox.runtime import Sandbox
from sandbox.spec import Backend, LocalSpec, SandboxSpec, backend_spec


def deployment_for(spec: SandboxSpec | None = None, backend: Backend | None = None, start_timeout_s: float | None = None) -> Deployment:
    """An unstarted deployment for `spec` on the backend its type names (`backend_spec`);
    `start_timeout_s` replaces the backend's default limit on start-up."""
    spec = backend_spec(spec, backend)
    # Backends are imported on demand: a host with bubblewrap only need not have the docker SDK.
    if isinstance(spec, LocalSpec):
        from sandbox.local_backend import LocalDeployment

        return LocalDeployment(spec, start_timeout_s)
    from sandbox.docker_backend import DockerDeployment

    return DockerDeployment(spec, start_timeout_s=start_timeout_s)


def open_sandbox(
    spec: SandboxSpec | None = None,
    backend: Backend | None = None,
    start_timeout_s: float | None = None,
    replies_on: asyncio.AbstractEventLoop | None = None,
) -> Sandbox:
    """Start a sandbox and return it once its supervisor answers; close it (or use `with`).

    `DockerSpec` and `LocalSpec` name their backend; a plain `SandboxSpec` runs on `backend`
    (default docker). `start_timeout_s` bounds the start until the supervisor answers (default:
    the backend's). `replies_on` has that event loop read the supervisor's replies (`Sandbox`)."""
    return Sandbox(deployment_for(spec, backend, start_timeout_s), replies_on)
