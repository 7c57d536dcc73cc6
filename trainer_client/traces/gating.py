"""Uncertainty gating: spend teacher calls where the student hesitated.

The trace may carry the student's log-probs for its action in `meta["logprobs"]`, in the
OpenAI chat format (`{"content": [{"token", "logprob", "top_logprobs": [...]}]}`, or the
bare list). A position's entropy is computed over its renormalised top alternatives; a
position without alternatives contributes the surprisal of the chosen token.
"""

from __future__ import annotations

import math
from typing import Any


def mean_token_entropy(logprobs: Any) -> float | None:
    """Mean per-token entropy (nats) of the student's action, or None without usable log-probs."""
    positions = logprobs.get("content") if isinstance(logprobs, dict) else logprobs
    if not isinstance(positions, list):
        return None
    entropies = [entropy for entropy in map(_position_entropy, positions) if entropy is not None]
    return sum(entropies) / len(entropies) if entropies else None


def _position_entropy(position: Any) -> float | None:
    if not isinstance(position, dict):
        return None
    alternatives = [
        float(top["logprob"]) for top in position.get("top_logprobs") or [] if isinstance(top, dict) and "logprob" in top
    ]
    if not alternatives:
        logprob = position.get("logprob")
        return -float(logprob) if isinstance(logprob, (int, float)) else None
    weights = [math.exp(value) for value in alternatives]
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights if w > 0)
