"""The client and the TRL environment adapter against the real service with Docker sandboxes."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from transformers.utils import get_json_schema

from env_server.models import ErrorKind
from env_server.tasks.splits import split_of
from tests.support.service import SharedServices
from tests.trainer.conftest import SERVICE_TOKEN
from trainer_client.client import AsyncCodingEnvClient, AuthError, CapacityError, ClientError, ClientSettings, CodingEnvClient
from trainer_client.environment import EPISODE_OVER, environment_class, environment_factory

pytestmark = pytest.mark.docker


def settings(url: str, **overrides) -> ClientSettings:
    return ClientSettings(base_url=url, api_token=SERVICE_TOKEN, **overrides)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_sync_client_runs_an_episode(service_url: str, transport: str) -> None:
    with CodingEnvClient(settings(service_url, transport=transport)) as client:
        info = client.reset("builtin/fizzbuzz")
        assert info.task_id == "builtin/fizzbuzz" and info.prompt and info.max_steps > 0
        assert {t["function"]["name"] for t in info.tools} >= {"bash", "submit"}
        result = client.step("bash", {"command": "echo hi"})
        assert result.observation.output.strip() == "hi" and result.observation.error_kind is None
        failed = client.step("bash", {"command": "definitely-not-a-command"})
        assert failed.observation.error_kind is ErrorKind.COMMAND_NOT_FOUND
        assert failed.observation.hint
        graded = client.step("submit", {})
        assert graded.done and graded.reward == 0.0  # the untouched stub raises NotImplementedError: 0 of 6 checks


def test_async_client_runs_sessions_concurrently(service_url: str) -> None:
    async def episode(transport: str) -> str:
        async with AsyncCodingEnvClient(settings(service_url, transport=transport)) as client:
            await client.reset("builtin/reverse_words")
            return (await client.step("bash", {"command": "echo $((6*7))"})).observation.output.strip()

    async def both() -> list[str]:
        return await asyncio.gather(episode("http"), episode("ws"))

    assert asyncio.run(both()) == ["42", "42"]


def test_task_ids_come_from_the_service_page_by_page(service_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trainer_client.client._TASK_PAGE", 2)  # several pages of a small suite
    with CodingEnvClient(settings(service_url)) as client:
        ids = client.task_ids("builtin")
        assert len(ids) > 2 and len(set(ids)) == len(ids) and all(task_id.startswith("builtin/") for task_id in ids)
        assert set(ids) <= set(client.task_ids())  # every suite the service serves
        # The split is the service's (a hash of each id): builtin's ids all fall in train.
        assert client.task_ids("builtin", split="train") == ids and client.task_ids("builtin", split="held_out") == []
        assert all(split_of(task_id) == "train" for task_id in ids)
        with pytest.raises(ClientError) as refused:
            client.task_ids("no_such_suite")
        assert refused.value.code == "task_not_found"


def test_missing_token_is_an_auth_error(service_url: str) -> None:
    for transport in ("http", "ws"):
        with pytest.raises(AuthError), CodingEnvClient(ClientSettings(base_url=service_url, transport=transport)) as client:
            client.reset("builtin/fizzbuzz")


def test_full_service_is_a_capacity_error(services: SharedServices) -> None:
    # A service of its own that refuses at once when full (the shared one queues for a minute).
    service_url = services.get(api_token=SERVICE_TOKEN, max_sessions=6, admission_timeout_s=0).url
    clients = [CodingEnvClient(settings(service_url)) for _ in range(6)]
    try:
        for client in clients:
            client.reset("builtin/fizzbuzz")
        with pytest.raises(CapacityError), CodingEnvClient(settings(service_url)) as extra:
            extra.reset("builtin/fizzbuzz")
    finally:
        for client in clients:
            client.close()


def test_unreachable_service_fails_after_retries() -> None:
    with pytest.raises(ClientError, match="unreachable"), CodingEnvClient(
        ClientSettings(base_url="http://127.0.0.1:9", connect_attempts=2, backoff_s=0.01)
    ) as client:
        client.reset("builtin/fizzbuzz")


def test_environment_methods_are_the_service_tools_with_trl_readable_schemas(service_url: str) -> None:
    factory = environment_factory(settings(service_url))
    environment = factory()
    try:
        with CodingEnvClient(settings(service_url)) as client:
            served = {t["function"]["name"]: t["function"] for t in client.list_tools()}
        methods = {
            name for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")
        }
        assert methods == set(served)
        for name, function in served.items():
            schema = get_json_schema(getattr(environment, name))
            schema = schema.get("function", schema)
            assert schema["name"] == name
            assert set(schema["parameters"]["properties"]) == set(function["parameters"].get("properties", {}))
            assert set(schema["parameters"].get("required", [])) == set(function["parameters"].get("required", []))

        prompt = environment.reset(task_id="builtin/fix_median")
        assert "median" in prompt.lower()
        assert environment.bash(command="echo ok").strip() == "ok"
        output = environment.bash(command="pytset -q")
        wrong_type = environment.read_file(path=["not", "a", "path"])
        kinds = [record.error_kind for record in environment.tool_calls]
        assert kinds == [None, ErrorKind.COMMAND_NOT_FOUND, ErrorKind.TYPE_ERROR]
        hint = environment.tool_calls[1].hint
        assert hint and hint not in output  # recorded for SDPO, never shown to the policy
        assert wrong_type
        assert environment.get_reward() == 0.0  # not submitted: scores 0 without asking the service
        assert not environment.episode_over
        environment.submit()
        assert environment.episode_over and environment.task_id == "builtin/fix_median"
        assert environment.get_reward() == 0.0  # graded on the service: the untouched median fails all 4 checks
        assert environment.bash(command="true") == EPISODE_OVER
        assert len(environment.tool_calls) == 5
    finally:
        environment._close()


def test_an_unsubmitted_episode_is_graded_only_when_asked(service_url: str) -> None:
    environment = environment_factory(settings(service_url), grade_unsubmitted=True)()
    try:
        environment.reset(task_id="builtin/fizzbuzz")
        environment.bash(command="true")
        reward = environment.get_reward()
        assert reward == 0.0 and environment.reward == reward  # graded on the service: the untouched stub fails every check
        assert not environment.episode_over  # the policy did not end it: a `no_tool_call` turn stays blamed
        assert environment.bash(command="true") == EPISODE_OVER
        assert len(environment.tool_calls) == 2  # the grading submit is not the policy's call
    finally:
        environment._close()


def test_a_new_server_tool_appears_without_a_client_change() -> None:
    extra = {"type": "function", "function": {"name": "lint", "description": "Run the linter.", "parameters": {
        "type": "object",
        "properties": {"paths": {"type": "array", "items": {"type": "string"}, "description": "Files."},
                       "fix": {"anyOf": [{"type": "boolean"}, {"type": "null"}], "description": "Apply fixes."}},
        "required": ["paths"]}}}
    cls = environment_class([extra])
    schema = get_json_schema(cls.lint)
    schema = schema.get("function", schema)
    assert schema["parameters"]["properties"]["paths"] == {"type": "array", "items": {"type": "string"}, "description": "Files."}
    assert schema["parameters"]["properties"]["fix"]["type"] == "boolean"
    assert schema["parameters"]["required"] == ["paths"]


def test_a_tool_named_like_a_reserved_method_is_refused() -> None:
    with pytest.raises(ValueError, match="reset"):
        environment_class([{"type": "function", "function": {"name": "reset", "parameters": {}}}])
