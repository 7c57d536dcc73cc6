"""The dataset row of one task, and the prompt TRL builds from it at reset.

Training (`coding-train train`), the demos written for the warm start and `coding-train eval` must
show the policy the same first message, or the warm start teaches a context the policy never sees.
They all build it here, the way TRL's `GRPOTrainer` does with `environment_factory`: the row's last
message gets the environment's reset observation appended to its content.
"""

from __future__ import annotations

from typing import Any


def task_row(task_id: str) -> dict[str, Any]:
    """The training-dataset row for one task: an empty user message that reset fills in."""
    return {"prompt": [{"role": "user", "content": ""}], "task_id": task_id}


def prompt_after_reset(row: dict[str, Any], observation: str) -> list[dict[str, Any]]:
    """The conversation the policy starts from (TRL: `prompt[:-1] + [{..., content + observation}]`)."""
    prompt = row["prompt"]
    return [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]

