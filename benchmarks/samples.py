"""Timing samples, shared by the benchmark scripts: one percentile definition for every figure."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


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
