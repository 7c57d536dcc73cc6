"""The tool calls of one round of TRL's tool loop, run for all rollouts at once.

TRL 1.16's `GRPOTrainer._tool_call_loop` calls the tools of a round rollout after rollout, waiting
for each answer, so a round costs the sum of its calls' latencies. Yet when the round's first
call is made, every rollout's calls for the round are already known: each rollout whose last
completion message is an assistant message with tool calls is about to have them executed. So
the first call of a round dispatches all of them: one task per rollout on a thread pool, running
that rollout's calls in their order against its own environment (a session is sequential; the
sessions are independent). TRL's loop then walks the rollouts as before and each call it makes
returns the answer computed for it. Same calls, same order per environment, same answers and
`tool_calls` records; only the waiting overlaps.

Only environment methods go through here; standalone tools keep TRL's serial execution. Which
calls reach an environment mirrors the loop exactly: function calls to one of the environment's
tools with arguments that unpack as keywords. Anything else TRL answers itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import Any

from trainer_client.hint_sites import environment_call

ToolCall = tuple[str, dict[str, Any]]


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


class ConcurrentToolRounds:
    """Stand-ins for the environments' tool methods that run each round's calls concurrently.

    Args:
        completions: The loop's per-rollout completion messages (the same lists it appends to).
        environment_tools: Per rollout, its environment's tool methods by name.
        executor: Runs one task per rollout and round.
    """

    def __init__(
        self,
        completions: Sequence[list[dict[str, Any]]],
        environment_tools: Sequence[Mapping[str, Callable[..., Any]]],
        executor: Executor,
    ) -> None:
        self._completions = completions
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
            future = self._executor.submit(_run_in_order, self._tools[rollout], calls)
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
