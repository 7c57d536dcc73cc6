"""One episode of a session: its tools and prompt, its workspace and record, the state that carries
from step to step, and how it ends and is recorded (docs/decisions/118-episode-viewer.md).

The record is written here and nowhere else: a step is appended as it goes out; the ending, the
grade's counts and the monitor's flags (withheld from every observation until then) when the
episode ends; it goes to the episode log once, after the judge's late hints have landed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from typing import Any

from env_server.error_kinds import FailureStreak
from env_server.models import DEFAULT_MAX_CALLS_PER_STEP, DEFAULT_PROTOCOL_VERSION, ApiErrorCode, EpisodeEnding, EpisodeRecord, MonitorFlag, StepObservation, TaskSpec, TrajectoryStep
from env_server.service_errors import ServiceError
from env_server.tool_call_parser import TOOL_CALL_FAMILIES
from env_server.tools import TOOL_SCHEMAS, TOOLS, CallOutcome, Workspace
from env_server.trajectories import EpisodeLog
from sandbox import Sandbox


@dataclass
class Episode:
    """A session's current episode: the workspace it acts on, its record, and what reset set."""

    workspace: Workspace
    record: EpisodeRecord
    show_hints: bool
    log: EpisodeLog | None = None
    """Where the ended record goes (the service's log; None: nowhere)."""
    tool_call_format: str | None = None
    """The parser family pinned at reset; None: detected per message."""
    max_calls_per_step: int = DEFAULT_MAX_CALLS_PER_STEP
    """Calls of one action that run; the rest are answered `too_many_calls`."""
    tools: tuple[str, ...] = tuple(TOOLS)
    """The tools the episode may call (set at reset); a call to another is `tool_not_found`."""
    protocol: int = DEFAULT_PROTOCOL_VERSION
    """The wire protocol reset asked for: whether observations repeat typed fields in `metadata`."""
    monitor_flags: list[MonitorFlag] = field(default_factory=list)
    """Every flag raised in the episode so far, sorted: the monitor's on each call, then the grader's."""
    withheld_flags: list[list[list[MonitorFlag]]] = field(default_factory=list)
    """Per step, per call: the monitor's flags, kept out of every observation and of the record
    until the episode is done (a flag on a probe would confirm a hidden file's name); `_end`
    writes them into the record."""
    streak: FailureStreak = field(default_factory=FailureStreak)
    calls_used: int = 0
    """Calls run so far, each counted against the task's `max_steps` (kept as the steps are recorded:
    summed over the record at every step, it made a long episode's steps quadratic)."""
    done: bool = False
    reward: float | None = None
    late_hints: list[Future[None]] = field(default_factory=list)
    """One per judge answer still on its way; done once the answer is in the record."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Orders the judge's threads against the session's around `done` and `late_hints`."""

    @classmethod
    def start(
        cls,
        workspace: Workspace,
        *,
        session_id: str,
        episode_id: str | None,
        tools: tuple[str, ...],
        show_hints: bool,
        log: EpisodeLog | None,
        tool_call_format: str | None,
        max_calls_per_step: int,
        protocol: int,
    ) -> Episode:
        """A new episode on `workspace` (prepared for its task), its record opened with the prompt
        and the schemas of `tools`, with what reset asked for."""
        task = workspace.task
        record = EpisodeRecord(
            session_id=session_id,
            episode_id=episode_id or uuid.uuid4().hex,
            task_id=task.id,
            prompt=task.prompt + prompt_footer(tools),
            tools=[TOOL_SCHEMAS[name] for name in tools],
            started_at=time.time(),
        )
        return cls(
            workspace, record, show_hints, log=log, tool_call_format=tool_call_format,
            max_calls_per_step=max_calls_per_step, tools=tools, protocol=protocol,
        )

    @property
    def task(self) -> TaskSpec:
        return self.workspace.task

    @property
    def sandbox(self) -> Sandbox:
        return self.workspace.sandbox


    def raise_flags(self, flags: Iterable[MonitorFlag]) -> None:
        self.monitor_flags = sorted({*self.monitor_flags, *flags})

    def record_step(self, action: dict[str, Any], result: StepObservation, outcome: CallOutcome, *, started_at: float) -> None:
        """Append the step that just went out to the record."""
        self.calls_used += result.calls_run
        first = result.calls[0]
        self.record.steps.append(
            TrajectoryStep(
                index=len(self.record.steps),
                action=action,
                parsed_call={"tool_name": first.tool_name, "arguments": first.arguments} if first.arguments is not None else None,
                observation=result,
                reward=outcome.reward,
                done=outcome.done,
                started_at=started_at,
                monitor_flags=result.step_monitor_flags,
            )
        )

    def finish(self, outcome: CallOutcome) -> None:
        """The step with `outcome` ended the episode: its reward and grade go into the record."""
        self.reward = outcome.reward
        self.record.reward = outcome.reward
        if outcome.grade is not None:
            self.record.tests_passed, self.record.tests_total = outcome.grade.tests_passed, outcome.grade.tests_total
        self._end(ending(outcome))

    def leave(self, ending: EpisodeEnding) -> None:
        """The client left the episode before it ended (a reset onto another, the session closed):
        recorded as `ending`, ungraded, when it took at least one step (one that took none has
        nothing to read, and every stateless `/reset` makes one)."""
        if not self.done and self.record.steps:
            self._end(ending)

    def expect_late_hint(self) -> Future[None]:
        """A judge's answer is on its way: the record is logged only once it is in (`hint_landed`)."""
        landed: Future[None] = Future()
        self.late_hints.append(landed)
        return landed

    def hint_landed(self, landed: Future[None]) -> None:
        # Logged under the lock: `settle` reads `late_hints` under it too, so once it sees none
        # pending, the episode's log line is already written.
        with self.lock:
            self.late_hints.remove(landed)
            if self.done and not self.late_hints:
                self._log()
        landed.set_result(None)

    def settle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the late hints on their way, so the record shows them."""
        with self.lock:
            pending = list(self.late_hints)
        if pending:
            wait_for_futures(pending, timeout=timeout_s)

    def _end(self, ending: EpisodeEnding) -> None:
        """The record completed (its ending, the monitor's flags, withheld until now) and logged once
        the judge's late hints have landed."""
        record = self.record
        record.ended_at = time.time()
        record.ending = ending
        record.monitor_flags = list(self.monitor_flags)
        for step, calls in zip(record.steps, self.withheld_flags):
            for call, flags in zip(step.observation.calls, calls):
                call.monitor_flags = flags
            step.monitor_flags = step.observation.step_monitor_flags = sorted({flag for flags in calls for flag in flags})
        with self.lock:
            self.done = True
            if not self.late_hints:
                self._log()

    def _log(self) -> None:
        if self.log is not None:
            self.log.append(self.record)


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


def episode_tool_call_format(name: str | None) -> str | None:
    """The tool-call parser family reset pinned (None: detected per message), checked against the known ones."""
    if name is not None and name not in TOOL_CALL_FAMILIES:
        raise ServiceError(
            ApiErrorCode.INVALID_REQUEST,
            f"unknown tool_call_format {name!r}; one of: {', '.join(TOOL_CALL_FAMILIES)} (or null to detect it)",
            {"tool_call_format": name, "allowed": list(TOOL_CALL_FAMILIES)},
        )
    return name


def ending(outcome: CallOutcome) -> EpisodeEnding:
    """How a step that ended the episode ended it."""
    if outcome.end is not None:
        return EpisodeEnding.ABORTED if outcome.end.aborted else EpisodeEnding.FAILED
    return EpisodeEnding.STEP_LIMIT if outcome.step_limit_reached else EpisodeEnding.SUBMITTED
