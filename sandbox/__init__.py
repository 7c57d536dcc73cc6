"""Isolated places to run an agent's commands: hardened Docker containers or bubblewrap.

    from sandbox import SandboxSpec, open_sandbox
    with open_sandbox(SandboxSpec(memory_mb=512)) as sb:
        result = sb.exec("python3 -c 'print(1)'", timeout_s=5)
"""

from sandbox.backends import Backend, open_sandbox
from sandbox.base import ArchiveTooLarge, ExecResult, FileTooLarge, Sandbox, SandboxError
from sandbox.pool import WarmPool
from sandbox.spec import SandboxSpec

__all__ = ["ArchiveTooLarge", "Backend", "ExecResult", "FileTooLarge", "Sandbox", "SandboxError", "SandboxSpec", "WarmPool", "open_sandbox"]
