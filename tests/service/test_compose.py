"""docker-compose.yml end to end with Debian's docker-compose (v1), on every `make test`: config,
the service image built offline (wheels from `make wheels`, base the debootstrap rootfs), up,
healthy, one episode and a fork over HTTP, down, and no sandbox left behind.

The sandbox image is reused, not rebuilt: `make test` has already built `coding-env-sandbox:latest`
from the same Dockerfile with the same build arguments (checked below), and the tests beside this
one use it. The service image gets a tag of the test's own, so a user's `coding-env-service:latest`
is left alone, and a project name of its own, so a compose project a user runs is too.
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

import docker
import httpx
import pytest
import yaml

from sandbox.docker_backend import OWNER_LABEL, SERVICE_LABEL, SERVICE_VALUE
from sandbox.image import offline_base
from sandbox.spec import DEFAULT_REMOVED_BINARIES

ROOT = Path(__file__).parents[2]
WHEELS = ROOT / "dist" / "wheels"
SERVICE_TEST_IMAGE = "coding-env-service:compose-test"
HEALTHY_WITHIN_S = 180

pytestmark = [
    pytest.mark.compose,
    pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (v1) not installed (.ci/run installs it)"),
]


class Compose:
    """`docker-compose -p PROJECT -f docker-compose.yml -f OVERRIDE ...` with the test's environment."""

    def __init__(self, project: str, override: Path, env: dict[str, str]):
        self.argv = ["docker-compose", "-p", project, "-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]
        self.env = env

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.argv, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=900)


@pytest.fixture
def compose(tmp_path: Path, unused_port: int) -> Iterator[Compose]:
    override = tmp_path / "docker-compose.test.yml"
    override.write_text(yaml.safe_dump({"version": "3.8", "services": {"service": {"image": SERVICE_TEST_IMAGE}}}))
    env = {**os.environ, "CODING_ENV_PORT": str(unused_port), "CODING_ENV_POOL_SIZE": "1"}
    if "SERVICE_BASE" not in env or "SANDBOX_BASE" not in env:
        # The offline base: `make image` leaves it when no registry answered; made here otherwise.
        base = offline_base()
        env.setdefault("SERVICE_BASE", base)
        env.setdefault("SANDBOX_BASE", base)
    compose = Compose(f"coding-env-compose-test-{os.getpid()}", override, env)
    yield compose
    compose("down", "--volumes", "--timeout", "60")


def test_compose_offline_points_compose_at_the_local_base(tmp_path: Path) -> None:
    """`make compose-offline` (the README's command for a host without a registry) leaves the wheels
    and an env file that gives both builds the debootstrap base. Run with the test venv as the
    service's (it holds [server,tasks]); `-o` keeps make from installing anything into it."""
    env_file = tmp_path / "compose.env"
    venv = Path(sys.executable).parents[1]
    made = subprocess.run(["make", "-o", f"{venv}/.installed", "compose-offline", f"SERVICE_VENV={venv}", f"ENV_FILE={env_file}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stdout + made.stderr
    base = offline_base()
    assert env_file.read_text() == f"SERVICE_BASE={base}\nSANDBOX_BASE={base}\n"
    assert any(WHEELS.glob("coding_env-*.whl")) and (WHEELS / ".dependencies").exists()
    env = {key: value for key, value in os.environ.items() if key not in ("SERVICE_BASE", "SANDBOX_BASE")}
    shown = subprocess.run(["docker-compose", "--env-file", str(env_file), "-f", str(ROOT / "docker-compose.yml"), "config"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    services = yaml.safe_load(shown.stdout)["services"]
    assert services["service"]["build"]["args"]["BASE"] == base and services["sandbox-image"]["build"]["args"]["BASE"] == base


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_compose_builds_the_sandbox_image_as_make_test_does(compose: Compose) -> None:
    """The reuse above is sound only while compose's sandbox build is `coding-env build-image`'s."""
    checked = compose("config", "--quiet")
    assert checked.returncode == 0, checked.stderr
    config = yaml.safe_load(compose("config").stdout)
    build = config["services"]["sandbox-image"]["build"]
    assert Path(build["context"]) == ROOT / "sandbox" / "images"
    assert build["args"]["REMOVED_BINARIES"].split() == list(DEFAULT_REMOVED_BINARIES)
    assert config["services"]["sandbox-image"]["image"] == "coding-env-sandbox:latest"


def first_health_verdict(client: docker.DockerClient, container: docker.models.containers.Container) -> str:
    """"healthy" or "unhealthy" as Docker's healthcheck first reports it, "died" if the container
    exits first, "timeout" if neither happens within HEALTHY_WITHIN_S."""
    since = int(time.time()) - 600  # before the container existed; its id filters out all else
    until = int(time.time()) + HEALTHY_WITHIN_S
    events = client.events(since=since, until=until, filters={"container": container.id, "event": ["health_status", "die"]}, decode=True)
    for event in events:
        if event["status"] == "die":
            return "died"
        verdict = event["status"].removeprefix("health_status: ")
        if verdict in ("healthy", "unhealthy"):
            return verdict
    return "timeout"


def fork_copies_a_file(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=120) as http:
        source = http.post("/sessions").raise_for_status().json()["session_id"]
        http.post(f"/sessions/{source}/reset", json={"task_id": "builtin/fizzbuzz"}).raise_for_status()
        write = {"type": "call_tool", "tool_name": "write_file", "arguments": {"path": "note.txt", "content": "forked\n"}}
        http.post(f"/sessions/{source}/step", json={"action": write}).raise_for_status()
        forks = http.post(f"/sessions/{source}/fork", json={"n": 2}).raise_for_status().json()["session_ids"]
        read = {"type": "call_tool", "tool_name": "read_file", "arguments": {"path": "note.txt"}}
        outputs = [http.post(f"/sessions/{fork}/step", json={"action": read}).raise_for_status().json()["observation"]["output"] for fork in forks]
        for session in [source, *forks]:
            http.delete(f"/sessions/{session}")
    return outputs == ["forked\n", "forked\n"]


def test_compose_up_serves_an_episode_and_leaves_no_sandbox(compose: Compose, docker_client: docker.DockerClient) -> None:
    if not list(WHEELS.glob("coding_env-*.whl")):
        pytest.skip("no wheels in dist/wheels: run `make wheels` (make test does)")
    built = compose("build", "service")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    up = compose("up", "-d", "--no-build")
    assert up.returncode == 0, up.stderr
    container = docker_client.containers.get(compose("ps", "-q", "service").stdout.strip())

    # The container's own healthcheck decides readiness: wait for Docker's first verdict on it
    # (events since the container was created, so a verdict already given is not missed).
    assert first_health_verdict(docker_client, container) == "healthy", compose("logs", "service").stdout[-3000:]

    published = compose("port", "service", "8000").stdout.strip()  # "0.0.0.0:PORT", as compose maps it
    url = f"http://127.0.0.1:{published.rpartition(':')[2]}"
    assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
    episode = subprocess.run([sys.executable, str(ROOT / "examples" / "http_episode.py"), url], capture_output=True, text=True, timeout=300)
    assert "done: True reward: 1.0" in episode.stdout, episode.stdout + episode.stderr
    assert fork_copies_a_file(url), "a fork must hold its source's files (through the inboxes the compose file sets up)"

    # Sandboxes the service started carry its container's hostname in their owner label.
    hostname = container.attrs["Config"]["Hostname"]

    def its_sandboxes() -> list[str]:
        listed = docker_client.api.containers(all=True, filters={"label": f"{SERVICE_LABEL}={SERVICE_VALUE}"})
        return [c["Id"] for c in listed if c["Labels"].get(OWNER_LABEL, "").startswith(hostname + ":")]

    assert its_sandboxes(), "the service's warm pool should hold a sandbox while it runs"
    down = compose("down", "--volumes", "--timeout", "60")
    assert down.returncode == 0, down.stderr
    assert its_sandboxes() == []
