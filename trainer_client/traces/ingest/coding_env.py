"""This service's own trajectories: one `EpisodeRecord` per JSONL line, one state per step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from env_server.models import EpisodeRecord, TrajectoryStep
from trainer_client.records import TraceState
from trainer_client.traces.ingest.base import TraceIngester
from trainer_client.traces.messages import (
    REASONING_KEY,
    assistant_message,
    flatten_text,
    tool_call,
    tool_message,
    with_system_prompt,
    without_reasoning,
)


class CodingEnvIngester(TraceIngester):
    """Reads the files the service writes to `CODING_ENV_TRAJECTORY_DIR`."""

    format = "coding_env"

    def _states_in_file(self, file: Path) -> Iterator[TraceState]:
        for raw in self._json_lines(file):
            try:
                episode = EpisodeRecord.model_validate(raw)
            except ValidationError as error:
                self.skip(f"{file}: not an EpisodeRecord: {error.error_count()} errors")
                continue
            yield from self._episode_states(episode, file)

    def _episode_states(self, episode: EpisodeRecord, file: Path) -> Iterator[TraceState]:
        history = with_system_prompt([{"role": "user", "content": episode.prompt}])
        previous_error: str | None = None
        for step in episode.steps:
            action = _assistant_turn(step)
            if action is None:
                self.ignore(f"action:{step.action.get('type', 'untyped')}")
                continue
            meta: dict[str, Any] = {
                "trace_id": episode.episode_id,
                "file": str(file),
                "task_id": episode.task_id,
                "step": step.index,
                "episode_reward": episode.reward,
                "previous_error_kind": previous_error,
                "tools": episode.tools,
            }
            if "logprobs" in step.action:
                meta["logprobs"] = step.action["logprobs"]
            yield self._state(episode.episode_id, step.index, list(history), action, None, meta)
            history.append(without_reasoning(action))
            calls = action.get("tool_calls") or []
            if calls:
                history.append(tool_message(calls[0]["id"], step.observation.output))
            previous_error = step.observation.error_kind.value if step.observation.error_kind else None


def _assistant_turn(step: TrajectoryStep) -> dict[str, Any] | None:
    """The assistant message behind a recorded action, or None for non-decisions (`list_tools`).

    The service records the action as it arrived: an MCP `call_tool` action, or the raw
    assistant message of a client that sends whole model outputs.
    """
    action = step.action
    call_id = f"call_{step.index}"
    if action.get("tool_calls"):
        calls = [
            tool_call(call.get("id") or f"{call_id}_{n}", call["function"]["name"], call["function"]["arguments"])
            for n, call in enumerate(action["tool_calls"])
        ]
        return assistant_message(flatten_text(action.get("content")), calls, action.get(REASONING_KEY))
    if action.get("tool_name"):
        return assistant_message(None, [tool_call(call_id, action["tool_name"], action.get("arguments") or {})])
    if action.get("content"):
        return assistant_message(flatten_text(action["content"]), reasoning=action.get(REASONING_KEY))
    return None
