"""Prometheus metrics of one service instance (own registry, so several apps can share a process)."""

from __future__ import annotations

from functools import cache
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

STEP_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ADMISSION_WAIT_BUCKETS = (0.0, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class ServiceMetrics:
    """The service's gauges, counters and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.active_sessions = Gauge("coding_env_active_sessions", "Open sessions.", registry=self.registry)
        self.admission_queue = Gauge(
            "coding_env_admission_queue_length", "New sessions waiting for a slot at the session cap.", registry=self.registry
        )
        self.admission_wait = Histogram(
            "coding_env_admission_wait_seconds", "How long each admitted session waited for its slot (0: a slot was free).",
            buckets=ADMISSION_WAIT_BUCKETS, registry=self.registry,
        )
        self.pool_size = Gauge("coding_env_pool_ready_sandboxes", "Started sandboxes waiting in the warm pool.", registry=self.registry)
        self.steps = Counter("coding_env_steps", "Tool calls executed.", ["tool"], registry=self.registry)
        self.step_latency = Histogram(
            "coding_env_step_latency_seconds", "Service-side duration of one step.", ["transport"],
            buckets=STEP_LATENCY_BUCKETS, registry=self.registry,
        )
        self.error_kinds = Counter("coding_env_error_kinds", "Observations by error kind.", ["kind"], registry=self.registry)
        self.sandbox_failures = Counter(
            "coding_env_sandbox_failures", "Sandboxes that failed to start or died under a session.", registry=self.registry
        )
        self.monitor_flags = Counter(
            "coding_env_monitor_flags", "Tool calls the reward-hacking monitor flagged, by flag.", ["flag"], registry=self.registry
        )
        self.episodes_graded = Counter("coding_env_episodes_graded", "Episodes that ended with a grade.", registry=self.registry)
        self.rewards = Histogram(
            "coding_env_reward", "Rewards of graded episodes.", buckets=(0.0, 0.25, 0.5, 0.75, 0.999, 1.0), registry=self.registry
        )
        # Each step's labelled series, looked up once per label value: `labels()` takes a lock and checks its
        # values on every call, a few microseconds of every step (docs/benchmarks.md). The label values are
        # bounded sets (transports, tool names, error kinds), so the caches are too.
        self.step_latency_of = cache(self.step_latency.labels)
        self.steps_of = cache(self.steps.labels)
        self.error_kinds_of = cache(self.error_kinds.labels)

    def track_pool(self, ready: Callable[[], float]) -> None:
        self.pool_size.set_function(ready)

    def render(self) -> bytes:
        return generate_latest(self.registry)
