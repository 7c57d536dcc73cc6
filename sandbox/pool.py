"""A warm pool: sandboxes started ahead of time so a session gets one in milliseconds.

Sandboxes are single-use: `checkout` hands one out for good (the caller closes it, or hands it
to `retire` to have it closed a moment later) and the background starters replace it. A
sandbox that died while waiting (OOM, engine restart) is found by the liveness ping at
checkout, closed and skipped. Callers waiting for a sandbox are served in arrival order, so
under a burst no caller waits behind later ones.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Self

from sandbox.backends import open_sandbox
from sandbox.base import SandboxError
from sandbox.runtime import PING_TIMEOUT_S, Sandbox
from sandbox.spec import Backend, SandboxSpec

log = logging.getLogger(__name__)

REFILL_DELAY_S = 0.3
"""How long after the first checkout from a full pool its replacements may wait to start, and
how long `retire` waits before it closes a sandbox: a container start or removal costs the engine
CPU that the request which just took or handed back a sandbox (a reset's files, a fork's copy)
would otherwise share (decisions 012, 013)."""

MAX_RETRY_DELAY_S = 5.0
"""Longest pause between attempts when starting sandboxes keeps failing (e.g. missing image)."""


class WarmPool:
    """Keeps `size` started sandboxes of one spec ready; context manager, `close()` stops all."""

    def __init__(
        self,
        spec: SandboxSpec | None = None,
        size: int = 4,
        backend: Backend | None = None,
        parallel_starts: int = 2,
        start: Callable[[SandboxSpec], Sandbox] | None = None,
        refill_delay_s: float = REFILL_DELAY_S,
    ):
        """`backend` runs a plain `SandboxSpec` (a `DockerSpec` or `LocalSpec` names its own);
        `start` overrides how a sandbox is made (default: `open_sandbox(spec, backend)`).
        Replacements start `refill_delay_s` after the first checkout that calls for them, or at
        once when a caller waits for a sandbox that none of the ready ones can give."""
        if size < 1 or parallel_starts < 1:
            raise ValueError("size and parallel_starts must be at least 1")
        if refill_delay_s < 0:
            raise ValueError("refill_delay_s must not be negative")
        self.refill_delay_s = refill_delay_s
        self.spec = spec or SandboxSpec()
        self.size = size
        self._start = start or (lambda s: open_sandbox(s, backend))
        self._ready: deque[Sandbox] = deque()
        self._waiting: deque[object] = deque()  # one token per checkout in progress, in arrival order
        self._starting = 0
        self._started: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # everything this pool made
        self._closed = False
        self._last_error: Exception | None = None
        self._progress_at = time.monotonic()
        """When a sandbox last became ready or was handed out alive: checkouts time out on a stall."""
        self._refill_at: float | None = None
        """When replacements may start (the first checkout from a full pool plus the delay)."""
        self._retiring: dict[threading.Timer, Sandbox] = {}
        """Retired sandboxes not yet closed, each under the timer that closes it when it fires."""
        self._changed = threading.Condition()
        self._starters = [
            threading.Thread(target=self._keep_filled, name=f"warm-pool-starter-{i}", daemon=True) for i in range(parallel_starts)
        ]
        for thread in self._starters:
            thread.start()

    @property
    def ready_count(self) -> int:
        with self._changed:
            return len(self._ready)

    def wait_ready(self, count: int | None = None, timeout_s: float = 120.0) -> None:
        """Block until `count` (default: `size`) sandboxes are ready; raises SandboxError on timeout."""
        count = self.size if count is None else count
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._ready) >= count or self._closed, timeout_s):
                raise SandboxError(f"pool has {len(self._ready)}/{count} sandboxes after {timeout_s} s; last error: {self._last_error}")

    def checkout(self, timeout_s: float = 120.0) -> Sandbox:
        """Hand out a live sandbox, waiting in line for one to start if none is ready.

        `timeout_s` bounds a stall, not the line: the checkout fails when the pool has made no
        progress (no sandbox became ready, none was handed out alive) for `timeout_s` since the
        later of this call and the last progress. Under a burst callers wait as long as sandboxes
        keep coming; when starts hang, every waiter fails `timeout_s` after the last one came
        (docs/decisions/034-lifecycle-deadlines.md)."""
        arrived = time.monotonic()

        def left_s() -> float:  # until the stall bound; called with the lock held
            return max(arrived, self._progress_at) + timeout_s - time.monotonic()

        turn = object()
        with self._changed:
            self._waiting.append(turn)
            self._changed.notify_all()  # a deferred refill starts now if the ready ones fall short
        try:
            while True:
                with self._changed:
                    while not self._ready or self._waiting[0] is not turn:
                        if self._closed:
                            raise SandboxError("warm pool is closed")
                        if left_s() <= 0:
                            raise SandboxError(f"no sandbox ready within {timeout_s:g} s; last start error: {self._last_error}")
                        self._changed.wait(left_s())
                    sandbox = self._ready.popleft()
                    self._waiting.popleft()  # the next in line need not wait for this one's liveness check
                    if self._refill_at is None:
                        self._refill_at = time.monotonic() + self.refill_delay_s
                    self._changed.notify_all()  # ... and a starter may begin the replacement
                    ping_s = min(PING_TIMEOUT_S, left_s())
                if ping_s > 0 and sandbox.is_alive(ping_s):
                    with self._changed:
                        self._progress_at = time.monotonic()
                    return sandbox
                log.warning("pooled sandbox %s is dead or frozen; replacing it", sandbox.id)
                sandbox.close()
                with self._changed:
                    self._waiting.appendleft(turn)  # still first in line for the next one
        finally:
            with self._changed:
                if turn in self._waiting:
                    self._waiting.remove(turn)
                    self._changed.notify_all()

    def retire(self, sandbox: Sandbox) -> None:
        """Close `sandbox` `refill_delay_s` from now, in the background, so that the request which
        handed it back (a reset) does not share the CPU with its removal (decision 013)."""

        def close_when_due() -> None:
            with self._changed:
                if self._retiring.pop(timer, None) is None:
                    return  # the pool's close() has taken it
            try:
                sandbox.close()
            except Exception as exc:  # nobody waits on this thread: say it here
                log.warning("closing retired sandbox %s failed: %s", sandbox.id, exc)

        timer = threading.Timer(self.refill_delay_s, close_when_due)
        timer.daemon = True
        with self._changed:
            if not self._closed:
                self._retiring[timer] = sandbox
                timer.start()
                return
        sandbox.close()

    def _keep_filled(self) -> None:
        failures = 0
        while True:
            with self._changed:
                while True:
                    self._changed.wait_for(lambda: self._closed or len(self._ready) + self._starting < self.size)
                    if self._closed:
                        return
                    deferred_s = (self._refill_at or 0.0) - time.monotonic()
                    if deferred_s <= 0 or len(self._waiting) > len(self._ready):
                        break
                    self._changed.wait(deferred_s)
                self._starting += 1
                if len(self._ready) + self._starting >= self.size:
                    self._refill_at = None  # full once these are up: the next checkout defers anew
            try:
                sandbox = self._start(self.spec)
            except Exception as exc:  # keep the pool alive; checkout reports the error
                log.warning("starting a pooled sandbox failed: %s", exc)
                failures += 1
                with self._changed:
                    self._starting -= 1
                    self._last_error = exc
                    self._changed.wait_for(lambda: self._closed, min(MAX_RETRY_DELAY_S, 0.1 * 2**failures))
                continue
            failures = 0
            with self._changed:
                self._starting -= 1
                keep = not self._closed
                if keep:
                    self._started.add(sandbox)
                    self._ready.append(sandbox)
                    self._progress_at = time.monotonic()
                    self._changed.notify_all()
            if not keep:
                sandbox.close()

    def close(self) -> None:
        """Stop the starters and close every sandbox the pool started, checked out or not."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        for thread in self._starters:
            thread.join()
        with self._changed:
            retiring, self._retiring = self._retiring, {}
        for timer, sandbox in retiring.items():  # closed now rather than when the timer fires
            timer.cancel()
            sandbox.close()
        for sandbox in list(self._started):
            sandbox.close()
        self._ready.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
