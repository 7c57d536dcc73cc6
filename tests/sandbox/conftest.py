from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxSpec, open_sandbox
from sandbox.spec import DEFAULT_IMAGE


@functools.cache
def docker_ready() -> bool:
    """An engine answers and the sandbox image exists (`coding-env build-image` makes it)."""
    try:
        from sandbox.docker_backend import default_client
        from sandbox.image import image_exists

        return image_exists(DEFAULT_IMAGE, default_client())
    except Exception:
        return False


needs_docker = [pytest.mark.docker, pytest.mark.skipif(not docker_ready(), reason="no Docker engine or no sandbox image")]
needs_bwrap = [pytest.mark.bwrap, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")]

BACKENDS = [pytest.param("docker", marks=needs_docker), pytest.param("local", marks=needs_bwrap)]

SPEC = SandboxSpec(memory_mb=512, pids=128, workspace_mb=16, tmp_mb=16, default_timeout_s=20)
"""Small limits so the containment tests hit them quickly."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def sandbox(backend: str) -> Iterator[Sandbox]:
    with open_sandbox(SPEC, backend=backend) as sb:
        yield sb
