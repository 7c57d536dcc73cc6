"""Isolated places to run an agent's commands: hardened Docker containers or bubblewrap.

    from sandbox import DockerSpec, open_sandbox
    with open_sandbox(DockerSpec(memory_mb=512)) as sb:
        result = sb.exec("python3 -c 'print(1)'", timeout_s=5)

A backend's deployment (`sandbox.docker_backend`, `sandbox.local_backend`) starts the sandbox
and hands back the channel to its supervisor; `Sandbox` (`sandbox.runtime`) does the work over it.
"""

from sandbox.backends import open_sandbox
from sandbox.base import ArchiveTooLarge, ExecResult, FileTooLarge, SandboxError, SealingUnavailable
from sandbox.pool import WarmPool
from sandbox.runtime import Sandbox
from sandbox.spec import Backend, BackendSpec, DockerSpec, LocalSpec, SandboxSpec, backend_spec

__all__ = [
    "ArchiveTooLarge",
    "Backend",
    "BackendSpec",
    "DockerSpec",
    "ExecResult",
    "FileTooLarge",
    "LocalSpec",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "SealingUnavailable",
    "WarmPool",
    "backend_spec",
    "open_sandbox",
]
