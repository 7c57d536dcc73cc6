"""The environments' `reset`s of one generation batch, run at once.

TRL 1.16's `GRPOTrainer._generate_and_score_completions` draws one pooled environment per rollout
and then calls their `reset(**row)` one after another; against the service each reset is a round
trip that may wait for a sandbox to start, so the batch's set-up costs the sum of them. By the
first reset, every environment of the batch and every row are known. So each environment's
`reset` is shadowed by a stand-in: within a batch, the first reset TRL makes submits all of them
to a thread pool, and each reset returns (or raises) what was computed for its environment.
TRL still walks the rollouts in order, so the exception it sees is the first failing rollout's,
as in its serial loop (the later resets have run too). Outside a batch a stand-in is the plain
`reset`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

Row = Mapping[str, Any]


class ResetOutOfStep(RuntimeError):
    """TRL reset an environment, or with a row, other than dispatched (the mirrored rules no longer match TRL)."""


class ConcurrentResets:
    """Stand-ins for the environments' `reset` that run one batch's resets concurrently.

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
