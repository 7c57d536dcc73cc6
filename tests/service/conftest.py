"""The service tests' fixtures: the shared service (tests/support/service.py) and HTTP sessions on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import docker
import httpx
import pytest

from sandbox.docker_backend import SANDBOX_ID_LABEL
from tests.support.service import RunningService, SharedServices, running_service, service_settings

NEEDS_NO_DOCKER = {
    "test_tool_call_parser.py", "test_tool_call_families.py", "test_tool_call_corpus.py", "test_hint_judge.py", "test_monitor_rules.py",
    "test_tool_threads.py", "test_observation_reply.py", "test_session_step_lane.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every service test but the parser's drives real sandboxes: mark them `docker`, except the
    cases whose service runs on bubblewrap (marked `bwrap` by their `BACKENDS` parameter)."""
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if path.parent == here and path.name not in NEEDS_NO_DOCKER and not item.get_closest_marker("bwrap"):
            item.add_marker(pytest.mark.docker)


@pytest.fixture
def sandbox_backend() -> str:
    """The backend under the shared service's sandboxes; episode tests parametrise it with `BACKENDS`."""
    return "docker"


@pytest.fixture
def service(services: SharedServices, sandbox_backend: str) -> RunningService:
    """The session's shared service (test defaults) on `sandbox_backend`."""
    return services.get(sandbox_backend=sandbox_backend)


@pytest.fixture
def base_url(service: RunningService) -> str:
    return service.url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as http:
        yield http


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start a service of this test's own with settings overrides; all are stopped at test end."""
    with ExitStack() as stack:
        yield lambda **overrides: stack.enter_context(running_service(service_settings(tmp_path, **overrides)))


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
