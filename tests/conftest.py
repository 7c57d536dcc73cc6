"""Suite-wide pieces: the shared services, and a guard that the tests leave no sandbox container behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.service import SharedServices

ENGINE_MARKERS = ("docker", "bwrap", "compose", "redteam")
"""Markers of tests that need a sandbox engine (Docker or bubblewrap) or a server over one."""

DOCKER_MARKERS = ("docker", "compose", "redteam")
"""Markers of tests that start Docker containers."""

ENGINE_FIXTURES = frozenset({"services", "sandbox", "workspace", "docker_client", "make_service", "deployment"})
"""Fixtures that start a sandbox or a server: a test that uses one needs the engine too."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `docker` every test that reaches the engine through a fixture, so that `make test-unit`
    (`-m "not docker and not bwrap and not compose and not redteam"`) selects exactly the tests that
    need neither an engine nor a server. Runs after the areas' own hooks, which mark by file."""
    for item in items:
        if not any(item.get_closest_marker(name) for name in ENGINE_MARKERS) and ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)


def _leaked_sandboxes(since: float) -> list[str]:
    """Sandbox containers this run left: owned by this process, or by a dead process of ours
    (a server subprocess, a killed caller) created after `since`."""
    try:
        import docker
        import docker.errors

        from sandbox.docker_backend import (
            CREATED_AT_LABEL,
            OWNER_LABEL,
            SERVICE_LABEL,
            SERVICE_VALUE,
            current_owner,
            owner_is_alive,
        )

        api = docker.from_env().api
        containers = api.containers(all=True, filters={"label": f"{SERVICE_LABEL}={SERVICE_VALUE}"})
    except Exception:  # no SDK or no engine: nothing can have leaked
        return []
    leaked = []
    for container in containers:
        labels = container["Labels"]
        owner = labels.get(OWNER_LABEL, "")
        if float(labels.get(CREATED_AT_LABEL, 0)) < since:
            continue
        if owner != current_owner() and owner_is_alive(owner):
            continue  # a live process of someone else's run, or another host's
        try:
            # Auto-removal of a stopped container may still be under way; give it its event.
            if container["State"] != "running":
                api.wait(container["Id"], timeout=30, condition="removed")
                continue
        except docker.errors.NotFound:
            continue
        except Exception:
            pass
        leaked.append(f"{container['Id'][:12]} ({container['Status']})")
    return leaked


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.time()
    yield
    if not any(item.get_closest_marker(name) for item in request.session.items for name in DOCKER_MARKERS):
        # A run without Docker tests (`make test`'s bubblewrap pass, beside the Docker one) starts no container;
        # the containers of the other pass's ended services are that pass's to count.
        return
    leaked = _leaked_sandboxes(started)
    assert not leaked, f"sandbox containers left after the test run: {leaked}"


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServices]:
    """The one server fixture: `services.get(**settings_overrides)` is the session's service with
    those settings (started on first use); every area's service fixture asks it."""
    from tests.support.service import SharedServices  # the server stack, only for tests that use it

    shared = SharedServices(tmp_path_factory.mktemp("services"))
    yield shared
    shared.close()
