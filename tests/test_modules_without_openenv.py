"""The service's modules that need no OpenEnv do not import it: OpenEnv's server package (fastmcp, mcp, FastAPI)
costs every process that imports it about 0.8 s, and the tools, hints and error classification are imported by
benchmarks and trainers that never serve."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["env_server.error_kinds", "env_server.hints", "env_server.tools", "env_server.models"])
def test_importing_the_module_leaves_openenv_out(module: str) -> None:
    code = f"import sys, {module}\nassert not [m for m in sys.modules if m.startswith('openenv')], 'OpenEnv was imported'\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
