"""Warm pool: ready sandboxes, liveness on checkout, replacement, shutdown."""

from __future__ import annotations

import threading

import docker.errors
import pytest

from sandbox import Sandbox, SandboxError, SandboxSpec, WarmPool, open_sandbox
from tests.sandbox.support import SPEC, needs_docker


def test_checkout_hands_out_live_sandboxes_and_refills(backend: str) -> None:
    with WarmPool(SPEC, size=2, backend=backend) as pool:
        pool.wait_ready()
        first, second = pool.checkout(), pool.checkout()
        assert first.id != second.id
        assert first.exec("echo one").stdout == "one\n"
        pool.wait_ready()  # both were replaced in the background
        assert pool.ready_count == 2
        first.close()
    assert not second.is_alive(), "close() must stop checked-out sandboxes too"


def test_a_deferred_refill_starts_at_once_for_a_caller_left_waiting(backend: str) -> None:
    # Replacements wait out `refill_delay_s` only while the ready sandboxes serve every caller:
    # with an hour's delay, the second checkout from a pool of one still gets a sandbox.
    with WarmPool(SPEC, size=1, backend=backend, refill_delay_s=3600) as pool:
        pool.wait_ready()
        first = pool.checkout()
        second = pool.checkout(timeout_s=120)
        assert second.id != first.id and second.exec("echo second").stdout == "second\n"


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=needs_docker)])
def test_checkout_replaces_a_sandbox_that_died_in_the_pool(backend: str) -> None:
    made: list[Sandbox] = []

    def start(spec: SandboxSpec) -> Sandbox:
        made.append(open_sandbox(spec, backend))
        return made[-1]

    with WarmPool(SPEC, size=1, start=start) as pool:
        pool.wait_ready()
        dead = made[0]
        api = dead.deployment._api  # the container dies behind the pool's back, as in an engine restart
        api.kill(dead.deployment.container_id)
        try:
            api.wait(dead.deployment.container_id, condition="removed", timeout=60)
        except docker.errors.NotFound:
            pass
        sandbox = pool.checkout()
        assert sandbox is not dead and sandbox.exec("echo fresh").stdout == "fresh\n"


class FailingStart:
    """A start function that always fails and lets the test wait for its n-th attempt."""

    def __init__(self, attempts_to_wait_for: int):
        self.attempts = 0
        self.reached = threading.Event()
        self._wanted = attempts_to_wait_for

    def __call__(self, spec: SandboxSpec) -> Sandbox:
        self.attempts += 1
        if self.attempts >= self._wanted:
            self.reached.set()
        raise SandboxError("image not found: nope")


def test_a_pool_that_cannot_start_sandboxes_says_why() -> None:
    start = FailingStart(attempts_to_wait_for=2)  # the first failure is recorded before the retry
    with WarmPool(SPEC, size=1, start=start) as pool:
        assert start.reached.wait(timeout=30)
        with pytest.raises(SandboxError, match="image not found"):
            pool.checkout(timeout_s=0.1)


def test_checkout_after_close_fails() -> None:
    pool = WarmPool(SPEC, size=1, start=FailingStart(attempts_to_wait_for=1))
    pool.close()
    with pytest.raises(SandboxError, match="closed"):
        pool.checkout(timeout_s=1)


class FakeSandbox:
    """What the pool uses of a sandbox: an id, a liveness ping and `close`."""

    def __init__(self) -> None:
        self.id = f"fake-{id(self):x}"
        self.closed = threading.Event()

    def is_alive(self, timeout_s: float) -> bool:
        return not self.closed.is_set()

    def close(self) -> None:
        self.closed.set()


def test_a_retired_sandbox_is_closed_in_the_background() -> None:
    with WarmPool(SPEC, size=1, start=lambda spec: FakeSandbox(), refill_delay_s=0.01) as pool:
        retired = pool.checkout()
        pool.retire(retired)
        assert retired.closed.wait(timeout=30)


def test_retired_sandboxes_wait_out_the_delay_and_close_with_the_pool() -> None:
    pool = WarmPool(SPEC, size=1, start=lambda spec: FakeSandbox(), refill_delay_s=3600)
    retired = pool.checkout()
    pool.retire(retired)
    assert not retired.closed.is_set()  # an hour's delay: still waiting to be closed
    pool.close()
    assert retired.closed.is_set()
    late = FakeSandbox()
    pool.retire(late)  # a closed pool closes at once
    assert late.closed.is_set()
