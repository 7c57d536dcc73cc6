"""Rollout concurrency: the environments' resets and tool rounds of a batch, run at once through TRL's own loops.

TRL 1.16's `GRPOTrainer` drives a generation batch's environments rollout after rollout: before
generation, `_generate_and_score_completions` draws one pooled environment per rollout and calls
their `reset(**row)` one after another; then `_tool_call_loop` calls each round's tools one after
another, waiting for each answer. Against the service every call is a round trip (a reset may wait
for a sandbox to start; a tool runs in one), so a batch costs the sum of them.

Yet the work is known early. By the first reset of a batch, every environment of the batch and
every row are known; when a round's first call is made, every rollout's calls for the round are
(each rollout whose last completion message is an assistant turn with tool calls is about to have
them run). So both go through stand-ins: the first reset, or the first call of a round, dispatches
all of them to a thread pool (one task per rollout: a session is sequential, the sessions are
independent), and TRL's loop then walks the rollouts as before, each call returning (or raising)
what was computed for it. Same calls, same order per environment, same answers and `tool_calls`
records; only the waiting overlaps. A stand-in asked for something it did not dispatch (TRL's rules
changed) raises an `...OutOfStep` error rather than answering wrongly.

- `ConcurrentResets`: stand-ins for `reset`, installed on every pooled environment.
- `ConcurrentToolRounds`: stand-ins for the environments' tool methods, for one `_tool_call_loop`.
- `ConcurrentRolloutTrainer`: a `GRPOTrainer` that installs both (`ConcurrentRolloutConfig` switches
  each) and closes its environments' sessions. Decision 062; the TRL internals used: decision 064.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trl import GRPOConfig, GRPOTrainer

from trainer_client.hint_sites import ToolCall, environment_call

# ------------------------------------------------------------------ resets


Row = Mapping[str, Any]


class ResetOutOfStep(RuntimeError):
    """TRL reset an environment, or with a row, other than dispatched (the mirrored rules no longer match TRL)."""


class ConcurrentResets:
    """Stand-ins for the environments' `reset` that run one batch's resets concurrently.

    TRL still walks the rollouts in order, so the exception it sees is the first failing rollout's,
    as in its serial loop (the later resets have run too). Outside a batch a stand-in is the plain
    `reset`.

    Args:
        batch_environments: The environments TRL drew for the current batch, one per rollout
            (read at the first reset, when TRL has drawn them all).
        multi_environment: Whether the rows' `environment` field names the environment; TRL
            then leaves it out of the reset's keywords.
    """

    def __init__(self, batch_environments: Callable[[], Sequence[Any]], *, multi_environment: bool) -> None:
        self._batch_environments = batch_environments
        self._multi_environment = multi_environment
        self._rows: Sequence[Row] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: dict[int, tuple[dict[str, Any], Future]] | None = None

    def install(self, environment: Any) -> Any:
        """Shadow `environment.reset` with its stand-in; returns the environment."""
        reset = type(environment).reset
        # A weak reference: the stand-in lives on the environment and must not keep it alive.
        environment_ref = weakref.ref(environment)

        def concurrent_reset(**row: Any) -> Any:
            return self._answer(environment_ref(), reset, row)

        environment.reset = concurrent_reset
        return environment

    def installing(self, factory: Callable[[], Any]) -> Callable[[], Any]:
        """`factory`, with a stand-in installed on each environment it makes."""
        return lambda: self.install(factory())

    @contextlib.contextmanager
    def batch(self, rows: Sequence[Row]) -> Iterator[None]:
        """The resets made inside run concurrently; the batch ends when all of them have."""
        with ThreadPoolExecutor(max_workers=max(len(rows), 1), thread_name_prefix="reset") as executor:
            self._rows, self._executor, self._pending = rows, executor, None
            try:
                yield
            finally:
                self._rows, self._executor, self._pending = None, None, None

    def _dispatch(self) -> dict[int, tuple[dict[str, Any], Future]]:
        pending = {}
        for environment, row in zip(self._batch_environments(), self._rows, strict=True):
            kwargs = {k: v for k, v in row.items() if k != "environment"} if self._multi_environment else dict(row)
            pending[id(environment)] = kwargs, self._executor.submit(type(environment).reset, environment, **kwargs)
        return pending

    def _answer(self, environment: Any, reset: Callable[..., Any], row: dict[str, Any]) -> Any:
        if self._rows is None:
            return reset(environment, **row)
        if self._pending is None:
            self._pending = self._dispatch()  # the batch's first reset
        dispatched = self._pending.pop(id(environment), None)
        if dispatched is None or dispatched[0] != row:
            raise ResetOutOfStep(f"{type(environment).__name__} was reset with {row!r}, which was not dispatched")
        return dispatched[1].result()


# ------------------------------------------------------------------ tool rounds


class ToolRoundOutOfStep(RuntimeError):
    """TRL's loop asked for a call that was not dispatched for it (the mirrored rules no longer match TRL)."""


def _run_in_order(tools: Mapping[str, Callable[..., Any]], calls: Sequence[ToolCall]) -> list[tuple[bool, Any]]:
    """Each call's `(succeeded, result or exception)`: a failed call does not stop the next one, as in TRL."""
    outcomes = []
    for name, arguments in calls:
        try:
            outcomes.append((True, tools[name](**arguments)))
        except Exception as error:  # handed back to TRL's loop, which reports it to the policy
            outcomes.append((False, error))
    return outcomes


def _run_turn(environment: Any, tools: Mapping[str, Callable[..., Any]], calls: Sequence[ToolCall]) -> list[tuple[bool, Any]]:
    """One assistant turn's calls, each call's `(succeeded, result or exception)`: handed over whole to an
    environment that takes whole turns (`TrlEnvironment._run_turn`: one step of the service, which applies its
    rules for several calls, the per-step cap among them; decision 031), else run in order (`_run_in_order`)."""
    run_turn = getattr(environment, "_run_turn", None)
    if run_turn is None:
        return _run_in_order(tools, calls)
    try:
        return [(True, output) for output in run_turn(calls)]
    except Exception as error:  # the step failed: every call of the turn reports it, as TRL would each
        return [(False, error)] * len(calls)


class ConcurrentToolRounds:
    """Stand-ins for the environments' tool methods that run each round's calls concurrently.

    Only environment methods go through here; standalone tools keep TRL's serial execution. Which
    calls reach an environment mirrors the loop exactly: function calls to one of the environment's
    tools with arguments that unpack as keywords. Anything else TRL answers itself. An environment that
    takes whole turns gets each turn's calls at once (`_run_turn`).

    Args:
        completions: The loop's per-rollout completion messages (the same lists it appends to).
        environments: Per rollout, its environment.
        environment_tools: Per rollout, its environment's tool methods by name.
        executor: Runs one task per rollout and round.
    """

    def __init__(
        self,
        completions: Sequence[list[dict[str, Any]]],
        environments: Sequence[Any],
        environment_tools: Sequence[Mapping[str, Callable[..., Any]]],
        executor: Executor,
    ) -> None:
        self._completions = completions
        self._environments = environments
        self._tools = environment_tools
        self._executor = executor
        self._dispatched: list[dict[str, Any]] = []  # assistant messages whose calls have run (kept alive for `is`)
        self._pending: list[deque[tuple[ToolCall, Future, int]]] = [deque() for _ in completions]
        self.error: ToolRoundOutOfStep | None = None
        """Set when TRL's loop and the dispatched calls disagreed (the loop swallows exceptions from tools)."""

    def stand_ins(self, rollout: int) -> dict[str, Callable[..., Any]]:
        """The callables to put in TRL's tool dict of `rollout` in place of its environment's methods."""

        def stand_in(name: str) -> Callable[..., Any]:
            def call(**arguments: Any) -> Any:
                return self._answer(rollout, (name, arguments))

            return call

        return {name: stand_in(name) for name in self._tools[rollout]}

    def _calls_to_run(self, rollout: int) -> list[ToolCall] | None:
        """The environment calls of the rollout's last message, if it is an assistant turn not yet run."""
        messages = self._completions[rollout]
        last = messages[-1] if messages else None
        if not last or last.get("role") != "assistant" or not last.get("tool_calls"):
            return None
        if any(last is message for message in self._dispatched):
            return None
        self._dispatched.append(last)
        calls = (environment_call(call, self._tools[rollout]) for call in last["tool_calls"])
        return [call for call in calls if call is not None]

    def _dispatch_round(self) -> None:
        for rollout, pending in enumerate(self._pending):
            calls = self._calls_to_run(rollout)
            if not calls:
                continue
            future = self._executor.submit(_run_turn, self._environments[rollout], self._tools[rollout], calls)
            pending.extend((call, future, index) for index, call in enumerate(calls))

    def _answer(self, rollout: int, call: ToolCall) -> Any:
        if not self._pending[rollout]:
            self._dispatch_round()  # the first call of a round
        if not self._pending[rollout] or self._pending[rollout][0][0] != call:
            self.error = self.error or ToolRoundOutOfStep(f"rollout {rollout}: TRL called {call!r}, which was not dispatched")
            raise self.error
        _, future, index = self._pending[rollout].popleft()
        succeeded, result = future.result()[index]
        if not succeeded:
            raise result
        return result


# ------------------------------------------------------------------ the trainer


@dataclass
class ConcurrentRolloutConfig(GRPOConfig):
    """GRPOConfig plus the switches of rollout concurrency (both on by default)."""

    concurrent_tool_calls: bool = field(
        default=True,
        metadata={
            "help": "Run each tool round's environment calls for all rollouts at once (one thread per rollout) "
            "instead of rollout after rollout, as TRL does; same calls, answers and hint sites."
        },
    )
    concurrent_resets: bool = field(
        default=True,
        metadata={
            "help": "Run the environments' `reset`s of a generation batch at once (one thread per rollout) "
            "instead of TRL's rollout after rollout; same prompts, and the first failing rollout's error."
        },
    )


class ConcurrentRolloutTrainer(GRPOTrainer):
    """`GRPOTrainer` whose environments' resets and tool rounds run concurrently across rollouts.

    Changes nothing else. With both switches off the resets are TRL's own and each round's calls run
    one after another, in TRL's order, still through the stand-ins: they hand each assistant turn's calls
    over together, so a turn is one step of the service in both modes (decision 031).
    """

    config_class: ClassVar[type[ConcurrentRolloutConfig]] = ConcurrentRolloutConfig
    """The config class `args` must be an instance of (subclasses name their own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__} as `args`")
        self._resets: ConcurrentResets | None = None
        if self.args.concurrent_resets and self.environment_factories is not None:
            self._install_concurrent_resets()

    def close_environments(self) -> None:
        """End the service sessions of every pooled environment (they also end when collected)."""
        for pool in getattr(self, "_environment_pool", {}).values():
            for environment in pool:
                close = getattr(environment, "_close", None)
                if close is not None:
                    close()

    def _install_concurrent_resets(self) -> None:
        """Shadow the `reset` of every pooled environment, and of those the pool will grow by."""
        self._resets = ConcurrentResets(lambda: self.environments, multi_environment=self._multi_environment)
        for pool in self._environment_pool.values():
            for environment in pool:
                self._resets.install(environment)
        self.environment_factories = {
            name: self._resets.installing(factory) for name, factory in self.environment_factories.items()
        }

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        with self._resets.batch(inputs) if self._resets is not None else contextlib.nullcontext():
            return super()._generate_and_score_completions(inputs)

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        if not self.environments:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)
        serial_tools = self._sync_tool_dicts
        environment_tools = [
            {name: tool for name, tool in tools.items() if getattr(tool, "__self__", None) is environment}
            for tools, environment in zip(serial_tools, self.environments, strict=True)
        ]
        # Off, one worker runs the rollouts' turns one after another, in TRL's order: still through the
        # stand-ins, so that a turn is one step of the service in both modes.
        workers = len(completions) if self.args.concurrent_tool_calls else 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool-round") as executor:
            rounds = ConcurrentToolRounds(completions, self.environments, environment_tools, executor)
            self._sync_tool_dicts = [{**tools, **rounds.stand_ins(i)} for i, tools in enumerate(serial_tools)]
            try:
                result = super()._tool_call_loop(
                    prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
                )
            finally:
                self._sync_tool_dicts = serial_tools
        if rounds.error is not None:
            raise rounds.error
        return result
