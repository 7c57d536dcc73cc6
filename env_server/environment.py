"""The coding environment as OpenEnv sees it: one instance per session, one sandbox per episode.

    reset(task_id | task | seed)  -> CodingResetObservation (prompt, tool schemas, limits)
    step(call_tool | assistant_message | list_tools) -> CodingObservation (output, error_kind, hint)
    state                          -> CodingState

The wire field sets live in `env_server.models` (shared with clients); the classes here layer
OpenEnv's base classes over them, so each field is declared once.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import CallToolObservation, ListToolsObservation, ToolError, ToolErrorType
from openenv.core.env_server.mcp_types import Tool as McpTool
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field, TypeAdapter, ValidationError

from env_server.error_kinds import FailureStreak
from env_server.grading.grader import GradingConfig, TaskSetupError, prepare_workspace
from env_server.hints import Hint, HintGenerator
from env_server.models import (
    DEFAULT_MAX_CALLS_PER_STEP,
    ApiErrorCode,
    AssistantMessageAction,
    CallOutcome,
    CallResult,
    EpisodeEnding,
    EpisodeRecord,
    EpisodeState,
    ErrorKind,
    ListToolsAction,
    MonitorFlag,
    ResetInfo,
    TaskSpec,
    ToolCallAction,
    ToolResult,
    TrajectoryStep,
)
from env_server.grading.monitor import scan_tool_call
from env_server.package_docs import DOCUMENTATION_PATH, readme_text
from env_server.service_errors import ServiceError
from env_server.tasks import TaskRegistry
from env_server.tool_call_parser import TOOL_CALL_FAMILIES, ToolCallParseError, parse_arguments, parse_tool_calls
from env_server.tools import TOOLS, EpisodeEnd, Tool, ToolOutcome, Workspace, submit
from env_server.trajectories import EpisodeLog
from sandbox import ArchiveTooLarge, Sandbox, SandboxError

log = logging.getLogger(__name__)


class ListToolsStep(Action, ListToolsAction):
    """`{"type": "list_tools"}`."""


class CallToolStep(Action, ToolCallAction):
    """`{"type": "call_tool", "tool_name": ..., "arguments": {...} | "<json text>"}`."""


class AssistantMessageStep(Action, AssistantMessageAction):
    """`{"type": "assistant_message", "content": "<the model's whole message>"}`."""


AnyAction = ListToolsStep | CallToolStep | AssistantMessageStep
ACTIONS: TypeAdapter[AnyAction] = TypeAdapter(Annotated[AnyAction, Field(discriminator="type")])
"""Validates an action dict (dispatching on `type`) and publishes the action JSON schema."""


class CodingObservation(CallToolObservation, ToolResult):
    """A step's observation: OpenEnv's `CallToolObservation` plus the typed `ToolResult` fields."""


class CodingResetObservation(Observation, ResetInfo):
    """Reset's observation: the task statement, the tool schemas and the step budget."""


class CodingState(State, EpisodeState):
    """OpenEnv's state (episode_id; step_count: the calls counted against `max_steps`) plus the episode's task and outcome."""


# Kinds that are failures of the call itself, not of the tool: OpenEnv clients see them in `error`.
FRAMEWORK_ERRORS: dict[ErrorKind, ToolErrorType] = {
    ErrorKind.TOOL_NOT_FOUND: ToolErrorType.TOOL_NOT_FOUND,
    ErrorKind.JSON_DECODE: ToolErrorType.INVALID_ARGS,
    ErrorKind.TYPE_ERROR: ToolErrorType.INVALID_ARGS,
    ErrorKind.SANDBOX_ERROR: ToolErrorType.TRANSPORT_ERROR,
}

TOOL_PARAMETERS: dict[str, list[str]] = {name: list(t.arguments.model_fields) for name, t in TOOLS.items()}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {name: t.openai_schema() for name, t in TOOLS.items()}


def prompt_footer(tool_names: Sequence[str]) -> str:
    """Appended to every task's prompt at reset: a small model must be told how the episode works."""
    return (
        f"\n\nWork only by calling the tools: {', '.join(tool_names)}. "
        "Call submit when you are done: it ends the episode and grades your work with hidden tests."
    )


def episode_tools(names: Sequence[str] | None) -> tuple[str, ...]:
    """An episode's tools in the service's order: every tool for None, else `names` plus `submit`
    (the call that ends an episode is never taken away)."""
    if names is None:
        return tuple(TOOLS)
    unknown = sorted(set(names) - set(TOOLS))
    if unknown:
        raise ServiceError(
            ApiErrorCode.INVALID_REQUEST,
            f"unknown tools {unknown}; choose from: {', '.join(TOOLS)}",
            {"tools": list(names), "allowed": list(TOOLS)},
        )
    return tuple(name for name in TOOLS if name in names or name == "submit")


@dataclass
class _Call:
    """One call of a step's action resolved to a tool and validated arguments, or to the error that prevents it."""

    tool_name: str
    tool: Tool | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: ToolOutcome | None = None

    @property
    def parsed(self) -> dict[str, Any] | None:
        """The call as executed (`{"tool_name", "arguments"}`), or None when it could not be resolved."""
        return {"tool_name": self.tool_name, "arguments": self.arguments} if self.tool else None


@dataclass
class _Answered:
    """One call of a step, answered: what the wire reports, and for a call that ran, the outcome
    (the step's grade and episode end come from it) and the hint still to be judged."""

    result: CallResult
    outcome: ToolOutcome | None = None
    hint: Hint | None = None
    flags: list[MonitorFlag] = field(default_factory=list)
    """What the monitor flagged in the call: recorded at once, shown only once the episode is done."""


@dataclass
class _Episode:
    workspace: Workspace
    record: EpisodeRecord
    show_hints: bool
    tool_call_format: str | None = None
    """The parser family pinned at reset; None: detected per message."""
    max_calls_per_step: int = DEFAULT_MAX_CALLS_PER_STEP
    """Calls of one action that run; the rest are answered `too_many_calls`."""
    tools: tuple[str, ...] = tuple(TOOLS)
    """The tools the episode may call (set at reset); a call to another is `tool_not_found`."""
    monitor_flags: list[MonitorFlag] = field(default_factory=list)
    """Every flag raised in the episode so far, sorted: the monitor's on each call, then the grader's."""
    withheld_flags: list[list[list[MonitorFlag]]] = field(default_factory=list)
    """Per step, per call: the monitor's flags, kept out of every observation and of the record
    until the episode is done (a flag on a probe would confirm a hidden file's name); `_finish`
    writes them into the record."""
    streak: FailureStreak = field(default_factory=FailureStreak)
    done: bool = False
    reward: float | None = None
    late_hints: list[Future[None]] = field(default_factory=list)
    """One per judge answer still on its way; done once the answer is in the record."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Orders the judge's threads against the session's around `done` and `late_hints`."""

    @property
    def task(self) -> TaskSpec:
        return self.workspace.task

    @property
    def sandbox(self) -> Sandbox:
        return self.workspace.sandbox

    @property
    def calls_used(self) -> int:
        """Calls run so far, each counted against the task's `max_steps` (read from the record, so
        anything that copies the record copies the count)."""
        return sum(step.observation.calls_run for step in self.record.steps)

    def raise_flags(self, flags: Iterable[MonitorFlag]) -> None:
        self.monitor_flags = sorted({*self.monitor_flags, *flags})


class CodingEnvironment(Environment[AnyAction, Observation, CodingState]):
    """One session's environment. Not thread-safe: the session manager serialises calls."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        *,
        checkout: Callable[[], Sandbox],
        tasks: TaskRegistry,
        grader_checkout: Callable[[], Sandbox] | None = None,
        hints: HintGenerator,
        episode_log: EpisodeLog | None = None,
        session_id: str | None = None,
        retire: Callable[[Sandbox], None] = Sandbox.close,
        grading: GradingConfig | None = None,
        infrastructure_alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """`grader_checkout` gives the fresh sandbox each submission is graded in (default:
        `checkout`). `retire` disposes of a finished episode's sandbox; the service passes one that
        closes it in the background, so removing a container (~150 ms) is not on the path of reset
        or submit. `infrastructure_alive` says whether the sandbox engine answers; with the grader's
        checkout it decides who a dead sandbox is blamed on (docs/decisions/024-who-ends-an-episode.md)."""
        super().__init__()
        self._checkout = checkout
        self._grader_checkout = grader_checkout or checkout
        self._retire = retire
        self._grading = grading or GradingConfig()
        self._infrastructure_alive = infrastructure_alive
        self._grader_unavailable: Exception | None = None
        self._tasks = tasks
        self._hints = hints
        self._episode_log = episode_log
        self._session_id = session_id
        self._episode: _Episode | None = None

    # -- OpenEnv interface -------------------------------------------------------------------

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        task: TaskSpec | dict[str, Any] | None = None,
        show_hints: bool = False,
        tool_call_format: str | None = None,
        max_calls_per_step: int = DEFAULT_MAX_CALLS_PER_STEP,
        tools: Sequence[str] | None = None,
        **_: Any,
    ) -> CodingResetObservation:
        if tool_call_format is not None and tool_call_format not in TOOL_CALL_FAMILIES:
            raise ServiceError(
                ApiErrorCode.INVALID_REQUEST,
                f"unknown tool_call_format {tool_call_format!r}; one of: {', '.join(TOOL_CALL_FAMILIES)} (or null to detect it)",
                {"tool_call_format": tool_call_format, "allowed": list(TOOL_CALL_FAMILIES)},
            )
        tool_names = episode_tools(tools)
        spec = self._resolve_task(task_id, task, seed)
        if self._episode is not None:
            self._retire(self._episode.sandbox)
            self._leave(self._episode, EpisodeEnding.ABANDONED)
            self._episode = None
        sandbox = self._open_sandbox()
        try:
            prepare_workspace(sandbox, spec)
        except (TaskSetupError, ValueError) as exc:
            sandbox.close()
            raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"task {spec.id!r} cannot be set up: {exc}") from exc
        except Exception as exc:
            sandbox.close()
            raise ServiceError(ApiErrorCode.SANDBOX_UNAVAILABLE, f"preparing the workspace of {spec.id!r} failed: {exc}") from exc
        record = EpisodeRecord(
            session_id=self._session_id or "",
            episode_id=episode_id or uuid.uuid4().hex,
            task_id=spec.id,
            prompt=spec.prompt + prompt_footer(tool_names),
            tools=[TOOL_SCHEMAS[name] for name in tool_names],
            started_at=time.time(),
        )
        workspace = Workspace(sandbox, spec, fresh_sandbox=self._open_grader, grading=self._grading)
        self._episode = _Episode(
            workspace, record, show_hints, tool_call_format=tool_call_format, max_calls_per_step=max_calls_per_step, tools=tool_names
        )
        return CodingResetObservation(task_id=spec.id, prompt=record.prompt, tools=record.tools, max_steps=spec.limits.max_steps)

    def step(self, action: AnyAction, timeout_s: float | None = None, **_: Any) -> Observation:
        if isinstance(action, ListToolsStep):
            names = self._episode.tools if self._episode is not None else tuple(TOOLS)
            return ListToolsObservation(tools=[McpTool(name=name, description=TOOLS[name].description, input_schema=TOOLS[name].parameters()) for name in names])
        episode = self._active_episode()
        started_at, started = time.time(), time.perf_counter()
        answered: list[_Answered] = []
        for index, call in enumerate(_action_calls(action, episode.tool_call_format, episode.tools)):
            ended = next((a for a in answered if a.outcome is not None and a.outcome.done), None)
            if ended is not None:
                answered.append(_not_run(call, f"Not run: the episode ended at call {answered.index(ended) + 1} ({ended.result.tool_name})."))
            elif index >= episode.max_calls_per_step:
                answered.append(self._over_the_cap(call, episode))
            else:
                answered.append(self._run_call(call, episode, ran_before=sum(a.result.ran for a in answered)))
        ran = [a for a in answered if a.outcome is not None]
        outcome = next((a.outcome for a in ran if a.outcome.done), ran[-1].outcome)
        episode.withheld_flags.append([a.flags for a in answered])
        if outcome.done:
            for answer in answered:
                answer.result.monitor_flags = answer.flags
        lead = next((a for a in answered if a.result.error_kind is not None), ran[-1])
        result = _step_result(answered, lead, outcome, episode, duration_ms=(time.perf_counter() - started) * 1000)
        first = result.calls[0]
        kind = result.error_kind
        observation = CodingObservation(
            **dict(result),
            error=ToolError(error_type=FRAMEWORK_ERRORS[kind], message=lead.result.output) if kind in FRAMEWORK_ERRORS else None,
            done=outcome.done,
            reward=outcome.reward,
            metadata=_metadata(result, outcome),
        )
        step = TrajectoryStep(
            index=len(episode.record.steps),
            action=action.model_dump(exclude={"metadata"}),
            parsed_call=first.model_dump(include={"tool_name", "arguments"}) if first.arguments is not None else None,
            observation=result,
            reward=outcome.reward,
            done=outcome.done,
            started_at=started_at,
            monitor_flags=result.step_monitor_flags,
        )
        episode.record.steps.append(step)
        for answer in answered:
            if answer.hint is not None:
                self._take_late_hint(episode, answer.hint, [answer.result, result] if answer is lead else [answer.result])
        if outcome.done:
            self._finish(episode, outcome)
        return observation

    @property
    def state(self) -> CodingState:
        episode = self._episode
        if episode is None:
            return CodingState(session_id=self._session_id)
        return CodingState(
            episode_id=episode.record.episode_id,
            step_count=episode.calls_used,
            session_id=self._session_id,
            task_id=episode.task.id,
            done=episode.done,
            reward=episode.reward,
            max_steps=episode.task.limits.max_steps,
            show_hints=episode.show_hints,
            tool_call_format=episode.tool_call_format,
            max_calls_per_step=episode.max_calls_per_step,
            tools=list(episode.tools),
            sandbox_id=episode.sandbox.id,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="coding-env",
            description="Agentic coding tasks in hardened sandboxes: bash and file tools, typed error kinds, hints, "
            "hidden-test grading.",
            version="0.1.0",
            readme_content=readme_text(),
            documentation_url=DOCUMENTATION_PATH,  # made absolute by the route, which knows the base URL
        )

    def close(self) -> None:
        if self._episode is not None:
            self._episode.sandbox.close()
            self._leave(self._episode, EpisodeEnding.CLOSED)
            self._episode = None

    # -- Beyond OpenEnv ----------------------------------------------------------------------

    def trajectory(self) -> EpisodeRecord:
        """The current (or last) episode as recorded so far, once the judge hints it is waiting
        for have arrived (at most the judge's request timeout)."""
        episode = self._active_episode(allow_done=True)
        with episode.lock:
            pending = list(episode.late_hints)
        if pending:
            wait_for_futures(pending, timeout=self._hints.settle_timeout_s)
        return episode.record

    # -- internals ---------------------------------------------------------------------------

    def _resolve_task(self, task_id: str | None, task: TaskSpec | dict[str, Any] | None, seed: int | None) -> TaskSpec:
        if task is not None:
            try:
                return TaskSpec.model_validate(task)
            except ValidationError as exc:
                raise ServiceError(ApiErrorCode.INVALID_REQUEST, "invalid inline task spec", exc.errors(include_url=False)) from exc
        if task_id is None:
            ids = self._tasks.ids("builtin")
            task_id = ids[(seed or 0) % len(ids)]
        try:
            return self._tasks.get(task_id)
        except KeyError as exc:
            raise ServiceError(ApiErrorCode.TASK_NOT_FOUND, f"unknown task {task_id!r}") from exc

    def _open_sandbox(self) -> Sandbox:
        try:
            return self._checkout()
        except Exception as exc:
            raise ServiceError(ApiErrorCode.SANDBOX_UNAVAILABLE, f"no sandbox could be started: {exc}") from exc

    def _active_episode(self, allow_done: bool = False) -> _Episode:
        if self._episode is None:
            raise ServiceError(ApiErrorCode.EPISODE_NOT_STARTED, "reset the session before stepping it")
        if self._episode.done and not allow_done:
            raise ServiceError(ApiErrorCode.EPISODE_DONE, "the episode is over; reset to start another")
        return self._episode

    def _run_call(self, call: _Call, episode: _Episode, *, ran_before: int) -> _Answered:
        """Run one call (or answer its resolution error), grading the workspace when it uses the
        last of `max_steps`; `ran_before` calls of the same step have run."""
        started = time.perf_counter()
        flags = scan_tool_call(call.tool_name, call.arguments, episode.task) if call.tool else []
        episode.raise_flags(flags)  # before grading: a flagged last call counts against its own episode
        outcome = call.error or self._run(call, episode)
        if not outcome.done and episode.calls_used + ran_before + 1 >= episode.task.limits.max_steps:
            outcome = self._grade_at_step_limit(outcome, episode)
        if outcome.grade is not None:
            episode.raise_flags(outcome.grade.monitor_flags)
        kind = episode.streak.observe(outcome.error_kind)
        hint = self._hints.hint(
            kind, output=outcome.output, call=call.parsed, task_prompt=episode.task.prompt, underlying=outcome.error_kind, tools=episode.tools
        )
        result = CallResult(
            tool_name=call.tool_name,
            output=_with_hint(outcome.output, hint.text, episode.show_hints),
            exit_code=outcome.exit_code,
            error_kind=kind,
            hint=hint.text,
            truncated=outcome.truncated,
            duration_ms=(time.perf_counter() - started) * 1000,
            underlying_error_kind=outcome.error_kind if kind is ErrorKind.REPEATED_FAILURE else None,
            arguments=call.arguments if call.tool else None,
        )
        return _Answered(result, outcome, hint, flags)

    def _over_the_cap(self, call: _Call, episode: _Episode) -> _Answered:
        """A call after the step's cap: not run, answered `too_many_calls` with its hint."""
        text = (
            f"Not run: at most {episode.max_calls_per_step} tool calls of one message run, and this is call "
            f"{episode.max_calls_per_step + 1} or later. Send it again in your next message."
        )
        hint = self._hints.hint(
            ErrorKind.TOO_MANY_CALLS, output=text, call=call.parsed, task_prompt=episode.task.prompt, tools=episode.tools
        )
        answered = _not_run(call, _with_hint(text, hint.text, episode.show_hints), ErrorKind.TOO_MANY_CALLS, hint.text)
        answered.hint = hint
        return answered

    def _open_grader(self) -> Sandbox:
        """The grading sandbox; a failure to get one is the infrastructure's, remembered so that
        whatever grading makes of it, the episode is aborted rather than scored."""
        try:
            return self._grader_checkout()
        except Exception as exc:
            self._grader_unavailable = exc
            raise

    def _run(self, call: _Call, episode: _Episode) -> ToolOutcome:
        self._grader_unavailable = None
        grading = call.tool_name == "submit"
        try:
            if grading:  # the episode's flags go to grading explicitly: the penalty counts them
                outcome = submit(episode.workspace, monitor_flags=episode.monitor_flags)
            else:
                outcome = call.tool.run(episode.workspace, **call.arguments)
        except SandboxError as exc:
            outcome = self._sandbox_failure(exc, episode, grading)
        except Exception as exc:
            if not grading:
                raise
            # Whatever the workspace holds must not crash grading into a 5xx: it scores 0.
            outcome = _grading_failed(episode, exc)
        if grading and self._grader_unavailable is not None:
            outcome = _aborted(f"no grading sandbox could be started: {self._grader_unavailable}")
        return outcome

    def _sandbox_failure(self, exc: SandboxError, episode: _Episode, grading: bool) -> ToolOutcome:
        """Who a `SandboxError` is blamed on (docs/decisions/024-who-ends-an-episode.md): the engine
        gone is the infrastructure's (abort, reward null); anything else that happens to a sandbox
        the agent has been acting in is the agent's (reward 0)."""
        if not _answers(self._infrastructure_alive):
            return _aborted(f"the sandbox engine does not answer: {exc}")
        if _answers(episode.sandbox.is_alive):
            if grading:
                return _grading_failed(episode, exc)
            return ToolOutcome(f"Sandbox failure: {exc}", error_kind=ErrorKind.SANDBOX_ERROR)
        kind = ErrorKind.OOM if "OOM killer" in str(exc) else ErrorKind.SANDBOX_ERROR
        return _ended(kind, f"The sandbox died: {exc}")

    def _grade_at_step_limit(self, last: ToolOutcome, episode: _Episode) -> ToolOutcome:
        """The last step's outcome, graded: its output followed by the grading's, the grading's
        error kind if it has one."""
        graded = self._run(_Call("submit", TOOLS["submit"]), episode)
        return dataclasses.replace(
            last,
            output=f"{last.output}\n\n[step limit reached] {graded.output}".lstrip(),
            error_kind=graded.error_kind or last.error_kind,
            grade=graded.grade,
            end=graded.end,
            step_limit_reached=True,
        )

    def _take_late_hint(self, episode: _Episode, hint: Hint, targets: list[CallOutcome]) -> None:
        """When the judge answers after the step went out, its hint replaces the template in the
        record (in the call's result, and in the step's when that call leads it); a finished
        episode is logged once its last late hint has landed."""
        if hint.later is None:
            return
        landed: Future[None] = Future()

        def land(answer: Future[str | None]) -> None:
            if not answer.cancelled() and answer.exception() is None and answer.result():
                for target in targets:
                    target.hint = answer.result()
            # Logged under the lock: `trajectory()` reads `late_hints` under it too, so once it
            # sees none pending, the episode's log line is already written.
            with episode.lock:
                episode.late_hints.remove(landed)
                if episode.done and not episode.late_hints:
                    self._log(episode)
            landed.set_result(None)

        episode.late_hints.append(landed)
        hint.later.add_done_callback(land)

    def _finish(self, episode: _Episode, outcome: ToolOutcome) -> None:
        episode.reward = outcome.reward
        record = episode.record
        record.reward = outcome.reward
        if outcome.grade is not None:
            record.tests_passed, record.tests_total = outcome.grade.tests_passed, outcome.grade.tests_total
        # The graded sandbox is of no further use; free it now rather than at the next reset.
        self._retire(episode.sandbox)
        self._end_record(episode, _ending(outcome))

    def _leave(self, episode: _Episode, ending: EpisodeEnding) -> None:
        """An episode the client left before it ended (a reset onto another, the session closed):
        recorded as `ending`, ungraded, when it took at least one step (one that took none has
        nothing to read, and every stateless `/reset` makes one)."""
        if not episode.done and episode.record.steps:
            self._end_record(episode, ending)

    def _end_record(self, episode: _Episode, ending: EpisodeEnding) -> None:
        """The record completed (its ending, the monitor's flags, withheld until now) and logged once
        the judge's late hints have landed."""
        record = episode.record
        record.ended_at = time.time()
        record.ending = ending
        record.monitor_flags = list(episode.monitor_flags)
        for step, calls in zip(record.steps, episode.withheld_flags):
            for call, flags in zip(step.observation.calls, calls):
                call.monitor_flags = flags
            step.monitor_flags = step.observation.step_monitor_flags = sorted({flag for flags in calls for flag in flags})
        with episode.lock:
            episode.done = True
            if not episode.late_hints:
                self._log(episode)

    def _log(self, episode: _Episode) -> None:
        if self._episode_log is not None:
            self._episode_log.append(episode.record)

    # -- Forking (docs/decisions/035-forking-a-session.md) --------------------------------------

    def fork_into(self, forks: Sequence[CodingEnvironment]) -> None:
        """Make each of `forks` (environments of new sessions, never reset) continue this episode
        from where it stands: a copy of the workspace in a sandbox of its own, the trajectory so far
        (under a new episode id and its own session id), the task, `show_hints`, the monitor flags
        and the failure streak. Only the workspace directory is copied, from the agent's sandbox,
        which never holds hidden tests; processes, /tmp and $HOME are not carried. Refused for an
        episode not started or over (its sandbox is gone once graded). All or nothing: on failure
        no fork holds a sandbox."""
        episode = self._active_episode()
        with episode.lock:
            pending = list(episode.late_hints)
        if pending:  # the copies start from the hints the source's record will show
            wait_for_futures(pending, timeout=self._hints.settle_timeout_s)
        with ThreadPoolExecutor(len(forks), thread_name_prefix="fork-checkout") as pool:
            checkouts = [pool.submit(fork._open_sandbox) for fork in forks]
        sandboxes = [checkout.result() for checkout in checkouts if checkout.exception() is None]
        try:
            if len(sandboxes) < len(forks):
                raise next(checkout.exception() for checkout in checkouts if checkout.exception() is not None)
            _copy_workspace(episode.sandbox, sandboxes, self._grading.max_workspace_bytes)
        except BaseException:
            for sandbox in sandboxes:
                sandbox.close()
            raise
        for fork, sandbox in zip(forks, sandboxes):
            fork._continue_episode(episode, sandbox)

    def _continue_episode(self, source: _Episode, sandbox: Sandbox) -> None:
        """Take up a copy of `source` (another session's episode) in `sandbox`, which holds its workspace."""
        record = source.record.model_copy(deep=True, update={"session_id": self._session_id or "", "episode_id": uuid.uuid4().hex})
        workspace = Workspace(sandbox, source.task, fresh_sandbox=self._open_grader, grading=self._grading)
        self._episode = _Episode(
            workspace,
            record,
            source.show_hints,
            tool_call_format=source.tool_call_format,
            max_calls_per_step=source.max_calls_per_step,
            tools=source.tools,
            monitor_flags=list(source.monitor_flags),
            withheld_flags=copy.deepcopy(source.withheld_flags),
            streak=copy.deepcopy(source.streak),
        )


def _action_calls(action: CallToolStep | AssistantMessageStep, family: str | None, tools: Sequence[str]) -> list[_Call]:
    """The action's calls in order: one for `call_tool`, every call found in a message (in the
    pinned `family`, if any), or the one failure that no call could be found; a call is resolved
    against the episode's `tools`."""
    if isinstance(action, CallToolStep):
        return [_resolve_call(action.tool_name, action.arguments, tools)]
    try:
        calls = parse_tool_calls(action.content, TOOL_PARAMETERS, family=family)
    except ToolCallParseError as exc:
        return [_Call("", error=ToolOutcome(str(exc), error_kind=ErrorKind.JSON_DECODE))]
    if not calls:
        return [_Call("", error=ToolOutcome("No tool call found in the message.", error_kind=ErrorKind.TOOL_NOT_FOUND))]
    return [_resolve_call(call.name, call.arguments, tools) for call in calls]


def _resolve_call(name: str, arguments: dict[str, Any] | str, tools: Sequence[str]) -> _Call:
    """One call's tool and validated arguments (raw text parsed and repaired), or its error."""
    tool = TOOLS.get(name)
    if tool is None:
        return _Call(name, error=ToolOutcome(f"Unknown tool {name!r}.", error_kind=ErrorKind.TOOL_NOT_FOUND))
    if name not in tools:
        message = f"Tool {name!r} is not one of this episode's tools: {', '.join(tools)}."
        return _Call(name, error=ToolOutcome(message, error_kind=ErrorKind.TOOL_NOT_FOUND))
    if isinstance(arguments, str):
        parsed = parse_arguments(arguments, TOOL_PARAMETERS[name])
        if parsed is None:
            return _Call(name, error=ToolOutcome(f"Arguments could not be read as named parameters: {arguments[:200]!r}", error_kind=ErrorKind.JSON_DECODE))
        arguments = parsed
    try:
        validated = tool.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        return _Call(name, error=ToolOutcome(f"Invalid arguments for {name}: {problems}", error_kind=ErrorKind.TYPE_ERROR))
    return _Call(name, tool, validated.model_dump(exclude_unset=True))


def _not_run(call: _Call, text: str, kind: ErrorKind | None = None, hint: str | None = None) -> _Answered:
    """A call of the step that was not run: it does not count against `max_steps`."""
    result = CallResult(tool_name=call.tool_name, output=text, error_kind=kind, hint=hint, arguments=call.arguments if call.tool else None, ran=False)
    return _Answered(result)


def _step_result(answered: list[_Answered], lead: _Answered, outcome: ToolOutcome, episode: _Episode, *, duration_ms: float) -> ToolResult:
    """The step's result: every call's, and top-level fields that read as one call's (the `lead`:
    the first failed call, else the last that ran) with the step's `outcome` for the episode."""
    calls = [a.result for a in answered]
    return ToolResult(
        **lead.result.model_dump(include={"tool_name", "exit_code", "error_kind", "hint", "underlying_error_kind"}),
        output=_joined_output(calls),
        truncated=any(call.truncated for call in calls),
        duration_ms=duration_ms,
        step_monitor_flags=sorted({flag for call in calls for flag in call.monitor_flags}),
        episode_monitor_flags=episode.monitor_flags if outcome.done else None,
        tests_passed=outcome.grade.tests_passed if outcome.grade else None,
        tests_total=outcome.grade.tests_total if outcome.grade else None,
        step_limit_reached=outcome.step_limit_reached,
        end_reason=outcome.end.reason if outcome.end else None,
        aborted=outcome.end.aborted if outcome.end else False,
        calls=calls,
        calls_found=len(calls),
        calls_run=sum(call.ran for call in calls),
    )


def _with_hint(output: str, hint: str | None, show_hints: bool) -> str:
    return f"{output}\n\nHint: {hint}" if hint and show_hints else output


def _joined_output(calls: list[CallResult]) -> str:
    """The step's `output`: a single call's unchanged; several under one header each, in order."""
    if len(calls) == 1:
        return calls[0].output
    return "\n\n".join(f"[call {n} of {len(calls)}: {call.tool_name or 'no tool'}]\n{call.output}" for n, call in enumerate(calls, 1))


def _answers(probe: Callable[[], bool]) -> bool:
    try:
        return probe()
    except Exception:
        return False


def _grading_failed(episode: _Episode, exc: Exception) -> ToolOutcome:
    # The policy sees the exception's type only: its text may name grader paths or hidden tests.
    log.warning("grading %s failed: %s: %s", episode.task.id, type(exc).__name__, exc)
    return _ended(
        ErrorKind.GRADING_ERROR,
        f"Grading failed ({type(exc).__name__}): the workspace could not be copied out and tested. Reward 0.",
    )


def _ending(outcome: ToolOutcome) -> EpisodeEnding:
    """How a step that ended the episode ended it."""
    if outcome.end is not None:
        return EpisodeEnding.ABORTED if outcome.end.aborted else EpisodeEnding.FAILED
    return EpisodeEnding.STEP_LIMIT if outcome.step_limit_reached else EpisodeEnding.SUBMITTED


def _ended(kind: ErrorKind, reason: str) -> ToolOutcome:
    """An outcome that ends the episode on the agent's account: reward 0."""
    return ToolOutcome(reason, error_kind=kind, end=EpisodeEnd(reason, aborted=False))


def _aborted(reason: str) -> ToolOutcome:
    """An outcome that ends the episode on the infrastructure's account: no reward to learn from."""
    return ToolOutcome(f"Sandbox failure: {reason}", error_kind=ErrorKind.SANDBOX_ERROR, end=EpisodeEnd(reason, aborted=True))


def _copy_workspace(source: Sandbox, targets: list[Sandbox], max_bytes: int) -> None:
    """The source's workspace into every target, failures as the refusals a fork answers: a
    workspace the grader would refuse (too large) or cannot read (an unreadable file) is the
    request's problem (422); a sandbox that fails is the infrastructure's (503)."""
    try:
        source.copy_workspace_to(targets, max_bytes=max_bytes)
    except ArchiveTooLarge:
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"the workspace holds more than {max_bytes} bytes: too large to fork") from None
    except OSError as exc:
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"the workspace cannot be copied: {exc}") from None
    except SandboxError as exc:
        raise ServiceError(ApiErrorCode.SANDBOX_UNAVAILABLE, f"the workspace could not be copied: {exc}") from exc


def _metadata(result: ToolResult, outcome: ToolOutcome) -> dict[str, Any]:
    """The observation's `metadata`: the typed fields under the keys clients read before those
    fields existed (docs/api.md), plus the grading details that have no typed field. Here
    `monitor_flags` is the episode's flags, on the step that ends it only."""
    metadata: dict[str, Any] = {}
    if outcome.grade is not None:
        grade = outcome.grade
        metadata.update(
            tests_passed=grade.tests_passed,
            tests_total=grade.tests_total,
            failing_tests=list(grade.failing_tests),
            grading_ms=grade.grading_ms,
            monitor_flags=[str(flag) for flag in grade.monitor_flags],
        )
    elif outcome.done and result.episode_monitor_flags:
        metadata["monitor_flags"] = [str(flag) for flag in result.episode_monitor_flags]
    if result.end_reason is not None:
        metadata.update(aborted=result.aborted, reason=result.end_reason)
    if result.step_limit_reached:
        metadata["step_limit_reached"] = True
    if result.underlying_error_kind is not None:
        metadata["underlying_error_kind"] = result.underlying_error_kind.value
    return metadata

