"""The HTTP contract: a 5xx keeps the connection, and the OpenAPI schema says what routes answer."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from fastapi import Request

from env_server.app import create_app
from tests.service.conftest import HttpSession
from tests.support.service import builtin_registry, running_service, service_settings


@pytest.fixture(scope="module")
def failing_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real app plus two test-only routes that fail with an unhandled exception."""
    settings = service_settings(tmp_path_factory.mktemp("failing"), pool_size=0, grading_pool_size=0)
    app = create_app(settings, tasks=builtin_registry())

    @app.get("/test-only/fail")
    async def fail() -> None:
        raise RuntimeError("a bug")

    @app.post("/test-only/fail-with-body")
    async def fail_with_body(request: Request) -> None:
        await request.json()
        raise KeyError("a bug")

    with running_service(settings, app) as url:
        yield url


@pytest.mark.parametrize(("method", "path", "body"), [("GET", "/test-only/fail", None), ("POST", "/test-only/fail-with-body", b'{"a": 1}')])
def test_a_500_keeps_the_keep_alive_connection_usable(failing_service: str, method: str, path: str, body: bytes | None) -> None:
    address = urlparse(failing_service)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers={"content-type": "application/json"})
        failed = connection.getresponse()
        assert failed.status == 500
        assert json.loads(failed.read())["code"] == "internal_error"
        assert not failed.will_close  # no `Connection: close`
        socket_before = connection.sock
        connection.request("GET", "/health")
        healthy = connection.getresponse()
        assert healthy.status == 200 and json.loads(healthy.read()) == {"status": "healthy"}
        assert connection.sock is socket_before  # the same TCP connection answered
    finally:
        connection.close()


def test_one_httpx_client_goes_on_after_a_500(failing_service: str) -> None:
    with httpx.Client(base_url=failing_service, timeout=30) as client:
        assert client.get("/test-only/fail").status_code == 500
        assert client.get("/health").status_code == 200
        assert client.post("/sessions").status_code == 201


@pytest.fixture(scope="module")
def openapi(failing_service: str) -> dict:
    return httpx.get(f"{failing_service}/openapi.json", timeout=30).json()


EXPECTED_REFUSALS = {
    ("post", "/reset"): {400, 401, 404, 413, 422, 500, 503},
    ("post", "/step"): {400, 401, 409, 413, 422, 500, 503},
    ("post", "/sessions"): {401, 500, 503},
    ("post", "/sessions/{session_id}/reset"): {400, 401, 404, 413, 422, 500, 503},
    ("post", "/sessions/{session_id}/step"): {400, 401, 404, 409, 413, 422, 500, 503},
    ("get", "/sessions/{session_id}/state"): {401, 404, 422, 500},
    ("get", "/sessions/{session_id}/trajectory"): {401, 404, 409, 422, 500},
    ("delete", "/sessions/{session_id}"): {401, 404, 422, 500},
    ("get", "/tasks"): {401, 404, 422, 500},
    ("get", "/metadata"): {401, 500},
    ("get", "/metrics"): {401, 500},
}


@pytest.mark.parametrize(("method", "path"), EXPECTED_REFUSALS, ids=lambda v: v if isinstance(v, str) else None)
def test_the_schema_documents_each_routes_refusals(openapi: dict, method: str, path: str) -> None:
    responses = openapi["paths"][path][method]["responses"]
    refusals = {int(status) for status in responses if int(status) >= 400}
    assert refusals == EXPECTED_REFUSALS[(method, path)]
    for status in refusals:
        assert responses[str(status)]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ApiError"}


def _resolve(openapi: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_the_step_schema_is_the_union_of_action_types(openapi: dict, failing_service: str) -> None:
    body = _resolve(openapi, openapi["paths"]["/sessions/{session_id}/step"]["post"]["requestBody"]["content"]["application/json"]["schema"])
    action = body["properties"]["action"]
    assert action["discriminator"]["propertyName"] == "type"
    assert set(action["discriminator"]["mapping"]) == {"list_tools", "call_tool", "assistant_message"}
    required = {tag: set(_resolve(openapi, {"$ref": ref}).get("required", [])) for tag, ref in action["discriminator"]["mapping"].items()}
    assert required["call_tool"] == {"tool_name"} and required["assistant_message"] == {"content"}
    # `{"action": {}}` has no `type`: the schema refuses it, and so does the route.
    with httpx.Client(base_url=failing_service, timeout=30) as client:
        session_id = client.post("/sessions").json()["session_id"]
        refused = client.post(f"/sessions/{session_id}/step", json={"action": {}})
        assert refused.status_code == 422 and refused.json()["code"] == "invalid_request"
        assert "action" in refused.json()["message"]
        assert client.post(f"/sessions/{session_id}/step", json={"action": {"type": "list_tools"}}).status_code == 200
        client.delete(f"/sessions/{session_id}")


def test_docs_name_every_error_kind() -> None:
    from env_server.models import ErrorKind

    api = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    table = api[api.index("## Error kinds") : api.index("## Hints")]
    assert all(f"| `{kind.value}` |" in table for kind in ErrorKind)


def _shape(value: object) -> object:
    """The keys of `value` at every depth, and the type of each leaf: what two replies to the same step share."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


def test_the_step_lane_answers_a_step_as_the_route_does(session: HttpSession) -> None:
    """A valid step sent as `application/json` is answered ahead of FastAPI (decision 143); sent as another JSON
    type it is passed on, and FastAPI's route answers it. The two answers have the same status, headers and reply."""
    session.reset(task_id="builtin/fizzbuzz")
    body = json.dumps({"action": {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "echo same"}}}).encode()
    path = f"/sessions/{session.id}/step"
    by_lane = session.client.post(path, content=body, headers={"content-type": "application/json"})
    by_route = session.client.post(path, content=body, headers={"content-type": "application/vnd.api+json"})
    assert by_lane.status_code == by_route.status_code == 200, (by_lane.text, by_route.text)
    volatile = {"date", "content-length"}
    assert {k: v for k, v in by_lane.headers.items() if k not in volatile} == {k: v for k, v in by_route.headers.items() if k not in volatile}
    lane, route = by_lane.json(), by_route.json()
    assert _shape(lane) == _shape(route)
    assert lane["observation"]["output"] == route["observation"]["output"] == "same"
    assert session.state()["step_count"] == 2  # both steps ran, one each way
