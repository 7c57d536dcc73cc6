"""A few rollouts of every generation batch, written as readable conversations, so that a user can
see what the policy did during training (`<output_dir>/completions.jsonl`, one line per rollout).

The metrics say how often the policy erred; these say how: the task, each turn as the trainer parsed
it (tool calls included), each tool's answer as the policy read it, the error kinds the trainer
charged to its turns, the reward, and at each hint site what the SDPO teacher read there."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETIONS_FILE = "completions.jsonl"


@dataclass(frozen=True)
class RolloutSample:
    """One rollout of a generation batch, as written."""

    task_id: str | None
    reward: float | None
    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    """The assistant turns and tool answers after the prompt, as the trainer's tool loop appended them."""
    error_kinds: list[str]
    """The failures charged to the policy's turns (the trainer's `policy/failures/<kind>`)."""
    hint_sites: list[dict[str, Any]]
    """Per hint site: its `turn`, `error_kinds` and the message the SDPO teacher read before it
    (`teacher_reads`), which the policy never did."""


class CompletionSampleLog:
    """Appends `per_step` rollouts of each generation batch, drawn with a seeded generator, to a JSONL file."""

    def __init__(self, output_dir: str | Path, per_step: int, seed: int) -> None:
        self.path = Path(output_dir) / COMPLETIONS_FILE
        self._per_step = per_step
        self._rng = random.Random(seed)

    def write(self, step: int, rollouts: Sequence[RolloutSample]) -> None:
        """The sample of this batch's `rollouts`, each line tagged with the optimizer `step` it was generated at."""
        if self._per_step <= 0 or not rollouts:
            return
        chosen = sorted(self._rng.sample(range(len(rollouts)), min(self._per_step, len(rollouts))))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as lines:
            for index in chosen:
                rollout = rollouts[index]
                line = {"step": step, "rollout": index, "task_id": rollout.task_id, "reward": rollout.reward,
                        "error_kinds": rollout.error_kinds, "messages": [*rollout.prompt, *rollout.completion],
                        "hint_sites": rollout.hint_sites}
                lines.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
