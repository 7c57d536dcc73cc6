"""A sandbox that hangs while starting fails that request with a typed 503 `sandbox_unavailable`
within `sandbox_start_timeout_s` (a cold start; a pool checkout once the pool has stalled that
long), a frozen pooled sandbox is removed instead of handed out, and the service goes on serving
(decision 034). The hangs are real: a container whose entrypoint never runs the supervisor, and a
pooled container frozen with `docker pause`."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable, Iterator

import docker
import docker.errors
import httpx
import pytest

from sandbox.docker_backend import DockerDeployment
from sandbox.spec import DEFAULT_IMAGE
from tests.service.conftest import HttpSession

COLD_START_DEADLINE_S = 8
"""`sandbox_start_timeout_s` without a pool: long enough for a real cold start on a loaded machine (0.3-0.4 s
quiet, a few seconds at worst), and short, since the test waits it out twice."""

CHECKOUT_DEADLINE_S = 3
"""`sandbox_start_timeout_s` with a pool whose starts hang: how long a checkout waits for a stalled pool."""

POOL_DEADLINE_S = 60
"""`sandbox_start_timeout_s` with a healthy pool: ample for the replacement of a frozen sandbox."""

HANGING_DOCKERFILE = f"""FROM {DEFAULT_IMAGE}
ENTRYPOINT ["/bin/sh", "-c", "exec sleep 3600", "hang"]
"""
"""The sandbox image, except that its entrypoint ignores the supervisor's command and sleeps:
the container starts, the supervisor's handshake is never answered."""


@pytest.fixture
def hanging_image(docker_client: docker.DockerClient) -> Iterator[str]:
    """A throwaway tag for the hanging image; removed afterwards (the image too). The sandbox
    image's own tag is never touched."""
    tag = f"coding-env-lifecycle-hang:{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(fileobj=io.BytesIO(HANGING_DOCKERFILE.encode()), tag=tag, rm=True)
    try:
        yield tag
    finally:
        try:
            docker_client.images.remove(tag)  # only the tag, when it points at the sandbox image
        except docker.errors.ImageNotFound:
            pass
        try:
            docker_client.images.remove(image.id, force=True)
        except docker.errors.ImageNotFound:
            pass


def _labelled(docker_client: docker.DockerClient, label: str) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"coding-env.test={label}"})


def _wait_until_removed(docker_client: docker.DockerClient, label: str) -> None:
    for container in _labelled(docker_client, label):
        try:
            container.wait(condition="removed", timeout=60)
        except docker.errors.NotFound:
            pass


def _pool_ready(client: httpx.Client, count: int, timeout_s: float = 120.0) -> None:
    """Until the service's warm pool reports `count` ready sandboxes (its gauge, over HTTP)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith("coding_env_pool_ready_sandboxes ")]
        if float(lines[0].split()[1]) == count:
            return
        assert time.monotonic() < deadline, f"the warm pool never had {count} ready"


def _assert_sandbox_unavailable(response: httpx.Response, deadline_s: float) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["code"] == "sandbox_unavailable"
    assert f"within {deadline_s} s" in body["message"]


def _service_of_hanging_starts(make_service: Callable[..., str], hanging_image: str, label: str, pool_size: int, deadline_s: float) -> str:
    """A service whose sandboxes (labelled `label`) never answer the handshake, with that deadline."""
    return make_service(
        pool_size=pool_size, grading_pool_size=0, sandbox_start_timeout_s=deadline_s,
        sandbox={"image": hanging_image, "labels": {"coding-env.test": label}},
    )  # fmt: skip


def _reset(client: httpx.Client, session: HttpSession) -> httpx.Response:
    return client.post(f"/sessions/{session.id}/reset", json={"task_id": "builtin/fizzbuzz"})


def test_a_start_that_hangs_fails_the_reset_and_the_next_one_is_served(
    make_service: Callable[..., str], docker_client: docker.DockerClient, hanging_image: str
) -> None:
    label = uuid.uuid4().hex
    url = _service_of_hanging_starts(make_service, hanging_image, label, pool_size=0, deadline_s=COLD_START_DEADLINE_S)
    with httpx.Client(base_url=url, timeout=120) as client:
        session = HttpSession(client)
        _assert_sandbox_unavailable(_reset(client, session), COLD_START_DEADLINE_S)
        bash = {"action": {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "true"}}}
        _assert_sandbox_unavailable(client.post(f"/sessions/{session.id}/step", json=bash), COLD_START_DEADLINE_S)  # auto-reset
        _wait_until_removed(docker_client, label)  # the hung containers are gone
        assert client.get("/health").json() == {"status": "healthy"}
        # The engine recovers (the throwaway tag now names the real sandbox image): the same
        # service and session are served again.
        docker_client.images.get(DEFAULT_IMAGE).tag(hanging_image)
        assert session.reset(task_id="builtin/fizzbuzz")["observation"]["task_id"] == "builtin/fizzbuzz"
        assert session.step("bash", {"command": "echo served"})["observation"]["output"].strip() == "served"
        session.close()
    _wait_until_removed(docker_client, label)


def test_a_frozen_pooled_sandbox_is_removed_and_the_reset_served_by_a_live_one(
    make_service: Callable[..., str], docker_client: docker.DockerClient
) -> None:
    label = uuid.uuid4().hex
    url = make_service(
        pool_size=1, grading_pool_size=0, sandbox_start_timeout_s=POOL_DEADLINE_S, sandbox={"labels": {"coding-env.test": label}}
    )
    with httpx.Client(base_url=url, timeout=120) as client:
        _pool_ready(client, 1)
        (pooled,) = _labelled(docker_client, label)
        pooled.pause()  # its supervisor can no longer answer the liveness check
        try:
            session = HttpSession(client)
            # The ping fails, the frozen one is closed, the pool's replacement serves the reset.
            assert session.reset(task_id="builtin/fizzbuzz")["observation"]["task_id"] == "builtin/fizzbuzz"
            assert session.step("bash", {"command": "echo served"})["observation"]["output"].strip() == "served"
            try:
                pooled.wait(condition="removed", timeout=60)  # closed, never handed out
            except docker.errors.NotFound:
                pass  # already removed before the answer
        finally:
            try:
                pooled.unpause()
            except docker.errors.APIError:
                pass  # already removed
        session.close()


def test_a_pool_whose_starts_hang_fails_the_reset_within_the_bound(
    hanging_image: str, docker_client: docker.DockerClient, make_service: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `hanging_image` first: torn down last, after the service has stopped the pool's hung starts.
    # The pool's background starts keep the backend's own limit (decision 034), and stopping the service
    # waits for the one under way: a short limit here, so that the teardown does not wait Docker's minute.
    monkeypatch.setattr(DockerDeployment, "default_start_timeout_s", 2 * CHECKOUT_DEADLINE_S)
    label = uuid.uuid4().hex
    url = _service_of_hanging_starts(make_service, hanging_image, label, pool_size=1, deadline_s=CHECKOUT_DEADLINE_S)
    with httpx.Client(base_url=url, timeout=120) as client:
        session = HttpSession(client)
        _assert_sandbox_unavailable(_reset(client, session), CHECKOUT_DEADLINE_S)  # the pool stalled: no sandbox ever came
        assert client.get("/health").json() == {"status": "healthy"}
        session.close()
