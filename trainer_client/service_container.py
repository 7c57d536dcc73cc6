"""The service image run as a container for OpenEnv's `from_docker_image` (`ServiceContainer`).

OpenEnv's own `LocalDockerProvider` runs an image with a published port and environment variables
and nothing else. That is enough for an environment that lives inside its container; this one
does not: the service starts every episode's sandbox as a sibling container on the host's Docker
engine (docker-compose.yml's `service` mounts the engine's socket for that), and it needs the
sandbox image (`coding-env-sandbox:latest`) there. `ServiceContainer` is the same contract
(`ContainerProvider`) with the socket mounted, a readiness wait long enough for the service's warm
pools, and a graceful stop, so that the service closes its sandboxes before its container goes.

Mounting the engine's socket gives the container root on the host, as it does under Compose:
run only the project's own image this way.
"""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any

import httpx
from openenv.core.containers.runtime import ContainerProvider

DOCKER_SOCKET = "/var/run/docker.sock"
SERVICE_PORT = 8000
"""The port the image's service listens on (its `CODING_ENV_PORT`, `EXPOSE 8000`)."""


class ContainerFailed(RuntimeError):
    """The service container could not be started, or exited before it was ready."""


class ServiceContainer(ContainerProvider):
    """One container of the service image, with the host's Docker engine mounted for its sandboxes."""

    def __init__(self, docker_socket: str = DOCKER_SOCKET, ready_timeout_s: float = 300.0, stop_timeout_s: int = 60) -> None:
        self.docker_socket = docker_socket
        """The host engine's socket, mounted at the same path the service's Docker SDK looks at."""
        self.ready_timeout_s = ready_timeout_s
        """Longest wait for `/health`: start-up fills the warm pools, several sandbox starts."""
        self.stop_timeout_s = stop_timeout_s
        """Grace after SIGTERM, in which the service closes every session and its sandbox."""
        self._container: str | None = None

    def start_container(self, image: str, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any) -> str:
        """Run `image` detached, published on `port` (default: a free one) of the loopback interface;
        `env_vars` are the service's settings (`CODING_ENV_*`). Returns the service's base URL."""
        if kwargs:
            raise TypeError(f"ServiceContainer takes no options {sorted(kwargs)}")
        host_port = port or _free_port()
        argv = ["run", "--detach", "--publish", f"127.0.0.1:{host_port}:{SERVICE_PORT}"]
        argv += ["--volume", f"{self.docker_socket}:{DOCKER_SOCKET}"]
        for name, value in (env_vars or {}).items():
            argv += ["--env", f"{name}={value}"]
        started = _docker(*argv, image)
        if started.returncode != 0:
            raise ContainerFailed(f"docker run {image} failed ({started.returncode}): {started.stderr.strip()}")
        self._container = started.stdout.strip()
        return f"http://127.0.0.1:{host_port}"

    def wait_for_ready(self, base_url: str, timeout_s: float | None = None) -> None:
        """Returns once `GET /health` answers 200; raises `ContainerFailed` as soon as the container
        is gone (a start-up that failed) and `TimeoutError` after `timeout_s` (default: `ready_timeout_s`)."""
        limit = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base_url}/health", timeout=5.0, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet: uvicorn binds after the service's start-up
            if not self._running():
                raise ContainerFailed(f"the service container exited before {base_url} answered /health:\n{self._log_tail()}")
            time.sleep(1.0)
        raise TimeoutError(f"the service at {base_url} did not answer /health within {limit} s:\n{self._log_tail()}")

    def stop_container(self) -> None:
        """Stop the container (SIGTERM, then `stop_timeout_s` of grace) and remove it. Safe to call twice."""
        container, self._container = self._container, None
        if container is not None:
            _docker("stop", "--time", str(self.stop_timeout_s), container)
            _docker("rm", "--force", container)

    def _running(self) -> bool:
        if self._container is None:
            return False
        return _docker("inspect", "--format", "{{.State.Running}}", self._container).stdout.strip() == "true"

    def _log_tail(self) -> str:
        """The container's last lines of output: why a start-up failed (no sandbox image, no engine)."""
        if self._container is None:
            return ""
        logs = _docker("logs", "--tail", "40", self._container)
        return (logs.stdout + logs.stderr).strip()


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    """`docker ARGS...` with its output captured; a failure is the caller's to judge (stopping a
    container that is already gone is not one)."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=600, check=False)


def _free_port() -> int:
    """A port of the loopback interface nothing listens on now (Docker binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
