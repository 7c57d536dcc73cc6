"""Forking an episode (docs/decisions/035-forking-a-session.md): N independent copies of the
episode so far, each with a copy of the workspace in a sandbox of its own, the trajectory (under a
new episode id and its own session id), the task, the settings reset chose, the monitor flags and
the failure streak. Only the workspace directory is copied, from the agent's sandbox, which never
holds hidden tests; processes, /tmp and $HOME are not carried."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from env_server.episode import Episode
from env_server.models import ApiErrorCode
from env_server.service_errors import ServiceError
from env_server.tools import Workspace
from env_server.trajectories import EpisodeLog
from sandbox import ArchiveTooLarge, Sandbox, SandboxError


def fork_sandboxes(source: Episode, openers: Sequence[Callable[[], Sandbox]], *, max_workspace_bytes: int) -> list[Sandbox]:
    """One sandbox per opener, each holding a copy of `source`'s workspace. All or nothing: on
    failure no sandbox is left open."""
    with ThreadPoolExecutor(len(openers), thread_name_prefix="fork-checkout") as pool:
        checkouts = [pool.submit(opener) for opener in openers]
    sandboxes = [checkout.result() for checkout in checkouts if checkout.exception() is None]
    try:
        if len(sandboxes) < len(openers):
            raise next(checkout.exception() for checkout in checkouts if checkout.exception() is not None)
        _copy_workspace(source.sandbox, sandboxes, max_workspace_bytes)
    except BaseException:
        for sandbox in sandboxes:
            sandbox.close()
        raise
    return sandboxes


def continued_episode(source: Episode, workspace: Workspace, *, session_id: str, log: EpisodeLog | None) -> Episode:
    """`source` taken up by another session in `workspace` (a sandbox holding a copy of its workspace)."""
    record = source.record.model_copy(deep=True, update={"session_id": session_id, "episode_id": uuid.uuid4().hex})
    return Episode(
        workspace,
        record,
        source.show_hints,
        log=log,
        tool_call_format=source.tool_call_format,
        max_calls_per_step=source.max_calls_per_step,
        tools=source.tools,
        protocol=source.protocol,
        monitor_flags=list(source.monitor_flags),
        withheld_flags=copy.deepcopy(source.withheld_flags),
        streak=copy.deepcopy(source.streak),
        calls_used=source.calls_used,
    )


def _copy_workspace(source: Sandbox, targets: list[Sandbox], max_bytes: int) -> None:
    """The source's workspace into every target, failures as the refusals a fork answers: a
    workspace the grader would refuse (too large) or cannot read (an unreadable file) is the
    request's problem (422); a sandbox that fails is the infrastructure's (503)."""
    try:
        source.copy_workspace_to(targets, max_bytes=max_bytes)
    except ArchiveTooLarge:
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"the workspace holds more than {max_bytes} bytes: too large to fork") from None
    except OSError as exc:
        raise ServiceError(ApiErrorCode.INVALID_REQUEST, f"the workspace cannot be copied: {exc}") from None
    except SandboxError as exc:
        raise ServiceError(ApiErrorCode.SANDBOX_UNAVAILABLE, f"the workspace could not be copied: {exc}") from exc
