"""The wire types as OpenEnv sees them: OpenEnv's action, observation and state base classes layered
over the field sets of `env_server.models`, so each field is declared once.

Clients import these (`trainer_client.openenv_client`) with the `[openenv]` extra only: this module
needs openenv and pydantic, never the server's runtime (sandbox, grading, FastAPI).
"""

from __future__ import annotations

from typing import Annotated

from openenv.core.env_server.mcp_types import CallToolObservation, ToolError, ToolErrorType
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, TypeAdapter

from env_server.models import AssistantMessageAction, EpisodeState, ErrorKind, ListToolsAction, ResetInfo, StepObservation, ToolCallAction


class ListToolsStep(Action, ListToolsAction):
    """`{"type": "list_tools"}`."""


class CallToolStep(Action, ToolCallAction):
    """`{"type": "call_tool", "tool_name": ..., "arguments": {...} | "<json text>"}`."""


class AssistantMessageStep(Action, AssistantMessageAction):
    """`{"type": "assistant_message", "content": "<the model's whole message>"}`."""


AnyAction = ListToolsStep | CallToolStep | AssistantMessageStep
ACTIONS: TypeAdapter[AnyAction] = TypeAdapter(Annotated[AnyAction, Field(discriminator="type")])
"""Validates an action dict (dispatching on `type`) and publishes the action JSON schema."""


class CodingObservation(CallToolObservation, StepObservation):
    """A step's observation: OpenEnv's `CallToolObservation` plus the typed `StepObservation` fields."""


class CodingResetObservation(Observation, ResetInfo):
    """Reset's observation: the task statement, the tool schemas and the step budget."""


class CodingState(State, EpisodeState):
    """OpenEnv's state (episode_id; step_count: the calls counted against `max_steps`) plus the episode's task and outcome."""


OPENENV_TOOL_ERRORS: dict[ErrorKind, ToolErrorType] = {
    ErrorKind.TOOL_NOT_FOUND: ToolErrorType.TOOL_NOT_FOUND,
    ErrorKind.JSON_DECODE: ToolErrorType.INVALID_ARGS,
    ErrorKind.TYPE_ERROR: ToolErrorType.INVALID_ARGS,
    ErrorKind.SANDBOX_ERROR: ToolErrorType.TRANSPORT_ERROR,
}
"""Kinds that are failures of the call itself, not of the tool, as OpenEnv's error types. Here, with the OpenEnv
types, rather than in `env_server.error_kinds`: classifying an outcome needs no OpenEnv, whose server package an
import of it brings in (0.8 s; fastmcp, mcp)."""


def openenv_tool_error(kind: ErrorKind | None, message: str) -> ToolError | None:
    """The observation's OpenEnv `error` for a step whose lead call failed with `kind`: set only when the call
    itself failed (OpenEnv clients read tool failures from the output)."""
    error_type = OPENENV_TOOL_ERRORS.get(kind) if kind else None
    return ToolError(error_type=error_type, message=message) if error_type is not None else None
