"""A real uvicorn server on 127.0.0.1 (free port) around the real app, with real sandboxes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from env_server.app import create_app
from env_server.settings import ServiceSettings
from env_server.tasks import TaskRegistry
from env_server.tasks import builtin
from sandbox.docker_backend import SANDBOX_ID_LABEL

NEEDS_NO_DOCKER = {"test_tool_call_parser.py", "test_hint_judge.py", "test_monitor_rules.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every service test but the parser's drives real sandboxes: mark them `docker`."""
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if path.parent == here and path.name not in NEEDS_NO_DOCKER:
            item.add_marker(pytest.mark.docker)


def builtin_registry() -> TaskRegistry:
    registry = TaskRegistry()
    registry.register(builtin.SUITE, builtin.BuiltinSuite)
    return registry


class _Server(uvicorn.Server):
    """uvicorn.Server that says when it is listening (an event, not a poll)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextmanager
def running_service(settings: ServiceSettings, app: FastAPI | None = None) -> Iterator[str]:
    """Serve `app` (default: `create_app(settings)`) in a thread; yields the base URL; shuts down gracefully."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app or create_app(settings, tasks=builtin_registry()), log_level="warning", ws_max_size=settings.max_body_bytes
    )
    server = _Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    if not server.ready.wait(60):
        raise RuntimeError("service did not start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def service_settings(tmp_path: Path, **overrides: object) -> ServiceSettings:
    base: dict[str, object] = {
        "pool_size": 2,
        "max_sessions": 16,
        "reap_orphans_on_start": False,
        "trajectory_dir": tmp_path / "trajectories",
    }
    return ServiceSettings(**{**base, **overrides})


@pytest.fixture(scope="session")
def service_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service")


@pytest.fixture(scope="session")
def base_url(service_dir: Path) -> Iterator[str]:
    """The shared service (default settings, small pool)."""
    with running_service(service_settings(service_dir)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as http:
        yield http


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start an extra service with settings overrides; all are stopped at test end."""
    stack: list = []

    def start(**overrides: object) -> str:
        cm = running_service(service_settings(tmp_path, **overrides))
        stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    return docker.from_env()


def containers_of(docker_client: docker.DockerClient, sandbox_id: str) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"{SANDBOX_ID_LABEL}={sandbox_id}"})


class HttpSession:
    """A stateful HTTP session, as a framework without WebSockets would drive it."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        response = client.post("/sessions")
        assert response.status_code == 201, response.text
        self.id = response.json()["session_id"]

    def reset(self, **body: object) -> dict:
        response = self.client.post(f"/sessions/{self.id}/reset", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def step(self, tool_name: str, arguments: dict | str | None = None) -> dict:
        return self.act({"type": "call_tool", "tool_name": tool_name, "arguments": arguments or {}})

    def act(self, action: dict) -> dict:
        response = self.client.post(f"/sessions/{self.id}/step", json={"action": action})
        assert response.status_code == 200, response.text
        return response.json()

    def state(self) -> dict:
        return self.client.get(f"/sessions/{self.id}/state").json()

    def close(self) -> None:
        self.client.delete(f"/sessions/{self.id}")


@pytest.fixture
def session(client: httpx.Client) -> Iterator[HttpSession]:
    s = HttpSession(client)
    yield s
    s.close()
