"""Timing samples, shared by the benchmark scripts: one percentile definition for every figure, one way to time
series in turns (and a process's CPU), and one check each of a timed exec's, a timed step's, a timed grade's and a
timed training step's reply."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
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


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and of the children it has reaped (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def timed_in_turns(series: dict[str, tuple[Callable[[], object], int]], repeat: int) -> dict[str, tuple[list[float], float]]:
    """Each of `series`' actions (name -> the action, and the process whose CPU it costs) timed `repeat` times,
    the actions taking turns in an order that rotates every round. This VM's speed drifts by the minute, and a
    series timed after another would carry the drift into their difference; taken in turns, a slower minute
    slows every series alike. Returns name -> (milliseconds of each call, CPU milliseconds that process used
    per call, all its threads and the children it reaped: a busy VM inflates CPU time too, by the same factor for
    every series)."""
    names = list(series)
    samples: dict[str, list[float]] = {name: [] for name in names}
    cpu_s = dict.fromkeys(names, 0.0)
    for round_ in range(repeat):
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            action, pid = series[name]
            cpu_before = process_cpu_s(pid)
            start = time.perf_counter()
            action()
            samples[name].append((time.perf_counter() - start) * 1000)
            cpu_s[name] += process_cpu_s(pid) - cpu_before
    return {name: (samples[name], cpu_s[name] * 1000 / repeat) for name in names}


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
