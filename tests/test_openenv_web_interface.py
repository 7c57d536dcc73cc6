"""Importing the service's modules leaves OpenEnv's gradio web interface out (env_server/__init__.py), and only it."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter: the test process has imported the service's modules already."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_service_modules_import_openenv_without_gradio_and_gradio_stays_importable() -> None:
    done = run_python(
        "import importlib.util, sys\n"
        "import env_server.openenv_models\n"  # imports OpenEnv's server package
        "import openenv.core.env_server as server\n"
        "assert 'openenv.core.env_server' in sys.modules\n"
        "assert 'gradio' not in sys.modules, 'gradio was imported'\n"
        "assert server.create_web_interface_app is None, 'the web interface was imported'\n"
        "assert importlib.util.find_spec('gradio') is not None, 'the process itself cannot find gradio'\n"
    )
    assert done.returncode == 0, done.stderr
