"""docker-compose.yml end to end with Debian's docker-compose (v1): config, up, /health, one
episode, down. Needs the service image's wheels in dist/wheels (see docs/api.md) and minutes
to build, so it runs only when asked: `CODING_ENV_COMPOSE_TEST=1 pytest -m compose`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).parents[2]
PROJECT = "coding-env-compose-test"

pytestmark = [
    pytest.mark.compose,
    pytest.mark.skipif(os.environ.get("CODING_ENV_COMPOSE_TEST") != "1", reason="set CODING_ENV_COMPOSE_TEST=1"),
    pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (v1) not installed"),
]


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker-compose", "-p", PROJECT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture
def compose_env() -> Iterator[dict[str, str]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "CODING_ENV_PORT": str(port), "CODING_ENV_POOL_SIZE": "1"}
    env.setdefault("SERVICE_BASE", "coding-env-rootfs:bookworm")
    env.setdefault("SANDBOX_BASE", "coding-env-rootfs:bookworm")
    yield env
    _compose("down", "--volumes", "--timeout", "60", env=env)


def test_compose_up_serves_an_episode(compose_env: dict[str, str]) -> None:
    assert _compose("config", "--quiet", env=compose_env).returncode == 0
    up = _compose("up", "-d", "--build", env=compose_env)
    assert up.returncode == 0, up.stderr
    url = f"http://127.0.0.1:{compose_env['CODING_ENV_PORT']}"
    # The container's own healthcheck decides readiness; wait for Docker to report it.
    container = _compose("ps", "-q", "service", env=compose_env).stdout.strip()
    deadline = time.monotonic() + 180
    status = ""
    while time.monotonic() < deadline and status != "healthy":
        status = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container], capture_output=True, text=True).stdout.strip()
        time.sleep(1)
    assert status == "healthy", _compose("logs", "service", env=compose_env).stdout[-3000:]
    assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
    episode = subprocess.run([sys.executable, str(ROOT / "examples" / "http_episode.py"), url], capture_output=True, text=True, timeout=300)
    assert "done: True reward: 1.0" in episode.stdout, episode.stdout + episode.stderr
