"""Bad requests get a clear typed 4xx and the service keeps serving; schemathesis finds no 5xx and
no answer the OpenAPI schema does not document."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest
import schemathesis
import websockets.sync.client
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance, status_code_conformance

from tests.service.conftest import HttpSession


def _assert_refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["code"] == code


@dataclass(frozen=True)
class BadRequest:
    """A request the service must refuse with `status` and the typed `code`."""

    method: str
    path: str
    """`{session}` stands for the id of a live session that has not been reset."""
    status: int
    code: str
    json: object = None
    content: bytes | None = None


BASH_LS = {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "ls"}}

BAD_REQUESTS = {
    "body that is not JSON": BadRequest("POST", "/sessions/{session}/step", 400, "invalid_json", content=b"{not json"),
    "action that is a string": BadRequest("POST", "/sessions/{session}/step", 422, "invalid_request", json={"action": "bash ls"}),
    "unknown action type": BadRequest("POST", "/sessions/{session}/step", 422, "invalid_request", json={"action": {"type": "fly"}}),
    "seed that is not a number": BadRequest("POST", "/sessions/{session}/reset", 422, "invalid_request", json={"seed": "zero"}),
    "inline task without an id": BadRequest("POST", "/sessions/{session}/reset", 422, "invalid_request", json={"task": {"prompt": "no id"}}),
    "unknown task id": BadRequest("POST", "/sessions/{session}/reset", 404, "task_not_found", json={"task_id": "nope/nothing"}),
    "unknown route": BadRequest("GET", "/no/such/route", 404, "not_found"),
    "wrong method": BadRequest("PUT", "/sessions", 405, "method_not_allowed"),
    "step in an unknown session": BadRequest("POST", "/sessions/unknown-session/step", 404, "session_not_found", json={"action": {"type": "list_tools"}}),
    "delete of an unknown session": BadRequest("DELETE", "/sessions/unknown-session", 404, "session_not_found"),
    "trajectory before the session is reset": BadRequest("GET", "/sessions/{session}/trajectory", 409, "episode_not_started"),
    "OpenEnv step before any reset": BadRequest(
        "POST", "/step", 409, "episode_not_started", json={"action": {"type": "call_tool", "tool_name": "bash"}}
    ),
}


@pytest.mark.parametrize("bad", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_bad_request_gets_a_typed_4xx_and_the_service_keeps_serving(client: httpx.Client, session: HttpSession, bad: BadRequest) -> None:
    headers = {"content-type": "application/json"} if bad.content is not None else None
    path = bad.path.format(session=session.id)
    _assert_refused(client.request(bad.method, path, json=bad.json, content=bad.content, headers=headers), bad.status, bad.code)
    assert client.get("/health").json() == {"status": "healthy"}


def test_a_step_after_the_episode_ended_is_409_and_the_session_can_start_again(client: httpx.Client, session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    session.step("submit")
    _assert_refused(client.post(f"/sessions/{session.id}/step", json={"action": BASH_LS}), 409, "episode_done")
    session.reset(task_id="builtin/fizzbuzz")
    assert session.step("bash", {"command": "echo still-serving"})["observation"]["output"].strip() == "still-serving"


def test_an_unpaired_surrogate_escape_in_a_call_is_answered_and_echoed_over_http_and_websocket(base_url: str, session: HttpSession) -> None:
    """JSON lets a client escape half a surrogate pair (`\\ud800`), which no UTF-8 can hold: the step is still
    answered, with the arguments echoed as the same escape, and the service keeps serving."""
    frame = '{"type": "call_tool", "tool_name": "bash", "arguments": {"command": "echo \\ud800"}}'
    session.reset(task_id="builtin/fizzbuzz")
    response = session.client.post(f"/sessions/{session.id}/step", content=f'{{"action": {frame}}}', headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["observation"]["calls"][0]["arguments"] == {"command": "echo \ud800"}
    with websockets.sync.client.connect(base_url.replace("http://", "ws://") + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "builtin/fizzbuzz"}}))
        assert json.loads(ws.recv(timeout=60))["type"] == "observation"
        ws.send(f'{{"type": "step", "data": {frame}}}')
        reply = json.loads(ws.recv(timeout=60))
        assert reply["type"] == "observation", reply
        assert reply["data"]["observation"]["calls"][0]["arguments"] == {"command": "echo \ud800"}
        ws.send(json.dumps({"type": "step", "data": BASH_LS}))
        assert json.loads(ws.recv(timeout=60))["data"]["observation"]["error_kind"] is None


def test_oversized_body_is_413(client: httpx.Client, session: HttpSession) -> None:
    big = {"action": {"type": "call_tool", "tool_name": "write_file", "arguments": {"path": "a", "content": "x" * (5 * 1024 * 1024)}}}
    _assert_refused(client.post(f"/sessions/{session.id}/step", json=big), 413, "body_too_large")

    def chunks():  # no Content-Length: the limit must hold for streamed bodies too
        for _ in range(6):
            yield b"x" * (1024 * 1024)

    _assert_refused(client.post(f"/sessions/{session.id}/step", content=chunks()), 413, "body_too_large")
    assert client.get("/health").status_code == 200


def test_reading_a_huge_file_is_capped_like_command_output(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    session.step("bash", {"command": "python3 -c \"open('big.txt', 'w').write('head\\n' + 'x' * 5000000 + '\\ntail\\n')\""})
    observation = session.step("read_file", {"path": "big.txt"})["observation"]
    assert observation["truncated"] is True and observation["error_kind"] is None
    assert len(observation["output"]) < 70 * 1024
    assert observation["output"].startswith("head\n") and observation["output"].endswith("tail\n")
    assert "characters truncated" in observation["output"]


def test_schemathesis_finds_no_server_errors_and_every_answer_is_documented(base_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def no_server_error(case: schemathesis.Case) -> None:
            response = case.call(timeout=60)
            case.validate_response(response, checks=checks)

        no_server_error()
