"""`ConcurrentResets` on its own: the resets of a batch are in flight together, each environment
gets its own answer, and TRL's in-order walk sees the first failing rollout's exception."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from trainer_client.concurrent_rollouts import ConcurrentResets, ResetOutOfStep


class Environment:
    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self._barrier = barrier
        self.resets = 0

    def reset(self, **row: Any) -> str:
        if self._barrier is not None:
            self._barrier.wait()  # a serial reset would wait here until the barrier breaks
        if row.get("fail"):
            raise ValueError(f"no task {row['task_id']}")
        self.resets += 1
        return f"task {row['task_id']}"


def reset_in_order(environments: list[Environment], rows: list[dict[str, Any]], *, multi: bool = False) -> list[Any]:
    """What TRL 1.16 does before generation: each environment's reset, rollout after rollout."""
    return [
        environment.reset(**({k: v for k, v in row.items() if k != "environment"} if multi else row))
        for environment, row in zip(environments, rows)
    ]


def test_resets_are_in_flight_together_and_answered_in_order() -> None:
    barrier = threading.Barrier(3, timeout=60)
    environments = [Environment(barrier) for _ in range(3)]
    resets = ConcurrentResets(lambda: environments, multi_environment=True)
    for environment in environments:
        resets.install(environment)
    rows = [{"task_id": f"t{i}", "environment": "code"} for i in range(3)]
    with resets.batch(rows):
        assert reset_in_order(environments, rows, multi=True) == ["task t0", "task t1", "task t2"]
    assert [environment.resets for environment in environments] == [1, 1, 1]


def test_first_failing_rollout_raises_and_later_resets_ran() -> None:
    environments = [Environment() for _ in range(3)]
    resets = ConcurrentResets(lambda: environments, multi_environment=False)
    for environment in environments:
        resets.install(environment)
    rows = [{"task_id": "a"}, {"task_id": "b", "fail": True}, {"task_id": "c", "fail": True}]
    with pytest.raises(ValueError, match="no task b"), resets.batch(rows):
        reset_in_order(environments, rows)
    assert [environment.resets for environment in environments] == [1, 0, 0]


def test_a_reset_not_dispatched_is_refused() -> None:
    environments = [Environment(), Environment()]
    resets = ConcurrentResets(lambda: environments, multi_environment=False)
    for environment in environments:
        resets.install(environment)
    with pytest.raises(ResetOutOfStep), resets.batch([{"task_id": "a"}, {"task_id": "b"}]):
        reset_in_order(environments, [{"task_id": "a"}, {"task_id": "other"}])


def test_outside_a_batch_a_reset_is_plain() -> None:
    environment = ConcurrentResets(lambda: [], multi_environment=False).install(Environment())
    assert environment.reset(task_id="x") == "task x"
    assert environment.resets == 1
