"""The service facade the routes call: sessions, the sandbox source behind them, metrics, tasks.

Every transport (OpenEnv's HTTP routes, `/sessions`, MCP, WebSocket) opens, resets and steps
sessions through one `Service`, so a session behaves the same whichever protocol drives it: new
sessions queue for a slot at the cap (docs/decisions/033-admission-queue.md), a step before any
reset starts the default task (docs/decisions/032-auto-reset.md), and a request never waits on
a hung sandbox start longer than `sandbox_start_timeout_s` (docs/decisions/034-lifecycle-deadlines.md).
`open_service` builds it (thread pool, orphan reaping, warm pools, hints, the idle reaper) and
tears it down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, TypeVar

from openenv.core.env_server.types import Observation
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError
from starlette.requests import HTTPConnection, Request

from env_server.environment import CodingEnvironment
from env_server.hints import HintGenerator
from env_server.metrics import ServiceMetrics
from env_server.models import ApiErrorCode, ForkRequestBody, ResetRequestBody, SessionsForked
from env_server.openenv_models import ACTIONS, AnyAction, CodingObservation, CodingResetObservation
from env_server.replicas import REPLICA_LABEL
from env_server.service_errors import ServiceError
from env_server.sessions import Session, SessionManager
from env_server.settings import ServiceSettings
from env_server.tasks import TaskRegistry
from env_server.tools import TOOLS
from env_server.trajectories import EpisodeLog
from sandbox import Sandbox, WarmPool, open_sandbox
from sandbox.deadline import within_deadline
from sandbox.spec import DockerSpec

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Service:
    """What the routes share: settings, sessions, sandbox source, metrics."""

    settings: ServiceSettings
    sessions: SessionManager
    metrics: ServiceMetrics
    tasks: TaskRegistry
    new_environment: Callable[[str | None], CodingEnvironment]
    episodes: EpisodeLog
    """Ended episodes: the recent ones for the viewer, and the trajectory file when one is set."""

    async def open_session(self, client_gone: Callable[[], Awaitable[object]] | None = None) -> Session:
        """A new session, after its turn in the admission queue when the service is at its cap;
        `client_gone()` completes when the caller has left (`request_gone`), which ends its wait."""
        return await self.sessions.admit(client_gone)

    async def reset(self, session: Session, body: ResetRequestBody) -> Observation:
        kwargs = body.model_dump(include={"seed", "episode_id", "task_id", "task", "show_hints", "tool_call_format", "max_calls_per_step", "tools", "protocol"}, exclude_none=True)
        with self._counting_sandbox_failures():
            return await self.sessions.run(session, lambda: session.env.reset(**kwargs))

    async def step(
        self, session: Session, action: dict[str, Any] | AnyAction, transport: str, *, auto_reset: bool = True
    ) -> Observation:
        """One step. A session never reset is first reset onto `settings.default_task` (unless
        `auto_reset` is off: OpenEnv's stateless `/step`, whose session ends with the request);
        the observation then says so in `metadata.auto_reset`. An episode that is over stays over."""
        parsed = parse_action(action) if isinstance(action, dict) else action
        default_task = self.settings.default_task if auto_reset else None
        started = time.perf_counter()
        with self._counting_sandbox_failures():
            observation, auto = await self.sessions.run(session, _step_or_start, session.env, parsed, default_task)
        self.metrics.step_latency_of(transport).observe(time.perf_counter() - started)
        if isinstance(observation, CodingObservation):
            self.observe_step(observation)
        if auto is not None:
            observation.metadata["auto_reset"] = auto
        return observation

    @contextmanager
    def _counting_sandbox_failures(self) -> Iterator[None]:
        try:
            yield
        except ServiceError as exc:
            if exc.code is ApiErrorCode.SANDBOX_UNAVAILABLE:
                self.metrics.sandbox_failures.inc()
            raise

    def observe_step(self, observation: CodingObservation) -> None:
        for call in observation.calls:  # one count per call, as one-call steps always counted
            if call.ran:
                self.metrics.steps_of(call.tool_name if call.tool_name in TOOLS else "unknown").inc()
            if call.error_kind is not None:
                self.metrics.error_kinds_of(call.error_kind.value).inc()
                if call.error_kind.value == "sandbox_error":
                    self.metrics.sandbox_failures.inc()
        if observation.done:
            # Flags are withheld from observations until the episode is done (decision 055):
            # counted then, once per flag and episode, the grader's own included.
            for flag in observation.episode_monitor_flags or []:
                self.metrics.monitor_flags.labels(flag).inc()
        if observation.done and observation.reward is not None:
            self.metrics.episodes_graded.inc()
            self.metrics.rewards.observe(observation.reward)

    async def fork(self, session: Session, body: ForkRequestBody) -> SessionsForked:
        """`body.n` new sessions continuing `session`'s episode (docs/decisions/035-forking-a-session.md)."""
        with self._counting_sandbox_failures():
            forks = await self.sessions.fork(session, body.n)
        return SessionsForked(session_ids=[fork.id for fork in forks])


def service_of(connection: HTTPConnection) -> Service:
    """The service of the app a request or WebSocket arrived at (set by the app's lifespan)."""
    return connection.app.state.service


async def request_gone(request: Request) -> None:
    """Returns once the client of `request` has gone away (the route must not read the body
    after starting this: by then FastAPI has read it, and what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _step_or_start(env: CodingEnvironment, action: AnyAction, default_task: str | None) -> tuple[Observation, dict[str, Any] | None]:
    """`env.step_async(action)`; when no episode was ever started and `default_task` is given, the
    episode is started on it first (in the same session call, so no other call interleaves).
    Returns the observation and what was started (None when nothing was)."""
    try:
        return await env.step_async(action), None
    except ServiceError as exc:
        if exc.code is not ApiErrorCode.EPISODE_NOT_STARTED or default_task is None:
            raise
    started: CodingResetObservation = await asyncio.to_thread(env.reset, task_id=default_task)
    auto_reset = {"task_id": started.task_id, "episode_id": env.state.episode_id, "prompt": started.prompt, "max_steps": started.max_steps}
    return await env.step_async(action), auto_reset


def _validated(validate: Callable[[dict[str, Any]], T], data: dict[str, Any], what: str) -> T:
    """`validate(data)`, its failure as a typed `invalid_request` naming `what` (WebSocket and MCP
    frames; the HTTP routes have FastAPI validate the same models)."""
    try:
        return validate(data)
    except ValidationError as exc:
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"invalid {what}", exc.errors(include_url=False, include_context=False)) from exc


_REPLY: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def observation_reply(observation: Observation, *, frame: bool = False) -> bytes:
    """OpenEnv's reply to a reset or step as JSON (`serialize_observation`'s shape: the observation without
    `reward` and `done`, which stand beside it, and `metadata` again beside it when it holds anything); as a
    WebSocket frame, `{"type": "observation", "data": reply}`, when `frame`. Written by pydantic-core in one
    pass: a dict of Python values serialized again by `json` cost a step about 0.1 ms (docs/benchmarks.md)."""
    reply: dict[str, Any] = {"observation": observation, "reward": observation.reward, "done": observation.done}
    if observation.metadata:
        reply["metadata"] = observation.metadata
    exclude: dict[str, Any] = {"observation": {"reward", "done"}}
    if frame:
        reply, exclude = {"type": "observation", "data": reply}, {"data": exclude}
    try:
        return _REPLY.dump_json(reply, exclude=exclude)
    except PydanticSerializationError:
        # Text that no UTF-8 can hold, an unpaired surrogate (a client can send one as a JSON escape, and the
        # reply echoes a call's arguments), goes through `json`, which writes it as the same escape.
        return json.dumps(_REPLY.dump_python(reply, exclude=exclude, mode="json")).encode()


def parse_action(action: dict[str, Any]) -> Any:
    return _validated(ACTIONS.validate_python, action, "action")


def parse_reset(data: dict[str, Any]) -> ResetRequestBody:
    return _validated(ResetRequestBody.model_validate, data, "reset request")


def parse_fork(data: dict[str, Any]) -> ForkRequestBody:
    return _validated(ForkRequestBody.model_validate, data, "fork request")


@asynccontextmanager
async def open_service(settings: ServiceSettings, tasks: TaskRegistry, metrics: ServiceMetrics) -> AsyncIterator[Service]:
    """The service from start to shutdown: orphans reaped, warm pools started, idle sessions
    reaped while it runs; on exit every session, pool and thread is closed."""
    settings = _replica_labelled(settings)
    try:
        tasks.get(settings.default_task)
    except KeyError:
        raise ValueError(f"CODING_ENV_DEFAULT_TASK={settings.default_task!r} is not a known task (see `coding-env tasks list`)") from None
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(settings.executor_threads or settings.max_sessions + 8, thread_name_prefix="session")
    # What a step hands off (`asyncio.to_thread`: a blocking tool, grading) runs on the sessions' threads too.
    loop.set_default_executor(executor)
    await loop.run_in_executor(executor, _reap_orphans, settings)
    checkout, pool = _sandbox_source(settings, settings.pool_size, loop)
    grader_checkout, grading_pool = _sandbox_source(settings, settings.grading_pool_size, loop)
    if pool is not None:
        metrics.track_pool(lambda: pool.ready_count)
    hints = HintGenerator(settings.hints, list(TOOLS))
    engine_alive = _engine_probe(settings)
    episode_log = EpisodeLog(settings.trajectory_dir, settings.recent_episodes)

    def new_environment(session_id: str | None) -> CodingEnvironment:
        return CodingEnvironment(
            checkout=checkout,
            grader_checkout=grader_checkout,
            tasks=tasks,
            hints=hints,
            episode_log=episode_log,
            session_id=session_id,
            retire=pool.retire if pool is not None else lambda sandbox: executor.submit(sandbox.close),
            grading=settings.grading,
            infrastructure_alive=engine_alive,
        )

    sessions = SessionManager(
        new_environment,
        max_sessions=settings.max_sessions,
        idle_timeout_s=settings.idle_timeout_s,
        executor=executor,
        on_count_change=metrics.active_sessions.set,
        admission_timeout_s=settings.admission_timeout_s,
        on_queue_change=metrics.admission_queue.set,
        on_admission=metrics.admission_wait.observe,
        replica_id=settings.replica_id,
    )
    reaper = asyncio.create_task(sessions.reap_idle())
    log.info(
        "serving on the %s backend: %d warm sandboxes (+%d for grading), at most %d sessions, %s; task suites: %s "
        "(default task %s); ended episodes at /viewer (last %d)%s",
        settings.sandbox_backend, settings.pool_size, settings.grading_pool_size, settings.max_sessions,
        "bearer token required" if settings.api_token else "no token (set CODING_ENV_API_TOKEN before exposing the port)",
        ", ".join(tasks.suites()), settings.default_task, settings.recent_episodes,
        f", appended to {settings.trajectory_dir}" if settings.trajectory_dir else "",
    )
    try:
        yield Service(settings, sessions, metrics, tasks, new_environment, episode_log)
    finally:
        reaper.cancel()
        await sessions.close_all()
        for started in (pool, grading_pool):
            if started is not None:
                await loop.run_in_executor(executor, started.close)
        hints.close()
        executor.shutdown(wait=True)


def _sandbox_source(settings: ServiceSettings, size: int, loop: asyncio.AbstractEventLoop) -> tuple[Callable[[], Sandbox], WarmPool | None]:
    """Where sandboxes come from: a warm pool of `size` (none when 0). A cold start gives up at
    `sandbox_start_timeout_s`; a pool checkout when the pool stalled that long (`WarmPool.checkout`). A
    start on the request's path gives up at that bound too (its sandbox would come too late); the pool's
    background starts keep the backend's own limit (no request waits on one of them). Every sandbox's
    replies are read on the service's event loop (decision 138)."""
    deadline_s = settings.sandbox_start_timeout_s
    if size == 0:
        cold_start = partial(open_sandbox, settings.sandbox, settings.sandbox_backend, start_timeout_s=deadline_s, replies_on=loop)
        return (lambda: within_deadline(cold_start, deadline_s)), None
    pool = WarmPool(settings.sandbox, size=size, start=partial(open_sandbox, backend=settings.sandbox_backend, replies_on=loop))
    return (lambda: pool.checkout(timeout_s=deadline_s)), pool  # the pool bounds a stall itself (decision 034)


def _engine_probe(settings: ServiceSettings) -> Callable[[], bool]:
    """Whether the sandbox engine answers: Docker's ping; the local backend has no engine to lose."""
    if settings.sandbox_backend != "docker":
        return lambda: True
    import docker

    def ping() -> bool:
        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()

    return ping


def _reap_orphans(settings: ServiceSettings) -> None:
    """Without a replica id: sandboxes of dead processes on this host. With one: every sandbox of
    that replica id, whoever started it (this process has started none yet); its predecessor may have
    run on another host (a re-created container), where its liveness cannot be checked."""
    if settings.reap_orphans_on_start and settings.sandbox_backend == "docker":
        from sandbox.docker_backend import reap_orphans

        if settings.replica_id:
            removed = reap_orphans(all_owners=True, label=f"{REPLICA_LABEL}={settings.replica_id}")
        else:
            removed = reap_orphans()
        if removed:
            log.warning("removed %d orphaned sandbox containers", len(removed))


def _replica_labelled(settings: ServiceSettings) -> ServiceSettings:
    """`settings` whose Docker sandboxes carry the replica label (for `_reap_orphans` of a successor)."""
    if not settings.replica_id or not isinstance(settings.sandbox, DockerSpec):
        return settings
    labels = {**settings.sandbox.labels, REPLICA_LABEL: settings.replica_id}
    return settings.model_copy(update={"sandbox": settings.sandbox.model_copy(update={"labels": labels})})
