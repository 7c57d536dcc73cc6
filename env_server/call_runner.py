"""Running one step's action: its calls resolved to tools, run in order under the per-step cap,
blamed when a sandbox fails (docs/decisions/024-who-ends-an-episode.md), hinted, graded when the
step uses the last of `max_steps`, and summed up as the step's observation, built once: the wire's
`CodingObservation` (with its `metadata` under the episode's protocol, decision 121), which the
record keeps too. A judge's hint that comes after the step went out replaces the template in the
record."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from env_server.episode import Episode
from env_server.error_kinds import classify_sandbox_death
from env_server.grading.monitor import scan_tool_call
from env_server.hints import Hint, HintGenerator
from env_server.models import CallFields, CallResult, ErrorKind, MonitorFlag
from env_server.openenv_models import AssistantMessageStep, CallToolStep, CodingObservation, openenv_tool_error
from env_server.tool_call_parser import ToolCallParseError, parse_arguments, parse_tool_calls
from env_server.tools import TOOLS, EpisodeEnd, Tool, CallOutcome, submit
from sandbox import Sandbox, SandboxError

log = logging.getLogger(__name__)

TOOL_PARAMETERS: dict[str, list[str]] = {name: list(t.arguments.model_fields) for name, t in TOOLS.items()}
"""Each tool's parameter names, in order: how a parser reads calls written with positional or named text."""


@dataclass
class _Call:
    """One call of a step's action resolved to a tool and validated arguments, or to the error that prevents it."""

    tool_name: str
    tool: Tool | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: CallOutcome | None = None

    @property
    def parsed(self) -> dict[str, Any] | None:
        """The call as executed (`{"tool_name", "arguments"}`), or None when it could not be resolved."""
        return {"tool_name": self.tool_name, "arguments": self.arguments} if self.tool else None


@dataclass
class _Answered:
    """One call of a step, answered: what the wire reports, and for a call that ran, the outcome
    (the step's grade and episode end come from it) and the hint still to be judged."""

    result: CallResult
    outcome: CallOutcome | None = None
    hint: Hint | None = None
    flags: list[MonitorFlag] = field(default_factory=list)
    """What the monitor flagged in the call: recorded at once, shown only once the episode is done."""


@dataclass(frozen=True)
class StepRun:
    """A step, run: its observation, and the outcome that decides the episode (the call that ended
    it, else the last that ran)."""

    observation: CodingObservation
    outcome: CallOutcome


class CallRunner:
    """Runs the steps of one session's episodes. `infrastructure_alive` says whether the sandbox
    engine answers; with the grader's checkout it decides who a dead sandbox is blamed on."""

    def __init__(self, *, hints: HintGenerator, grader_checkout: Callable[[], Sandbox], infrastructure_alive: Callable[[], bool]) -> None:
        self._hints = hints
        self._grader_checkout = grader_checkout
        self._infrastructure_alive = infrastructure_alive
        self._grader_unavailable: Exception | None = None

    def open_grader(self) -> Sandbox:
        """The grading sandbox; a failure to get one is the infrastructure's, remembered so that
        whatever grading makes of it, the episode is aborted rather than scored."""
        try:
            return self._grader_checkout()
        except Exception as exc:
            self._grader_unavailable = exc
            raise

    async def run(self, action: CallToolStep | AssistantMessageStep, episode: Episode) -> StepRun:
        """Run every call of `action` in order: after a call that ended the episode, and beyond the
        episode's per-step cap, the rest are answered without running. Awaited on the service's event
        loop: what blocks (a blocking tool, grading, a message's parsing) goes to a worker thread."""
        started = time.perf_counter()
        answered: list[_Answered] = []
        for index, call in enumerate(await _action_calls(action, episode.tool_call_format, episode.tools)):
            ended = next((a for a in answered if a.outcome is not None and a.outcome.done), None)
            if ended is not None:
                answered.append(_not_run(call, f"Not run: the episode ended at call {answered.index(ended) + 1} ({ended.result.tool_name})."))
            elif index >= episode.max_calls_per_step:
                answered.append(self._over_the_cap(call, episode))
            else:
                answered.append(await self._run_call(call, episode, ran_before=sum(a.result.ran for a in answered)))
        ran = [a for a in answered if a.outcome is not None]
        outcome = next((a.outcome for a in ran if a.outcome.done), ran[-1].outcome)
        episode.withheld_flags.append([a.flags for a in answered])
        if outcome.done:
            for answer in answered:
                answer.result.monitor_flags = answer.flags
        lead = next((a for a in answered if a.result.error_kind is not None), ran[-1])
        observation = _observation(answered, outcome, episode, lead=lead.result, duration_ms=(time.perf_counter() - started) * 1000)
        for answer in answered:
            if answer.hint is not None:
                _take_late_hint(episode, answer.hint, [answer.result, observation] if answer is lead else [answer.result])
        return StepRun(observation, outcome)

    async def _run_call(self, call: _Call, episode: Episode, *, ran_before: int) -> _Answered:
        """Run one call (or answer its resolution error), grading the workspace when it uses the
        last of `max_steps`; `ran_before` calls of the same step have run."""
        started = time.perf_counter()
        flags = scan_tool_call(call.tool_name, call.arguments, episode.task) if call.tool else []
        episode.raise_flags(flags)  # before grading: a flagged last call counts against its own episode
        outcome = call.error or await self._run(call, episode)
        if not outcome.done and episode.calls_used + ran_before + 1 >= episode.task.limits.max_steps:
            outcome = await self._grade_at_step_limit(outcome, episode)
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

    def _over_the_cap(self, call: _Call, episode: Episode) -> _Answered:
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

    async def _run(self, call: _Call, episode: Episode) -> CallOutcome:
        self._grader_unavailable = None
        grading = call.tool_name == "submit"
        try:
            if grading:  # the episode's flags go to grading explicitly: the penalty counts them
                outcome = await asyncio.to_thread(submit, episode.workspace, monitor_flags=episode.monitor_flags)
            else:
                outcome = await call.tool.call(episode.workspace, **call.arguments)
        except SandboxError as exc:
            outcome = await asyncio.to_thread(self._sandbox_failure, exc, episode, grading)
        except Exception as exc:
            if not grading:
                raise
            # Whatever the workspace holds must not crash grading into a 5xx: it scores 0.
            outcome = _grading_failed(episode, exc)
        if grading and self._grader_unavailable is not None:
            outcome = _aborted(f"no grading sandbox could be started: {self._grader_unavailable}")
        return outcome

    def _sandbox_failure(self, exc: SandboxError, episode: Episode, grading: bool) -> CallOutcome:
        """Who a `SandboxError` is blamed on (docs/decisions/024-who-ends-an-episode.md): the engine
        gone is the infrastructure's (abort, reward null); anything else that happens to a sandbox
        the agent has been acting in is the agent's (reward 0)."""
        if not _answers(self._infrastructure_alive):
            return _aborted(f"the sandbox engine does not answer: {exc}")
        if _answers(episode.sandbox.is_alive):
            if grading:
                return _grading_failed(episode, exc)
            return CallOutcome(f"Sandbox failure: {exc}", error_kind=ErrorKind.SANDBOX_ERROR)
        return _ended(classify_sandbox_death(exc), f"The sandbox died: {exc}")

    async def _grade_at_step_limit(self, last: CallOutcome, episode: Episode) -> CallOutcome:
        """The last step's outcome, graded: its output followed by the grading's, the grading's
        error kind if it has one."""
        graded = await self._run(_Call("submit", TOOLS["submit"]), episode)
        return dataclasses.replace(
            last,
            output=f"{last.output}\n\n[step limit reached] {graded.output}".lstrip(),
            error_kind=graded.error_kind or last.error_kind,
            grade=graded.grade,
            end=graded.end,
            step_limit_reached=True,
        )


def _take_late_hint(episode: Episode, hint: Hint, targets: list[CallFields]) -> None:
    """When the judge answers after the step went out, its hint replaces the template in the
    record (in the call's result, and in the step's when that call leads it); a finished
    episode is logged once its last late hint has landed."""
    if hint.later is None:
        return
    landed = episode.expect_late_hint()

    def land(answer: Future[str | None]) -> None:
        if not answer.cancelled() and answer.exception() is None and answer.result():
            for target in targets:
                target.hint = answer.result()
        episode.hint_landed(landed)

    hint.later.add_done_callback(land)


async def _action_calls(action: CallToolStep | AssistantMessageStep, family: str | None, tools: Sequence[str]) -> list[_Call]:
    """The action's calls in order: one for `call_tool`, every call found in a message (in the
    pinned `family`, if any), or the one failure that no call could be found; a call is resolved
    against the episode's `tools`. A message is read on a worker thread: reading one of up to the
    body limit must not hold the event loop."""
    if isinstance(action, CallToolStep):
        return [_resolve_call(action.tool_name, action.arguments, tools)]
    try:
        calls = await asyncio.to_thread(parse_tool_calls, action.content, TOOL_PARAMETERS, family=family)
    except ToolCallParseError as exc:
        return [_Call("", error=CallOutcome(str(exc), error_kind=ErrorKind.JSON_DECODE))]
    if not calls:
        return [_Call("", error=CallOutcome("No tool call found in the message.", error_kind=ErrorKind.TOOL_NOT_FOUND))]
    return [_resolve_call(call.name, call.arguments, tools) for call in calls]


def _resolve_call(name: str, arguments: dict[str, Any] | str, tools: Sequence[str]) -> _Call:
    """One call's tool and validated arguments (raw text parsed and repaired), or its error."""
    tool = TOOLS.get(name)
    if tool is None:
        return _Call(name, error=CallOutcome(f"Unknown tool {name!r}.", error_kind=ErrorKind.TOOL_NOT_FOUND))
    if name not in tools:
        message = f"Tool {name!r} is not one of this episode's tools: {', '.join(tools)}."
        return _Call(name, error=CallOutcome(message, error_kind=ErrorKind.TOOL_NOT_FOUND))
    if isinstance(arguments, str):
        parsed = parse_arguments(arguments, TOOL_PARAMETERS[name])
        if parsed is None:
            return _Call(name, error=CallOutcome(f"Arguments could not be read as named parameters: {arguments[:200]!r}", error_kind=ErrorKind.JSON_DECODE))
        arguments = parsed
    try:
        validated = tool.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        return _Call(name, error=CallOutcome(f"Invalid arguments for {name}: {problems}", error_kind=ErrorKind.TYPE_ERROR))
    return _Call(name, tool, validated.model_dump(exclude_unset=True))


def _not_run(call: _Call, text: str, kind: ErrorKind | None = None, hint: str | None = None) -> _Answered:
    """A call of the step that was not run: it does not count against `max_steps`."""
    result = CallResult(tool_name=call.tool_name, output=text, error_kind=kind, hint=hint, arguments=call.arguments if call.tool else None, ran=False)
    return _Answered(result)


def _observation(answered: list[_Answered], outcome: CallOutcome, episode: Episode, *, lead: CallResult, duration_ms: float) -> CodingObservation:
    """The step's observation: every call's result, top-level fields that read as one call's (the
    `lead`) with the step's `outcome` for the episode, and OpenEnv's fields (`error` when the lead
    call failed, `done`, `reward`, `metadata`)."""
    calls = [a.result for a in answered]
    return CodingObservation(
        tool_name=lead.tool_name,
        exit_code=lead.exit_code,
        error_kind=lead.error_kind,
        hint=lead.hint,
        underlying_error_kind=lead.underlying_error_kind,
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
        error=openenv_tool_error(lead.error_kind, lead.output),
        done=outcome.done,
        reward=outcome.reward,
        metadata=_metadata(outcome, episode, lead),
    )


def _metadata(outcome: CallOutcome, episode: Episode, lead: CallResult) -> dict[str, Any]:
    """The observation's `metadata`: the grading details that have no typed field and, for protocol
    1 only, the typed fields again under the keys clients read before those fields existed
    (docs/api.md, "Protocol versions"). There `monitor_flags` is the episode's flags, on the step
    that ends it only."""
    metadata: dict[str, Any] = {}
    grade = outcome.grade
    if grade is not None:
        metadata.update(failing_tests=list(grade.failing_tests), grading_ms=grade.grading_ms)
    if episode.protocol > 1:
        return metadata
    if grade is not None:
        metadata.update(tests_passed=grade.tests_passed, tests_total=grade.tests_total, monitor_flags=[str(flag) for flag in grade.monitor_flags])
    elif outcome.done and episode.monitor_flags:
        metadata["monitor_flags"] = [str(flag) for flag in episode.monitor_flags]
    if outcome.end is not None:
        metadata.update(aborted=outcome.end.aborted, reason=outcome.end.reason)
    if outcome.step_limit_reached:
        metadata["step_limit_reached"] = True
    if lead.underlying_error_kind is not None:
        metadata["underlying_error_kind"] = lead.underlying_error_kind.value
    return metadata


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


def _grading_failed(episode: Episode, exc: Exception) -> CallOutcome:
    # The policy sees the exception's type only: its text may name grader paths or hidden tests.
    log.warning("grading %s failed: %s: %s", episode.task.id, type(exc).__name__, exc)
    return _ended(
        ErrorKind.GRADING_ERROR,
        f"Grading failed ({type(exc).__name__}): the workspace could not be copied out and tested. Reward 0.",
    )


def _ended(kind: ErrorKind, reason: str) -> CallOutcome:
    """An outcome that ends the episode on the agent's account: reward 0."""
    return CallOutcome(reason, error_kind=kind, end=EpisodeEnd(reason, aborted=False))


def _aborted(reason: str) -> CallOutcome:
    """An outcome that ends the episode on the infrastructure's account: no reward to learn from."""
    return CallOutcome(f"Sandbox failure: {reason}", error_kind=ErrorKind.SANDBOX_ERROR, end=EpisodeEnd(reason, aborted=True))
