"""The coding environment as OpenEnv sees it: one instance per session, one sandbox per episode.

    reset(task_id | task | seed)  -> CodingResetObservation (prompt, tool schemas, limits)
    step(call_tool | assistant_message | list_tools) -> CodingObservation (output, error_kind, hint)
    state                          -> CodingState

This is the face: it validates what reset asks for and delegates the rest to the episode
(`env_server.episode`), the step's calls (`env_server.call_runner`) and forking
(`env_server.forking`). The wire types are in `env_server.openenv_models`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Callable

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import ListToolsObservation
from openenv.core.env_server.mcp_types import Tool as McpTool
from openenv.core.env_server.types import EnvironmentMetadata, Observation
from pydantic import ValidationError

from env_server.call_runner import CallRunner
from env_server.episode import Episode, episode_tool_call_format, episode_tools
from env_server.forking import continued_episode, fork_sandboxes
from env_server.grading.grader import GradingConfig, TaskSetupError, prepare_workspace
from env_server.hints import HintGenerator
from env_server.models import DEFAULT_MAX_CALLS_PER_STEP, DEFAULT_PROTOCOL_VERSION, ApiErrorCode, EpisodeEnding, EpisodeRecord, TaskSpec
from env_server.openenv_models import AnyAction, CodingResetObservation, CodingState, ListToolsStep
from env_server.package_docs import DOCUMENTATION_PATH, readme_text
from env_server.service_errors import ServiceError
from env_server.tasks import TaskRegistry
from env_server.tools import TOOLS, CallOutcome, Workspace
from env_server.trajectories import EpisodeLog
from sandbox import Sandbox


class CodingEnvironment(Environment[AnyAction, Observation, CodingState]):
    """One session's environment. Not thread-safe: the session manager serialises calls."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        *,
        checkout: Callable[[], Sandbox],
        tasks: TaskRegistry,
        grader_checkout: Callable[[], Sandbox] | None = None,
        hints: HintGenerator,
        episode_log: EpisodeLog | None = None,
        session_id: str | None = None,
        retire: Callable[[Sandbox], None] = Sandbox.close,
        grading: GradingConfig | None = None,
        infrastructure_alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """`grader_checkout` gives the fresh sandbox each submission is graded in (default:
        `checkout`). `retire` disposes of a finished episode's sandbox and of each grading sandbox
        once its checks ran; the service passes one that closes it in the background, so removing a
        container (~150 ms) is not on the path of reset or submit. `infrastructure_alive` says whether
        the sandbox engine answers; with the grader's checkout it decides who a dead sandbox is blamed
        on (docs/decisions/024-who-ends-an-episode.md)."""
        super().__init__()
        self._checkout = checkout
        self._retire = retire
        self._grading = grading or GradingConfig()
        self._runner = CallRunner(hints=hints, grader_checkout=grader_checkout or checkout, infrastructure_alive=infrastructure_alive)
        self._tasks = tasks
        self._hints = hints
        self._episode_log = episode_log
        self._session_id = session_id
        self._episode: Episode | None = None

    # -- OpenEnv interface -------------------------------------------------------------------

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        task: TaskSpec | dict[str, Any] | None = None,
        show_hints: bool = False,
        tool_call_format: str | None = None,
        max_calls_per_step: int = DEFAULT_MAX_CALLS_PER_STEP,
        tools: Sequence[str] | None = None,
        protocol: int = DEFAULT_PROTOCOL_VERSION,
        **_: Any,
    ) -> CodingResetObservation:
        tool_call_format = episode_tool_call_format(tool_call_format)
        tool_names = episode_tools(tools)
        spec = self._resolve_task(task_id, task, seed)
        if self._episode is not None:
            self._retire(self._episode.sandbox)
            self._episode.leave(EpisodeEnding.ABANDONED)
            self._episode = None
        sandbox = self._open_sandbox()
        try:
            prepare_workspace(sandbox, spec)
        except (TaskSetupError, ValueError) as exc:
            sandbox.close()
            raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"task {spec.id!r} cannot be set up: {exc}") from exc
        except Exception as exc:
            sandbox.close()
            raise ServiceError(ApiErrorCode.SANDBOX_UNAVAILABLE, f"preparing the workspace of {spec.id!r} failed: {exc}") from exc
        self._episode = episode = Episode.start(
            self._workspace(sandbox, spec),
            session_id=self._session_id or "",
            episode_id=episode_id,
            tools=tool_names,
            show_hints=show_hints,
            log=self._episode_log,
            tool_call_format=tool_call_format,
            max_calls_per_step=max_calls_per_step,
            protocol=protocol,
        )
        return CodingResetObservation(task_id=spec.id, prompt=episode.record.prompt, tools=episode.record.tools, max_steps=spec.limits.max_steps)

    def step(self, action: AnyAction, timeout_s: float | None = None, **_: Any) -> Observation:
        """`step_async` for a caller without an event loop (a script, a test)."""
        return asyncio.run(self.step_async(action))

    async def step_async(self, action: AnyAction, timeout_s: float | None = None, **_: Any) -> Observation:
        """One step, awaited on the caller's event loop (the service's): a command's exec is awaited there, and
        whatever blocks (grading, file transfers, ending the episode) runs on a worker thread."""
        if isinstance(action, ListToolsStep):
            names = self._episode.tools if self._episode is not None else tuple(TOOLS)
            return ListToolsObservation(tools=[McpTool(name=name, description=TOOLS[name].description, input_schema=TOOLS[name].parameters()) for name in names])
        episode = self._active_episode()
        started_at = time.time()
        run = await self._runner.run(action, episode)
        episode.record_step(action.model_dump(exclude={"metadata"}), run.observation, run.outcome, started_at=started_at)
        if run.outcome.done:
            await asyncio.to_thread(self._end, episode, run.outcome)
        return run.observation

    def _end(self, episode: Episode, outcome: CallOutcome) -> None:
        """End `episode` with the step that ended it: its graded sandbox, of no further use, freed now rather than
        at the next reset; its record written. On a worker thread: both may block (writing the record; retiring,
        which closes the sandbox there and then once the pool has closed, at shutdown)."""
        self._retire(episode.sandbox)
        episode.finish(outcome)

    @property
    def state(self) -> CodingState:
        episode = self._episode
        if episode is None:
            return CodingState(session_id=self._session_id)
        return CodingState(
            episode_id=episode.record.episode_id,
            step_count=episode.calls_used,
            session_id=self._session_id,
            task_id=episode.task.id,
            done=episode.done,
            reward=episode.reward,
            max_steps=episode.task.limits.max_steps,
            show_hints=episode.show_hints,
            tool_call_format=episode.tool_call_format,
            max_calls_per_step=episode.max_calls_per_step,
            tools=list(episode.tools),
            sandbox_id=episode.sandbox.id,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="coding-env",
            description="Agentic coding tasks in hardened sandboxes: bash and file tools, typed error kinds, hints, "
            "hidden-test grading.",
            version="0.1.0",
            readme_content=readme_text(),
            documentation_url=DOCUMENTATION_PATH,  # made absolute by the route, which knows the base URL
        )

    def close(self) -> None:
        if self._episode is not None:
            self._episode.sandbox.close()
            self._episode.leave(EpisodeEnding.CLOSED)
            self._episode = None

    # -- Beyond OpenEnv ----------------------------------------------------------------------

    def trajectory(self) -> EpisodeRecord:
        """The current (or last) episode as recorded so far, once the judge hints it is waiting
        for have arrived (at most the judge's request timeout)."""
        episode = self._active_episode(allow_done=True)
        episode.settle(self._hints.settle_timeout_s)
        return episode.record

    def fork_into(self, forks: Sequence[CodingEnvironment]) -> None:
        """Make each of `forks` (environments of new sessions, never reset) continue this episode
        from where it stands (`env_server.forking`). Refused for an episode not started or over (its
        sandbox is gone once graded). All or nothing: on failure no fork holds a sandbox."""
        episode = self._active_episode()
        episode.settle(self._hints.settle_timeout_s)  # the copies start from the hints the source's record will show
        sandboxes = fork_sandboxes(episode, [fork._open_sandbox for fork in forks], max_workspace_bytes=self._grading.max_workspace_bytes)
        for fork, sandbox in zip(forks, sandboxes):
            fork._episode = continued_episode(
                episode, fork._workspace(sandbox, episode.task), session_id=fork._session_id or "", log=fork._episode_log
            )

    # -- internals ---------------------------------------------------------------------------

    def _resolve_task(self, task_id: str | None, task: TaskSpec | dict[str, Any] | None, seed: int | None) -> TaskSpec:
        if task is not None:
            try:
                return TaskSpec.model_validate(task)
            except ValidationError as exc:
                raise ServiceError(ApiErrorCode.INVALID_REQUEST, "invalid inline task spec", exc.errors(include_url=False)) from exc
        if task_id is None:
            ids = self._tasks.ids("builtin")
            task_id = ids[(seed or 0) % len(ids)]
        try:
            return self._tasks.get(task_id)
        except KeyError as exc:
            raise ServiceError(ApiErrorCode.TASK_NOT_FOUND, f"unknown task {task_id!r}") from exc

    def _open_sandbox(self) -> Sandbox:
        try:
            return self._checkout()
        except Exception as exc:
            raise ServiceError(ApiErrorCode.SANDBOX_UNAVAILABLE, f"no sandbox could be started: {exc}") from exc

    def _workspace(self, sandbox: Sandbox, task: TaskSpec) -> Workspace:
        return Workspace(sandbox, task, fresh_sandbox=self._runner.open_grader, retire=self._retire, grading=self._grading)

    def _active_episode(self, allow_done: bool = False) -> Episode:
        if self._episode is None:
            raise ServiceError(ApiErrorCode.EPISODE_NOT_STARTED, "reset the session before stepping it")
        if self._episode.done and not allow_done:
            raise ServiceError(ApiErrorCode.EPISODE_DONE, "the episode is over; reset to start another")
        return self._episode
