"""The service as a TRL environment: pass `environment_factory(settings)` to
`GRPOTrainer(environment_factory=...)` (or `ComposerTrainer`).

TRL exposes an environment's public methods as tools, reading each method's signature and its
Google-style `Args:` docstring (`transformers.utils.get_json_schema`). Here those methods are
generated at start-up from the service's own tool schemas, so a tool added on the server shows up
in training without a client change. Every call is recorded (`tool_calls`) with its error kind and
hint: the trainer turns hinted errors into SDPO hint sites. The policy sees only the tool output,
which carries a hint only when the session was reset with `show_hints`.

Several calls in one assistant turn go to the service as one step (`_run_turn`: one `assistant_message`
holding them all), so the service applies its own rules for a message with several calls (decision
031): they run in order, a failed call does not stop the next, each counts against the task's
`max_steps`, calls after the one that ended the episode do not run, and calls past the session's
`max_calls_per_step` do not run and are answered `too_many_calls` with the service's hint. Nothing of
those rules is repeated here: each call's record is the service's answer to it. The trainer's tool
loop hands a turn's calls over together (`trainer_client.concurrent_rollouts`); a trainer that calls the
tool methods one by one makes a step per call.

A session lost mid-episode (its replica died: `SessionLostError`) loses that episode only: it is
logged, the policy is told the episode is over, the call is recorded as `sandbox_error` (the
infrastructure's, never a hint site), the rollout scores 0 and training goes on; the next `reset`
opens a new session on a live replica (decision 111).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

from env_server.models import ApiErrorCode, ErrorKind, TaskReference
from trainer_client.client import (
    ClientError,
    ClientSettings,
    CodingEnvClient,
    SessionLostError,
    StepResult,
)
from trainer_client.hint_sites import ToolCall, ToolCallRecord

log = logging.getLogger(__name__)

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}
_RESERVED = {"reset", "get_reward"}
EPISODE_OVER = "The episode is over: no more tool calls are accepted."
EPISODE_LOST = "The environment failed (not your fault): this episode is over."
"""What the policy reads when the session was lost mid-episode."""
RESET_ATTEMPTS = 3
"""Sessions a reset may lose (each on a replica that died meanwhile) before it gives up."""
def turn_message(calls: Sequence[ToolCall]) -> str:
    """A turn's calls as the text of one assistant message, in the `<tool_call>` JSON format the service
    reads. `<` is written as a JSON escape, so no argument (a file's content) can close a call early."""
    return "\n".join(
        "<tool_call>" + json.dumps({"name": name, "arguments": arguments}).replace("<", "\\u003c") + "</tool_call>"
        for name, arguments in calls
    )


class TrlEnvironment:
    """One rollout's session of the service. Tool methods are added by `environment_class`."""

    def __init__(self, settings: ClientSettings, *, grade_unsubmitted: bool = False) -> None:
        self._client = CodingEnvClient(settings)
        self._grade_unsubmitted = grade_unsubmitted
        self._finalizer = weakref.finalize(self, self._client.close)
        self.tool_calls: list[ToolCallRecord] = []
        """Every tool call of the current episode, in order (read by the trainer for hint sites)."""
        self.task_id: str | None = None
        """The task of the current episode, as the service named it."""
        self.episode_over = False
        """The policy's own calls ended the episode (`submit`, or the service's step limit)."""
        self.reward: float | None = None
        """The episode's grade, once there is one."""
        self.lost = False
        """The session was lost mid-episode (its replica died): the episode is over and scores 0."""
        self._references: dict[str, TaskReference | None] = {}
        """Task references read so far (`task_reference`), by task id."""

    def reset(self, **row: Any) -> str:
        """Start an episode on the row's `task_id` (or a `seed`-picked task); returns the task prompt.
        A session lost while resetting is replaced by a new one (at most `RESET_ATTEMPTS` times)."""
        for attempt in range(1, RESET_ATTEMPTS + 1):
            try:
                info = self._client.reset(row.get("task_id"), seed=row.get("seed"))
                break
            except SessionLostError as error:
                if attempt == RESET_ATTEMPTS:
                    raise
                log.warning("session lost during reset (%s); opening a new one", error)
        self.tool_calls = []
        self.task_id = info.task_id
        self.episode_over = False
        self.reward = None
        self.lost = False
        return info.prompt

    def get_reward(self) -> float:
        """The service's grade of the episode. An episode the policy did not submit scores 0, unless the
        environment was made with `grade_unsubmitted` (then it is submitted and graded now); a lost one scores 0."""
        if not self.episode_over and not self.lost and self._grade_unsubmitted and self.reward is None:
            # Not recorded in `tool_calls`, and `episode_over` stays False: the policy did not make this call.
            try:
                self.reward = self._client.step("submit", {}).reward
            except SessionLostError as error:
                log.warning("episode on task %s lost while grading it (%s): scored 0, training goes on", self.task_id, error)
                self.lost = True
        return float(self.reward or 0.0)

    def _run_turn(self, calls: Sequence[ToolCall]) -> list[str]:
        """One assistant turn's calls, as one step of the service; each call's output, in order."""
        if len(calls) == 1:
            return [self._call(*calls[0])]
        return self._step([name for name, _ in calls], lambda: self._client.step_message(turn_message(calls)))

    def _call(self, tool_name: str, arguments: dict[str, Any]) -> str:
        (output,) = self._step([tool_name], lambda: self._client.step(tool_name, arguments))
        return output

    def _step(self, tool_names: list[str], step: Callable[[], StepResult]) -> list[str]:
        """Send one step holding calls to `tool_names` and record the service's answer to each. An episode that
        is over is not asked again (the service would refuse the step): each call is answered `EPISODE_OVER`."""
        if self.episode_over or self.lost or self.reward is not None:  # submitted, lost, or graded by `get_reward`
            self.tool_calls.extend(ToolCallRecord(name, None, None) for name in tool_names)
            return [EPISODE_OVER] * len(tool_names)
        try:
            result = step()
        except SessionLostError as error:
            log.warning("episode on task %s lost at call %d (%s): scored 0, training goes on", self.task_id, len(self.tool_calls) + 1, error)
            self.lost = True
            self.tool_calls.append(ToolCallRecord(tool_names[0], ErrorKind.SANDBOX_ERROR, None))
            self.tool_calls.extend(ToolCallRecord(name, None, None) for name in tool_names[1:])
            return [EPISODE_LOST] + [EPISODE_OVER] * (len(tool_names) - 1)
        step_result = result.observation
        calls = step_result.calls
        if len(calls) != len(tool_names):  # the message is ours: a different count is a bug, not the policy's
            raise RuntimeError(f"the service found {len(calls)} calls in a turn of {len(tool_names)}: {[c.tool_name for c in calls]}")
        # The step's grade belongs to the call that ended the episode: the last that ran.
        grading = max((index for index, call in enumerate(calls) if call.ran), default=len(calls) - 1) if result.done else None
        for index, call in enumerate(calls):
            graded = index == grading
            self.tool_calls.append(
                ToolCallRecord(
                    call.tool_name,
                    call.error_kind,
                    call.hint,
                    step_result.tests_passed if graded else None,
                    step_result.tests_total if graded else None,
                )
            )
        if result.done:
            self.episode_over, self.reward = True, result.reward
        return [call.output for call in calls]

    def _close(self) -> None:
        """End the session now (it also ends when the environment is garbage-collected)."""
        self._finalizer()


def _python_type(schema: dict[str, Any]) -> Any:
    """The type hint `get_json_schema` turns back into (nearly) this JSON schema."""
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options is None and isinstance(schema.get("type"), list):
        options = [{"type": t} for t in schema["type"]]
    if options is not None:
        hints = [_python_type(option) for option in options if option.get("type") != "null"]
        nullable = len(hints) < len(options)
        hint = functools.reduce(lambda a, b: a | b, hints) if hints else str
        return hint | None if nullable else hint
    if schema.get("type") == "array" and "items" in schema:
        return list[_python_type(schema["items"])]
    return _JSON_TYPES.get(schema.get("type", "string"), str)


def _docstring(description: str, properties: dict[str, Any]) -> str:
    lines = [description.strip() or "Call the tool.", "", "Args:"]
    for name, schema in properties.items():
        text = " ".join(str(schema.get("description") or name).split())
        lines.append(f"    {name}: {text}")
    return "\n".join(lines) if properties else lines[0]


def _tool_method(function: dict[str, Any]) -> Callable[..., str]:
    name = function["name"]
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties", {})
    required = set(parameters.get("required", []))

    # Arguments are forwarded as given: the service validates them and answers a wrong one with a
    # typed `type_error` and a hint, which is exactly the feedback SDPO learns from.
    def call_tool(self: TrlEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    ordered = sorted(properties, key=lambda p: p not in required)  # required first, as Python demands
    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for param in ordered:
        annotations[param] = _python_type(properties[param])
        default = inspect.Parameter.empty if param in required else None
        signature.append(inspect.Parameter(param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotations[param]))
    annotations["return"] = str
    call_tool.__name__ = call_tool.__qualname__ = name
    call_tool.__doc__ = _docstring(function.get("description", ""), {p: properties[p] for p in ordered})
    call_tool.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    call_tool.__annotations__ = annotations
    return call_tool


def environment_class(tools: list[dict[str, Any]]) -> type[TrlEnvironment]:
    """A `TrlEnvironment` subclass with one method per tool (OpenAI function schemas)."""
    methods = {}
    for tool in tools:
        function = tool.get("function", tool)
        name = function["name"]
        if name in _RESERVED or name.startswith("_") or not name.isidentifier():
            raise ValueError(f"the service offers a tool named {name!r}, which cannot be an environment method")
        methods[name] = _tool_method(function)
    return type("TrlEnvironment", (TrlEnvironment,), {**methods, "__doc__": TrlEnvironment.__doc__})


def environment_factory(settings: ClientSettings, *, grade_unsubmitted: bool = False) -> Callable[[], TrlEnvironment]:
    """Reads the service's tools once and returns the factory TRL calls per rollout slot.

    Args:
        settings: Where the service is.
        grade_unsubmitted: Grade an episode the policy left unsubmitted as if it had submitted (default:
            it scores 0, so that reward means submitted work; decision 063).
    """
    with CodingEnvClient(settings) as client:
        tools = [tool for tool in client.list_tools() if settings.tools is None or tool.get("function", tool)["name"] in settings.tools]
    return functools.partial(environment_class(tools), settings, grade_unsubmitted=grade_unsubmitted)


def task_reference(environment: TrlEnvironment) -> TaskReference | None:
    """The reference solution of the environment's current task, for the SDPO teacher's `reference` source
    only (decision 129): read on first use through the privileged route, then kept. None when the client holds
    no privileged token or the task has no reference. A function, not a method: TRL offers an environment's
    public methods to the policy as tools."""
    task_id, settings = environment.task_id, environment._client.settings
    if task_id is None or not settings.privileged_token:
        return None
    if task_id not in environment._references:
        try:
            environment._references[task_id] = environment._client.task_reference(task_id)
        except ClientError as error:
            if error.code != ApiErrorCode.NO_REFERENCE.value:
                raise
            environment._references[task_id] = None
    return environment._references[task_id]
