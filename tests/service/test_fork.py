"""Forking a session (`POST /sessions/{id}/fork`, WS `fork` frames, `client.fork`), through the
public API with real sandboxes: what a fork carries, that forks are independent and graded on
their own workspace with the same hidden tests, the session cap, and every refusal."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import docker
import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from env_server.models import MAX_FORKS_PER_CALL
from tests.service.conftest import HttpSession
from trainer_client.client import AsyncCodingEnvClient, ClientSettings, CodingEnvClient

HIDDEN_MARKER = "add(-5, 2) == -3"
TASK = {
    "id": "inline/fork-add",
    "prompt": "Implement add(a, b) in solution.py.",
    "files": {"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    "hidden_tests": {
        "test_hidden_add.py": f"from solution import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n\n\ndef test_negative():\n    assert {HIDDEN_MARKER}\n"
    },
}
SOLUTIONS = {
    "right": "def add(a, b):\n    return a + b\n",
    "half": "def add(a, b):\n    return a + b if a > 0 else 0\n",  # passes test_small only
}


class ForkedSession(HttpSession):
    """A session a fork made (it needs no `POST /sessions`)."""

    def __init__(self, client: httpx.Client, session_id: str) -> None:
        self.client, self.id = client, session_id


def fork(client: httpx.Client, session_id: str, n: int) -> list[HttpSession]:
    response = client.post(f"/sessions/{session_id}/fork", json={"n": n})
    assert response.status_code == 201, response.text
    ids = response.json()["session_ids"]
    assert len(ids) == n == len(set(ids)) and session_id not in ids
    return [ForkedSession(client, fork_id) for fork_id in ids]


def output(session: HttpSession, tool: str, **arguments: object) -> str:
    observation = session.step(tool, arguments)["observation"]
    assert observation["error_kind"] is None, observation
    return observation["output"]


def history(client: httpx.Client, session: HttpSession) -> list[dict]:
    """The trajectory's steps without their wall-clock fields."""
    record = client.get(f"/sessions/{session.id}/trajectory").json()
    return [{k: v for k, v in step.items() if k != "started_at"} for step in record["steps"]]


def refusal(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code, body
    return body


def active_sessions(client: httpx.Client) -> float:
    line = next(line for line in client.get("/metrics").text.splitlines() if line.startswith("coding_env_active_sessions "))
    return float(line.split()[1])


def test_forks_continue_the_episode_and_are_independent(client: httpx.Client, session: HttpSession) -> None:
    session.reset(task=TASK)
    session.step("write_file", {"path": "notes.txt", "content": "before the fork\n"})
    session.step("bash", {"command": "mkdir -p pkg/empty && echo nested > pkg/data.txt && chmod 700 pkg"})
    forks = fork(client, session.id, 3)
    try:
        source_state, source_history = session.state(), history(client, session)
        assert source_state["step_count"] == 2
        for copy in forks:
            state = copy.state()
            assert state["step_count"] == 2 and state["done"] is False and state["session_id"] == copy.id
            assert (state["task_id"], state["max_steps"], state["show_hints"]) == (TASK["id"], source_state["max_steps"], False)
            assert state["episode_id"] != source_state["episode_id"]
            assert history(client, copy) == source_history
            assert output(copy, "read_file", path="notes.txt") == "before the fork\n"
            assert output(copy, "bash", command="stat -c %a pkg; ls pkg; cat pkg/data.txt") == "700\ndata.txt\nempty\nnested"
            # The hidden tests were never in the agent's sandbox, so no copy of it holds them.
            assert output(copy, "bash", command=f"grep -rlF -- '{HIDDEN_MARKER}' /workspace /tmp; echo searched") == "searched"

        # Writes in one copy reach neither the others nor the source.
        everyone = [session, *forks]
        for index, member in enumerate(everyone):
            member.step("write_file", {"path": "mine.txt", "content": f"member {index}\n"})
        for index, member in enumerate(everyone):
            assert output(member, "read_file", path="mine.txt") == f"member {index}\n"
            assert output(member, "list_dir", path=".").split() == output(session, "list_dir", path=".").split()
        forks[0].step("bash", {"command": "rm notes.txt"})
        assert output(session, "read_file", path="notes.txt") == "before the fork\n"

        # A fork of a fork: trees of rollouts.
        (grandchild,) = fork(client, forks[1].id, 1)
        forks.append(grandchild)
        assert grandchild.state()["step_count"] == forks[1].state()["step_count"]

        # Each is graded on its own workspace with the same hidden tests.
        solutions = {session: "right", forks[0]: "half", forks[2]: "right", grandchild: "half"}
        for member, name in solutions.items():
            member.step("write_file", {"path": "solution.py", "content": SOLUTIONS[name]})
        # (reward, hidden tests passed): all-or-nothing reward, the count reported all the same.
        expected = {session: (1.0, 2), forks[0]: (0.0, 1), forks[1]: (0.0, 0), forks[2]: (1.0, 2), grandchild: (0.0, 1)}
        for member, (reward, passed) in expected.items():
            graded = member.step("submit")
            assert graded["done"] is True and graded["reward"] == reward, graded
            assert (graded["observation"]["tests_passed"], graded["observation"]["tests_total"]) == (passed, 2)
    finally:
        for copy in forks:
            copy.close()


def test_a_fork_carries_the_hint_setting_and_the_failure_streak(client: httpx.Client, session: HttpSession) -> None:
    session.reset(task=TASK, show_hints=True)
    for _ in range(2):
        assert session.step("bash", {"command": "no_such_command_here"})["observation"]["error_kind"] == "command_not_found"
    (copy,) = fork(client, session.id, 1)
    try:
        assert copy.state()["show_hints"] is True
        third = copy.step("bash", {"command": "no_such_command_here"})["observation"]
        assert third["error_kind"] == "repeated_failure" and third["underlying_error_kind"] == "command_not_found"
        assert "Hint:" in third["output"]
    finally:
        copy.close()


def test_only_the_workspace_is_carried(client: httpx.Client, session: HttpSession) -> None:
    session.reset(task=TASK)
    session.step("bash", {"command": "echo scratch > /tmp/scratch.txt && echo home > $HOME/home.txt && (setsid sleep 600 >/dev/null 2>&1 &)"})
    (copy,) = fork(client, session.id, 1)
    try:
        listing = output(copy, "bash", command="ls /tmp; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo end")
        assert "scratch.txt" not in listing and "home.txt" not in listing and "sleep 600" not in listing
    finally:
        copy.close()


def test_a_fork_waits_for_the_call_in_flight(client: httpx.Client, session: HttpSession) -> None:
    """Whichever the service takes first, the fork holds the step entirely or not at all."""
    session.reset(task=TASK)
    step = threading.Thread(target=session.step, args=("bash", {"command": "touch started && sleep 2 && touch finished"}))
    step.start()
    (copy,) = fork(client, session.id, 1)
    step.join()
    try:
        files = set(output(copy, "list_dir", path=".").split())
        took_step = copy.state()["step_count"] == 2  # the call in flight plus the list_dir above
        assert {"started", "finished"} <= files if took_step else not files & {"started", "finished"}
    finally:
        copy.close()


@pytest.mark.parametrize(
    "body",
    [{"n": 0}, {"n": -1}, {"n": MAX_FORKS_PER_CALL + 1}, {"n": "many"}, {"n": None}, {}, {"n": 1, "extra": True}, [1]],
)
def test_a_bad_n_is_refused(client: httpx.Client, session: HttpSession, body: object) -> None:
    session.reset(task=TASK)
    refusal(client.post(f"/sessions/{session.id}/fork", json=body), 422, "invalid_request")
    assert session.state()["step_count"] == 0


def test_forks_of_what_cannot_be_forked_are_refused(client: httpx.Client, session: HttpSession) -> None:
    refusal(client.post(f"/sessions/{uuid.uuid4().hex}/fork", json={"n": 1}), 404, "session_not_found")
    refusal(client.post(f"/sessions/{session.id}/fork", json={"n": 1}), 409, "episode_not_started")
    session.reset(task=TASK)
    session.step("submit")
    body = refusal(client.post(f"/sessions/{session.id}/fork", json={"n": 1}), 409, "episode_done")
    assert "reset" in body["message"]


def test_forks_count_against_the_cap_all_or_none(make_service: Callable[..., str]) -> None:
    # Refusing at once when full: the queue's own timeout is not what is tested here.
    with httpx.Client(base_url=make_service(max_sessions=4, admission_timeout_s=0), timeout=120) as client:
        source = HttpSession(client)
        source.reset(task=TASK)
        body = refusal(client.post(f"/sessions/{source.id}/fork", json={"n": 4}), 503, "capacity_reached")
        assert body["detail"] == {"active_sessions": 1, "max_sessions": 4, "requested": 4}
        assert active_sessions(client) == 1  # nothing half-created
        forks = fork(client, source.id, 3)
        assert active_sessions(client) == 4
        refusal(client.post("/sessions"), 503, "capacity_reached")
        forks[0].close()
        assert client.post("/sessions").status_code == 201


def test_a_failed_fork_leaves_no_session_and_no_sandbox(make_service: Callable[..., str], docker_client: docker.DockerClient) -> None:
    label = f"fork-test={uuid.uuid4().hex}"
    key, value = label.split("=")
    url = make_service(pool_size=0, grading_pool_size=0, sandbox={"labels": {key: value}})
    with httpx.Client(base_url=url, timeout=120) as client:
        source = HttpSession(client)
        source.reset(task=TASK)
        # The copy runs with the agent's rights: a file it made unreadable cannot be copied.
        source.step("bash", {"command": "echo secret > locked.txt && chmod 000 locked.txt"})
        body = refusal(client.post(f"/sessions/{source.id}/fork", json={"n": 2}), 422, "invalid_request")
        assert "locked.txt" in body["message"]
        assert active_sessions(client) == 1
        assert len(docker_client.containers.list(all=True, filters={"label": label})) == 1  # the source's only
        source.step("bash", {"command": "chmod 600 locked.txt"})
        (copy,) = fork(client, source.id, 1)
        assert output(copy, "read_file", path="locked.txt") == "secret\n"


def test_forks_through_inboxes_carry_the_workspace_and_leave_no_archive(make_service: Callable[..., str], tmp_path: Path) -> None:
    # With `sandbox.inbox_root` the archive is written once into the source's inbox and
    # hard-linked into each fork's (decision 012): same copies, same refusals, nothing left over.
    inboxes = tmp_path / "inboxes"
    url = make_service(pool_size=1, grading_pool_size=0, sandbox={"inbox_root": str(inboxes)})
    with httpx.Client(base_url=url, timeout=120) as client:
        source = HttpSession(client)
        source.reset(task=TASK)
        source.step("bash", {"command": "mkdir -p pkg && printf 'x\\n' > pkg/x.txt && ln -s pkg/x.txt link && head -c 300000 /dev/urandom > blob && md5sum blob > blob.md5"})
        forks = fork(client, source.id, 3)
        for copy in forks:
            assert output(copy, "bash", command="md5sum -c blob.md5 && readlink link && cat link") == "blob: OK\npkg/x.txt\nx"
        forks[0].step("bash", {"command": "echo changed > pkg/x.txt"})
        assert output(forks[1], "read_file", path="pkg/x.txt") == output(source, "read_file", path="pkg/x.txt") == "x\n"
        assert [path for path in inboxes.rglob("*") if path.is_file()] == []
        source.step("bash", {"command": "echo secret > locked.txt && chmod 000 locked.txt"})
        body = refusal(client.post(f"/sessions/{source.id}/fork", json={"n": 2}), 422, "invalid_request")
        assert "locked.txt" in body["message"]
        assert [path for path in inboxes.rglob("*") if path.is_file()] == []
        for session in [source, *forks]:
            session.close()


def test_fork_over_websocket(base_url: str, client: httpx.Client) -> None:
    url = "ws://" + base_url.split("://", 1)[1] + "/ws"
    with ws_connect(url) as ws:

        def send(kind: str, data: dict) -> dict:
            ws.send(json.dumps({"type": kind, "data": data}))
            return json.loads(ws.recv(timeout=120))

        assert send("reset", {"task": TASK})["type"] == "observation"
        send("step", {"type": "call_tool", "tool_name": "write_file", "arguments": {"path": "ws.txt", "content": "over ws\n"}})
        refused = send("fork", {"n": 0})
        assert refused["type"] == "error" and refused["data"]["error"]["code"] == "invalid_request"
        reply = send("fork", {"n": 2})
        assert reply["type"] == "fork" and len(reply["data"]["session_ids"]) == 2
    # The forks are `/sessions` sessions: they outlive the connection that made them.
    for fork_id in reply["data"]["session_ids"]:
        copy = ForkedSession(client, fork_id)
        assert output(copy, "read_file", path="ws.txt") == "over ws\n"
        assert copy.state()["step_count"] == 2
        copy.close()


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_client_fork(base_url: str, transport: str) -> None:
    with CodingEnvClient(ClientSettings(base_url=base_url, transport=transport)) as parent:
        parent.reset(task=TASK)
        parent.step("write_file", {"path": "shared.txt", "content": "from the parent\n"})
        children = parent.fork(2)
        try:
            for index, child in enumerate(children):
                assert child.step("read_file", {"path": "shared.txt"}).observation.output == "from the parent\n"
                child.step("write_file", {"path": "shared.txt", "content": f"child {index}\n"})
            assert parent.step("read_file", {"path": "shared.txt"}).observation.output == "from the parent\n"
            assert children[0].step("read_file", {"path": "shared.txt"}).observation.output == "child 0\n"
        finally:
            for child in children:
                child.close()


def test_async_client_fork(base_url: str) -> None:
    async def episode() -> None:
        async with AsyncCodingEnvClient(ClientSettings(base_url=base_url)) as parent:
            await parent.reset(task=TASK)
            await parent.step("write_file", {"path": "solution.py", "content": SOLUTIONS["right"]})
            children = await parent.fork(2)
            try:
                graded = await asyncio.gather(*(child.step("submit") for child in children))
                assert [result.reward for result in graded] == [1.0, 1.0]
                assert not (await parent.step("read_file", {"path": "solution.py"})).done
            finally:
                await asyncio.gather(*(child.close() for child in children))

    asyncio.run(episode())


def test_the_schema_documents_the_fork_routes_refusals(client: httpx.Client) -> None:
    route = client.get("/openapi.json").json()["paths"]["/sessions/{session_id}/fork"]["post"]
    assert {int(status) for status in route["responses"] if int(status) >= 400} == {400, 401, 404, 409, 413, 422, 500, 503}
    assert "201" in route["responses"]
