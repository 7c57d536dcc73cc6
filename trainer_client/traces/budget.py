"""A hard spending limit: a request is sent only if its worst case still fits.

Before a call, its worst-case cost is reserved: every byte of the request counted as a
prompt token (a BPE token covers at least one byte) plus a per-message allowance for the
chat template, and `max_tokens` of completion. After the call the reservation is replaced by
the cost the server reported. Money spent can therefore never pass the limit, at the price
of stopping a little early when the remaining budget is smaller than one worst case.
"""

from __future__ import annotations

from typing import Any

from trainer_client.traces.config import TeacherConfig
from trainer_client.traces.messages import canonical_json

TEMPLATE_TOKENS_PER_MESSAGE = 16
"""Role markers and separators a chat template adds around each message (generous)."""


def worst_case_cost(teacher: TeacherConfig, body: dict[str, Any]) -> float:
    """Upper bound, USD, of what `body` can cost at `teacher`'s prices."""
    prompt_bytes = len(canonical_json([body["messages"], body.get("tools", [])]).encode())
    prompt_tokens = prompt_bytes + TEMPLATE_TOKENS_PER_MESSAGE * (len(body["messages"]) + 1)
    return teacher.cost_usd(prompt_tokens, teacher.max_tokens)


class Budget:
    """Money spent and reserved against a limit. Used from one event loop: no locking."""

    def __init__(self, limit_usd: float, spent_usd: float = 0.0) -> None:
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd
        self.reserved_usd = 0.0

    def reserve(self, amount_usd: float) -> bool:
        """Hold `amount_usd` for a call; False (nothing held) if the limit would be passed."""
        if self.spent_usd + self.reserved_usd + amount_usd > self.limit_usd:
            return False
        self.reserved_usd += amount_usd
        return True

    def settle(self, reserved_usd: float, spent_usd: float) -> None:
        """Release a reservation and book what the call actually cost."""
        self.reserved_usd -= reserved_usd
        self.spent_usd += spent_usd
