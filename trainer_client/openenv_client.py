"""The service as an OpenEnv environment: `CodingEnv`, OpenEnv's `EnvClient` typed with the
service's own action, observation and state classes, the ones its `/schema` publishes.

    from env_server.openenv_models import CallToolStep
    from trainer_client.openenv_client import CodingEnv

    with CodingEnv(base_url="http://127.0.0.1:8000").sync() as env:
        reset = env.reset(task_id="builtin/fizzbuzz")  # observation: CodingResetObservation
        step = env.step(CallToolStep(tool_name="bash", arguments={"command": "ls"}))  # CodingObservation
        env.state()  # CodingState

One client is one session on OpenEnv's WebSocket (`/ws`), so one sandbox, freed when the client
closes. `CodingEnv.from_docker_image(image)` first starts the service image, with what it needs to
start sandboxes (`trainer_client.service_container`), and stops it when the client closes.

`trainer_client.client` is the project's own client (HTTP sessions or the WebSocket, several
replicas, typed refusals, forks). This one is for code written against OpenEnv's `EnvClient`
(TRL's OpenEnv examples, OpenEnv's tooling) and does what an `EnvClient` does: reset, step, state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv.core.client_types import StepResult
from openenv.core.containers.runtime import ContainerProvider
from openenv.core.env_client import EnvClient
from openenv.core.env_server.mcp_types import ListToolsObservation
from pydantic import TypeAdapter

from env_server.openenv_models import AnyAction, CodingObservation, CodingResetObservation, CodingState
from trainer_client.service_container import ServiceContainer

if TYPE_CHECKING:
    from openenv.core.env_client import _BootstrapResult

AnyObservation = CodingResetObservation | CodingObservation | ListToolsObservation
"""What a reset answers (`CodingResetObservation`), and a step: `CodingObservation` for a tool call
or an assistant message, `ListToolsObservation` for `list_tools`."""

OBSERVATIONS: TypeAdapter[AnyObservation] = TypeAdapter(AnyObservation)
"""The three forbid unknown fields and require fields the others lack, so exactly one validates a
payload: reset and step answers need no marker of which they are."""


class CodingEnv(EnvClient[AnyAction, AnyObservation, CodingState]):
    """A session of the service through OpenEnv's `EnvClient` (async; `.sync()` for blocking use)."""

    def _step_payload(self, action: AnyAction) -> dict[str, Any]:
        return action.model_dump(mode="json")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AnyObservation]:
        # OpenEnv's wire format lifts `reward` and `done` out of the observation; they belong in it.
        fields = {**payload["observation"], "reward": payload.get("reward"), "done": payload.get("done", False)}
        observation = OBSERVATIONS.validate_python(fields)
        return StepResult(observation=observation, reward=observation.reward, done=observation.done, metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> CodingState:
        return CodingState.model_validate(payload)

    @classmethod
    def from_docker_image(cls, image: str, provider: ContainerProvider | None = None, **kwargs: Any) -> _BootstrapResult[CodingEnv]:
        """OpenEnv's `from_docker_image` with a `ServiceContainer` unless `provider` is given: OpenEnv's
        default provider would run the service without the Docker engine its sandboxes start on.
        `kwargs` go to `provider.start_container` (`port`, `env_vars`: `CODING_ENV_*` settings)."""
        return super().from_docker_image(image, provider or ServiceContainer(), **kwargs)
