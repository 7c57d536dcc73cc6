"""Sessions: each owns one environment (and through it at most one sandbox).

Calls into one session are serialised by its lock, so steps never interleave; a step awaits its
command on the event loop and hands what blocks to a thread pool (decision 136), so sessions proceed
in parallel. At the capacity bound a new session waits in a FIFO admission queue
(`env_server.admission`) for up to `admission_timeout_s`, then is refused with `capacity_reached`;
an idle reaper closes sessions nobody touched for `idle_timeout_s`, freeing their sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Awaitable, Callable, TypeVar

from env_server.admission import AdmissionQueue, AdmissionTimeout
from env_server.environment import CodingEnvironment
from env_server.models import ApiErrorCode
from env_server.replicas import new_session_id
from env_server.service_errors import ServiceError

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Session:
    id: str
    env: CodingEnvironment
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False


class SessionManager:
    """Opens, finds, runs and closes sessions; see the module docstring."""

    def __init__(
        self,
        new_environment: Callable[[str], CodingEnvironment],
        *,
        max_sessions: int,
        idle_timeout_s: float,
        executor: ThreadPoolExecutor,
        on_count_change: Callable[[int], None] = lambda n: None,
        admission_timeout_s: float = 0.0,
        on_queue_change: Callable[[int], None] = lambda n: None,
        on_admission: Callable[[float], None] = lambda wait_s: None,
        replica_id: str | None = None,
    ) -> None:
        """`admission_timeout_s`: longest a new session waits for a slot at the cap (0: refused at
        once). `on_admission` is told each admitted session's wait in seconds (0 when a slot was free).
        `replica_id`: the session ids minted here start with it (`env_server.replicas`)."""
        self._replica_id = replica_id
        self._new_environment = new_environment
        self._max_sessions = max_sessions
        self._idle_timeout_s = idle_timeout_s
        self._executor = executor
        self._on_count_change = on_count_change
        self._admission_timeout_s = admission_timeout_s
        self._on_admission = on_admission
        self._sessions: dict[str, Session] = {}
        self._queue: AdmissionQueue[Session] = AdmissionQueue(self._give_back, on_queue_change)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self) -> Session:
        """A new session with a fresh environment (no sandbox until its first reset), or
        `capacity_reached` at once when no slot is free (or others are queued for one)."""
        if len(self._sessions) >= self._max_sessions or len(self._queue):
            raise self._capacity_reached()
        return self._register()

    async def admit(self, client_gone: Callable[[], Awaitable[object]] | None = None) -> Session:
        """A new session; at the cap, after waiting in FIFO order for one to close, at most
        `admission_timeout_s`. A client that goes away while queued (`client_gone()` completes)
        loses its place and gets no session (`ClientGone`)."""
        if len(self._sessions) < self._max_sessions and not len(self._queue):
            self._on_admission(0.0)
            return self._register()
        if self._admission_timeout_s <= 0:
            raise self._capacity_reached()
        queued = time.monotonic()
        try:
            session = await self._queue.wait(self._admission_timeout_s, client_gone)
        except AdmissionTimeout:
            raise self._capacity_reached(f" after waiting {self._admission_timeout_s:g} s in the admission queue") from None
        self._on_admission(time.monotonic() - queued)
        return session

    @property
    def queued(self) -> int:
        """New sessions waiting for a slot."""
        return len(self._queue)

    def _capacity_reached(self, waited: str = "") -> ServiceError:
        return ServiceError(
            ApiErrorCode.CAPACITY_REACHED,
            f"all {self._max_sessions} sessions are in use{waited}; close one or retry later",
            {"active_sessions": len(self._sessions), "max_sessions": self._max_sessions},
        )

    def _register(self) -> Session:
        session_id = new_session_id(self._replica_id)
        session = Session(session_id, self._new_environment(session_id))
        self._sessions[session_id] = session
        self._on_count_change(len(self._sessions))
        return session

    def _release_slot(self) -> None:
        """A session left: its slot goes to the first queued waiter, if any."""
        if not self._queue.hand_over(self._register):
            self._on_count_change(len(self._sessions))

    def _give_back(self, session: Session) -> None:
        """A session handed to a waiter that had gone: never used (no sandbox), so dropping it
        frees the slot for the next waiter."""
        if self._sessions.pop(session.id, None) is not None:
            session.closed = True
            self._release_slot()

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise ServiceError(ApiErrorCode.SESSION_NOT_FOUND, f"no session {session_id!r} (closed, expired or never opened)")
        return session

    async def run(self, session: Session, fn: Callable[..., T] | Callable[..., Awaitable[T]], *args: object) -> T:
        """`fn(*args)`, after every earlier call of this session finished: a coroutine function awaited here
        (it hands off what blocks itself), any other function run on the thread pool."""
        async with session.lock:
            if session.closed:
                raise ServiceError(ApiErrorCode.SESSION_NOT_FOUND, f"session {session.id!r} was closed")
            session.last_used = time.monotonic()
            try:
                if inspect.iscoroutinefunction(fn):
                    return await fn(*args)
                return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
            finally:
                session.last_used = time.monotonic()

    async def close(self, session_id: str) -> None:
        """Close a session and free its sandbox, once any call in flight has finished."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise ServiceError(ApiErrorCode.SESSION_NOT_FOUND, f"no session {session_id!r}")
        self._release_slot()
        # Shielded: a client that disconnects mid-close must not leave the sandbox running.
        await asyncio.shield(self._close_env(session))

    async def _close_env(self, session: Session) -> None:
        async with session.lock:
            session.closed = True
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, session.env.close)
            except Exception:
                log.exception("closing session %s failed", session.id)

    async def close_all(self) -> None:
        await asyncio.gather(*(self.close(sid) for sid in list(self._sessions)), return_exceptions=True)

    async def reap_idle(self) -> None:
        """Close idle sessions forever (run as a background task; cancel to stop)."""
        interval = min(self._idle_timeout_s / 4, 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            idle = [s.id for s in self._sessions.values() if not s.lock.locked() and now - s.last_used > self._idle_timeout_s]
            for session_id in idle:
                log.info("closing idle session %s", session_id)
                try:
                    await self.close(session_id)
                except ServiceError:
                    pass  # closed meanwhile

    async def fork(self, source: Session, n: int) -> list[Session]:
        """`n` new sessions continuing `source`'s episode (`CodingEnvironment.fork_into`), copied
        once any call in flight on `source` has finished. All `n` places are taken at once, before
        anything waits, so forks never overshoot the cap; if the copy fails, or the caller goes
        away before it is done, none of the `n` sessions is kept."""
        free = self._max_sessions - len(self._sessions)
        if n > free:
            raise ServiceError(
                ApiErrorCode.CAPACITY_REACHED,
                f"forking into {n} sessions needs {n} free places; {free} of {self._max_sessions} are free",
                {"active_sessions": len(self._sessions), "max_sessions": self._max_sessions, "requested": n},
            )
        forks = [self.open() for _ in range(n)]
        copying = asyncio.ensure_future(self._fill_forks(source, forks))
        try:
            # Shielded: the copy runs on in its thread whatever happens to the caller; the forks
            # are closed only once it has finished, so no sandbox is handed to a closed session.
            await asyncio.shield(copying)
        except BaseException:
            await asyncio.shield(self._discard_forks(forks, copying))
            raise
        return forks

    async def _fill_forks(self, source: Session, forks: list[Session]) -> None:
        async with contextlib.AsyncExitStack() as held:
            for fork in forks:  # nobody knows their ids yet; held against the idle reaper
                await held.enter_async_context(fork.lock)
            await self.run(source, source.env.fork_into, [fork.env for fork in forks])
            for fork in forks:
                fork.last_used = time.monotonic()

    async def _discard_forks(self, forks: list[Session], copying: asyncio.Future[None]) -> None:
        await asyncio.wait([copying])
        await asyncio.gather(*(self.close(fork.id) for fork in forks), return_exceptions=True)
