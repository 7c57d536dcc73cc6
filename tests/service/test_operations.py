"""Operations: auth, capacity, idle expiry, dropped sockets, leaks, restarts, metrics, tasks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx
import pytest
import websockets.sync.client
from openenv.core.generic_client import GenericEnvClient
from websockets.exceptions import InvalidStatus

from env_server.tasks.splits import split_of
from sandbox.docker_backend import OWNER_LABEL, SANDBOX_ID_LABEL
from tests.service.conftest import HttpSession, containers_of


def _ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws"


def test_token_guards_every_route_but_health(make_service: Callable[..., str]) -> None:
    url = make_service(api_token="s3cret", pool_size=1)
    good = {"Authorization": "Bearer s3cret"}
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = client.post("/sessions", headers=headers)
            assert response.status_code == 401 and response.json()["code"] == "unauthorized"
        assert client.get("/metrics").status_code == 401
        assert client.post("/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1}).status_code == 401
        session_id = client.post("/sessions", headers=good).json()["session_id"]
        step = {"action": {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "true"}}}
        # A valid session step is answered ahead of FastAPI's routes (decision 143), behind the same guard.
        assert client.post(f"/sessions/{session_id}/step", json=step).status_code == 401
        assert client.post(f"/sessions/{session_id}/step", json=step, headers=good).status_code == 200
    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(_ws_url(url))
    assert refused.value.response.status_code == 401
    with GenericEnvClient(base_url=url, headers=good).sync() as env:
        assert env.reset(task_id="builtin/fizzbuzz").observation["task_id"] == "builtin/fizzbuzz"


def test_capacity_is_a_typed_503_and_frees_up(make_service: Callable[..., str]) -> None:
    url = make_service(max_sessions=2, pool_size=1, admission_timeout_s=0)  # refused at once, not queued
    with httpx.Client(base_url=url, timeout=60) as client:
        first, _second = HttpSession(client), HttpSession(client)
        refused = client.post("/sessions")
        assert refused.status_code == 503
        assert refused.json()["code"] == "capacity_reached"
        assert refused.json()["detail"] == {"active_sessions": 2, "max_sessions": 2}
        with websockets.sync.client.connect(_ws_url(url)) as ws:
            frame = json.loads(ws.recv())
            assert frame["type"] == "error" and frame["data"]["code"] == "CAPACITY_REACHED"
        first.close()
        assert client.post("/sessions").status_code == 201


def test_idle_session_is_closed_and_its_sandbox_removed(make_service: Callable[..., str], docker_client: docker.DockerClient) -> None:
    url = make_service(idle_timeout_s=0.5, pool_size=1)
    with httpx.Client(base_url=url, timeout=60) as client:
        session = HttpSession(client)
        session.reset(task_id="builtin/fizzbuzz")
        (container,) = containers_of(docker_client, session.state()["sandbox_id"])
        container.wait(condition="removed", timeout=60)
        assert client.get(f"/sessions/{session.id}/state").json()["code"] == "session_not_found"


def test_dropped_websocket_frees_its_sandbox_at_once(base_url: str, docker_client: docker.DockerClient) -> None:
    ws = websockets.sync.client.connect(_ws_url(base_url))
    ws.send(json.dumps({"type": "reset", "data": {"task_id": "builtin/fizzbuzz"}}))
    assert json.loads(ws.recv())["type"] == "observation"
    ws.send(json.dumps({"type": "state"}))
    sandbox_id = json.loads(ws.recv())["data"]["sandbox_id"]
    (container,) = containers_of(docker_client, sandbox_id)
    ws.socket.shutdown(socket.SHUT_RDWR)  # drop the TCP connection without a close handshake
    ws.socket.close()
    container.wait(condition="removed", timeout=60)


def test_websocket_errors_keep_the_connection_usable(base_url: str) -> None:
    with websockets.sync.client.connect(_ws_url(base_url)) as ws:
        ws.send("{broken")
        assert json.loads(ws.recv())["data"]["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "arguments": {"command": "ls"}}}))
        assert json.loads(ws.recv())["data"]["error"]["code"] == "invalid_request"
        ws.send(json.dumps({"type": "dance"}))
        assert json.loads(ws.recv())["data"]["code"] == "VALIDATION_ERROR"
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "builtin/fizzbuzz"}}))
        assert json.loads(ws.recv())["type"] == "observation"


@pytest.mark.slow
def test_hundred_sessions_leave_no_container(make_service: Callable[..., str], docker_client: docker.DockerClient) -> None:
    url = make_service(pool_size=4, max_sessions=16)
    sandbox_ids: list[str] = []

    def one_session(_: int) -> str:
        with httpx.Client(base_url=url, timeout=120) as client:
            session = HttpSession(client)
            session.reset(task_id="builtin/fizzbuzz")
            session.step("bash", {"command": "true"})
            sandbox_id = session.state()["sandbox_id"]
            session.close()
            return sandbox_id

    with ThreadPoolExecutor(8) as threads:
        sandbox_ids = list(threads.map(one_session, range(100)))
    assert len(set(sandbox_ids)) == 100
    # The list endpoint's own records (no inspect per container): other services' sandboxes may be
    # removed while this runs, and inspecting one that is gone raises NotFound.
    listed = docker_client.api.containers(all=True, filters={"label": SANDBOX_ID_LABEL})
    leftovers = [c["Id"] for c in listed if c["Labels"][SANDBOX_ID_LABEL] in sandbox_ids]
    assert leftovers == []


def _serve(listener: socket.socket, **env: str) -> subprocess.Popen[str]:
    """`coding-env serve --fd` on the test's bound socket in a child process; returns once uvicorn
    reports start-up complete. The test holds the socket, so a restart gets the same port."""
    variables = {**os.environ, "CODING_ENV_POOL_SIZE": "1", **env}
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("coding-env")), "serve", "--fd", str(listener.fileno())],
        env=variables, stderr=subprocess.PIPE, text=True, pass_fds=[listener.fileno()],
    )
    for line in process.stderr:
        if "Application startup complete" in line:
            threading.Thread(target=process.stderr.read, daemon=True).start()  # keep draining the pipe
            return process
    raise RuntimeError(f"service exited with {process.wait()}")


def test_orphans_of_a_killed_server_are_reaped_at_restart(docker_client: docker.DockerClient) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = _serve(listener)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            session = HttpSession(client)
            session.reset(task_id="builtin/fizzbuzz")
            sandbox_id = session.state()["sandbox_id"]
        server.send_signal(signal.SIGKILL)
        server.wait()
        assert len(containers_of(docker_client, sandbox_id)) == 1  # left behind by the killed server
        restarted = _serve(listener)
        try:
            assert containers_of(docker_client, sandbox_id) == []  # reaped before start-up completed
        finally:
            restarted.send_signal(signal.SIGTERM)
            # uvicorn shuts down gracefully, then re-raises the signal it caught.
            assert restarted.wait(60) in (0, -signal.SIGTERM)
        owner_prefix = f"{socket.gethostname()}:{restarted.pid}:"
        owned = docker_client.containers.list(all=True, filters={"label": OWNER_LABEL})
        assert [c for c in owned if c.labels[OWNER_LABEL].startswith(owner_prefix)] == []
    finally:
        if server.poll() is None:
            server.kill()
        listener.close()


def test_metrics_count_steps_kinds_and_grades(client: httpx.Client, session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    session.step("bash", {"command": "nosuchcmd"})
    session.step("submit")
    text = client.get("/metrics").text
    for needle in (
        "coding_env_active_sessions",
        "coding_env_pool_ready_sandboxes",
        'coding_env_steps_total{tool="bash"}',
        'coding_env_error_kinds_total{kind="command_not_found"}',
        'coding_env_step_latency_seconds_bucket{le="0.005",transport="http"}',
        "coding_env_episodes_graded_total",
        "coding_env_reward_bucket",
        "coding_env_sandbox_failures_total",
    ):
        assert needle in text, needle


def test_monitor_flags_are_withheld_until_the_episode_is_done(client: httpx.Client, session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    flagged = session.step("bash", {"command": "find / -name '*.pyc' | head"})
    assert "monitor_flags" not in flagged["observation"]["metadata"]
    assert flagged["observation"]["step_monitor_flags"] == [] and flagged["observation"]["calls"][0]["monitor_flags"] == []
    assert client.get(f"/sessions/{session.id}/trajectory").json()["steps"][0]["monitor_flags"] == []
    graded = session.step("submit")
    assert graded["observation"]["metadata"]["monitor_flags"] == ["bytecode_read"]
    assert client.get(f"/sessions/{session.id}/trajectory").json()["steps"][0]["monitor_flags"] == ["bytecode_read"]
    assert 'coding_env_monitor_flags_total{flag="bytecode_read"}' in client.get("/metrics").text


def test_monitor_penalty_from_the_service_settings_lowers_the_reward(make_service: Callable[..., str]) -> None:
    from tests.service.test_episode_end import ADD_SOLUTION, ADD_TASK

    url = make_service(pool_size=1, grading_pool_size=1, monitor_penalty=0.25)
    with httpx.Client(base_url=url, timeout=300) as client:
        session = HttpSession(client)
        session.reset(task=ADD_TASK)
        session.step("write_file", {"path": "solution.py", "content": ADD_SOLUTION})
        assert "monitor_flags" not in session.step("bash", {"command": "javap -c Add.class || true"})["observation"]["metadata"]
        graded = session.step("submit")
        assert graded["metadata"]["tests_passed"] == graded["metadata"]["tests_total"] == 1
        assert graded["metadata"]["monitor_flags"] == ["bytecode_read", "decompiler_use"]
        assert graded["reward"] == 0.5  # 1.0, minus 0.25 per distinct flag
        session.close()


def test_tasks_are_paged(client: httpx.Client) -> None:
    page = client.get("/tasks", params={"limit": 2, "offset": 1}).json()
    assert page["total"] >= 4 and len(page["task_ids"]) == 2 and page["offset"] == 1
    assert all(t.startswith("builtin/") for t in page["task_ids"])
    assert client.get("/tasks", params={"suite": "nope"}).json()["code"] == "task_not_found"
    train = client.get("/tasks", params={"split": "train"}).json()
    assert train["total"] >= 4 and all(split_of(t) == "train" for t in train["task_ids"])
    assert client.get("/tasks", params={"split": "held_out"}).json()["total"] == 0  # builtin's ids all hash to train
    assert client.get("/tasks", params={"split": "test"}).status_code == 422
