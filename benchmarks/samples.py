"""Timing samples, shared by the benchmark scripts: one percentile definition for every figure, and one
check each of a timed exec's, a timed step's, a timed grade's and a timed training step's reply."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from env_server.grading.grader import GradeResult
    from sandbox import ExecResult, Sandbox


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile, `q` in [0, 1] (0.5 = median, 0.99 = p99)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def timed_ms(action: Callable[[], object], repeat: int) -> list[float]:
    """Milliseconds of each of `repeat` calls of `action`."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def checked_step(reply: dict[str, Any]) -> dict[str, Any]:
    """A step's reply (the HTTP body, or a WebSocket observation frame's data), or a loud failure when the
    step did not succeed: a benchmark that times error replies measures nothing."""
    observation = reply.get("observation") or {}
    if reply.get("done") or observation.get("error_kind") is not None:
        raise RuntimeError(f"a timed step did not succeed: {json.dumps(reply)[:500]}")
    return reply


def checked_exec(sandbox: Sandbox, command: str, timeout_s: float = 30) -> ExecResult:
    """`sandbox.exec(command)`'s result, or a loud failure when the command did not exit 0."""
    result = sandbox.exec(command, timeout_s=timeout_s)
    if result.exit_code != 0:
        raise RuntimeError(f"{command[:200]!r} failed: {result}")
    return result


def checked_grade(result: GradeResult, task_id: str) -> GradeResult:
    """A reference solution's grade, or a loud failure when it did not earn 1.0: the grader then timed a
    failure (a broken sandbox, a grading error), not a grading."""
    if result.reward != 1.0:
        raise RuntimeError(f"the reference solution of {task_id} earned {result.reward}: {result.output[-500:]}")
    return result


def checked_loss(loss: float, where: str) -> float:
    """A training step's loss, or a loud failure when it is not finite: a step that produced NaN trained nothing."""
    if not math.isfinite(loss):
        raise RuntimeError(f"{where}: the loss is {loss}")
    return loss
