"""The fixed train / held-out split of task ids: a hash of the id, the same in every process.

A task is held out when the first 8 bytes of `sha256(task_id)`, read as an integer, fall in the
lowest `HELD_OUT_PERCENT` percent. The split depends on nothing but the id, so it never moves
when a suite grows, shrinks or is listed in another order, and it applies to every suite.
Training data (demos, GRPO prompts) must come from `train`; evaluation reads `held_out`.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Split = Literal["train", "held_out"]
SPLITS: tuple[Split, ...] = ("train", "held_out")
HELD_OUT_PERCENT = 20
"""Share of ids (in percent, by hash) that are held out."""


def split_of(task_id: str) -> Split:
    """`held_out` for about `HELD_OUT_PERCENT`% of ids, `train` for the rest; fixed per id."""
    bucket = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big") % 100
    return "held_out" if bucket < HELD_OUT_PERCENT else "train"
