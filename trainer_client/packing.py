"""Several continuations of one context in one row, so that the context runs through the model once.

A DPO pair is one context and two actions; an SDPO rollout with several hint sites is one context
and, per site, a hint and the hinted turn inserted at the site's cut. Packed, a row holds the
context and then each continuation: a continuation's tokens see the context up to the continuation's
own cut and the continuation's earlier tokens, nothing else, and their positions go on from the cut.
Every continuation is then scored exactly as `context[:cut] + continuation` would be alone (up to
float summation order). The mask is a `(rows, length, length)` boolean; the trainer turns it into
the additive 4D mask transformers passes to the attention unchanged (decision 075). Where a model
cannot take such a mask (`takes_shared_prefixes`), `pack(shared=False)` gives each continuation a
row of its own, `context[:cut] + continuation`, with the same coordinates API.

Where the contexts are already in a key-value cache (the policy's own forward over the rollouts,
decision 076), `pack_after_cache` lays out the continuations alone: their queries see the cached
context before their cut, by a mask over the cache's positions and their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True)
class Continuation:
    """Tokens that follow `context[:cut]`."""

    cut: int
    token_ids: Sequence[int]


@dataclass(frozen=True)
class PackedRow:
    """A context and its continuations."""

    context: Sequence[int]
    continuations: Sequence[Continuation]


class Placement(NamedTuple):
    """Where one continuation landed in a batch."""

    row: int
    """The batch row holding it."""
    start: int
    """Index of its first token in that row."""
    cut: int
    """It follows the row's first `cut` tokens (its context)."""
    length: int
    """Its tokens."""


@dataclass(frozen=True)
class PackedBatch:
    """Right-padded rows to run through the model, and where each continuation landed."""

    input_ids: torch.Tensor
    """`(rows, length)` token ids."""
    attention_mask: torch.Tensor
    """`(rows, length)`, 1 on real tokens; packed, `(rows, length, length)` booleans: true where the
    query (dim 1) may attend to the key (dim 2)."""
    position_ids: torch.Tensor
    """`(rows, length)` position of each token in its own `context[:cut] + continuation`."""
    placements: tuple[tuple[Placement, ...], ...]
    """Per `PackedRow` given, per continuation, where it landed."""

    def scored_tokens(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every continuation token as `(batch row, predicting index, token id, continuation number)`
        tensors; continuations are numbered in the order given, row by row."""
        columns: list[list[int]] = [[], [], [], []]
        number = 0
        for row, placements in enumerate(self.placements):
            for continuation, placement in enumerate(placements):
                tokens = self.input_ids[placement.row, placement.start : placement.start + placement.length].tolist()
                columns[0].extend([placement.row] * placement.length)
                columns[1].extend(self.predictors(row, continuation))
                columns[2].extend(tokens)
                columns[3].extend([number] * placement.length)
                number += 1
        rows, predictors, tokens, numbers = (torch.tensor(column, dtype=torch.long) for column in columns)
        return rows, predictors, tokens, numbers

    def token_count(self) -> int:
        """Tokens the model runs for this batch, padding left out (what a forward over it costs)."""
        ends: dict[int, int] = {}  # per batch row, where its last continuation ends
        for placements in self.placements:
            for placement in placements:
                ends[placement.row] = max(ends.get(placement.row, 0), placement.start + placement.length)
        return sum(ends.values())

    def predictors(self, row: int, continuation: int) -> list[int]:
        """Per token of a continuation, the index (in its batch row) whose hidden state predicts it:
        the last context token before the cut for the first, the previous token for the others."""
        placement = self.placements[row][continuation]
        return [placement.cut - 1, *range(placement.start, placement.start + placement.length - 1)]


def takes_shared_prefixes(config: Any) -> bool:
    """Whether a model runs a packed batch as it runs each sequence alone: its attention adds a custom
    4D mask (eager, SDPA) and no layer slides a window, which that mask would override."""
    return (
        config._attn_implementation in ("eager", "sdpa")
        and getattr(config, "sliding_window", None) is None
        and "sliding_attention" not in (getattr(config, "layer_types", None) or ())
    )


def _check_continuations(rows: Sequence[PackedRow]) -> None:
    for row in rows:
        for continuation in row.continuations:
            if not 0 < continuation.cut <= len(row.context) or not continuation.token_ids:
                raise ValueError("a continuation must follow a non-empty part of its context and hold tokens")


def pack(rows: Sequence[PackedRow], pad_token_id: int, *, shared: bool) -> PackedBatch:
    """Lay `rows` out as one batch: each packed (`shared`), or one row per continuation."""
    _check_continuations(rows)
    if shared:
        layouts = [(row.context[: max(c.cut for c in row.continuations)], list(row.continuations)) for row in rows]
    else:
        layouts = [(row.context[: c.cut], [c]) for row in rows for c in row.continuations]
    length = max(len(context) + sum(len(c.token_ids) for c in continuations) for context, continuations in layouts)
    input_ids = torch.full((len(layouts), length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(layouts), length), dtype=torch.long)
    segments = torch.full((len(layouts), length), -1, dtype=torch.long)  # -1 padding, 0 context, k the k-th continuation
    cuts = torch.ones((len(layouts), length), dtype=torch.long)  # a token sees the context before its cut
    placed: list[Placement] = []
    for batch_row, (context, continuations) in enumerate(layouts):
        input_ids[batch_row, : len(context)] = torch.tensor(list(context), dtype=torch.long)
        position_ids[batch_row, : len(context)] = torch.arange(len(context))
        segments[batch_row, : len(context)] = 0
        start = len(context)
        for segment, continuation in enumerate(continuations, start=1):
            end = start + len(continuation.token_ids)
            input_ids[batch_row, start:end] = torch.tensor(list(continuation.token_ids), dtype=torch.long)
            position_ids[batch_row, start:end] = torch.arange(continuation.cut, continuation.cut + end - start)
            segments[batch_row, start:end] = segment
            cuts[batch_row, start:end] = continuation.cut
            placed.append(Placement(batch_row, start, continuation.cut, end - start))
            start = end
    real = segments >= 0
    if shared:
        index = torch.arange(length)
        query_segment, key_segment = segments[:, :, None], segments[:, None, :]
        sees_context = (key_segment == 0) & ((query_segment == 0) | (index[None, None, :] < cuts[:, :, None]))
        sees_itself = (key_segment == query_segment) & (query_segment > 0)
        causal = index[None, :, None] >= index[None, None, :]
        attention_mask = causal & real[:, None, :] & (sees_context | sees_itself)
    else:
        attention_mask = real.long()
    cursor = iter(placed)  # continuations were placed in the order given, packed or not
    placements = tuple(tuple(next(cursor) for _ in row.continuations) for row in rows)
    return PackedBatch(input_ids, attention_mask, position_ids, placements)


@dataclass(frozen=True)
class ContinuationBatch:
    """Right-padded rows of continuations alone, whose contexts are in a key-value cache of
    `cache_length` positions (the row's context starting at its `context_start` there)."""

    input_ids: torch.Tensor
    """`(rows, length)` continuation token ids."""
    attention_mask: torch.Tensor
    """`(rows, length, cache_length + length)` booleans: true where the query may attend to the key
    (the cache's positions, then the row's own tokens)."""
    position_ids: torch.Tensor
    """`(rows, length)`: a continuation goes on from its cut's position in the cache."""
    placements: tuple[tuple[Placement, ...], ...]
    """Per `PackedRow` given, per continuation, where it landed (`start`: index in its batch row)."""

    def predictors(self, row: int, continuation: int) -> list[int]:
        """Per token of a continuation but the first, the index (in its batch row) whose hidden state
        predicts it. The first token's predictor is the context's last token before the cut, which this
        batch does not run."""
        placement = self.placements[row][continuation]
        return list(range(placement.start, placement.start + placement.length - 1))


def pack_after_cache(
    rows: Sequence[PackedRow], pad_token_id: int, *, context_starts: Sequence[int], cache_length: int
) -> ContinuationBatch:
    """Lay out the continuations of `rows`, row `i`'s context being the cache's row `i` from
    `context_starts[i]` (its left padding) on, at positions equal to their cache indices."""
    if len(context_starts) != len(rows):
        raise ValueError("one context start per row")
    _check_continuations(rows)
    if any(start + c.cut > cache_length for row, start in zip(rows, context_starts) for c in row.continuations):
        raise ValueError("a continuation's cut lies beyond the cache")
    length = max(sum(len(c.token_ids) for c in row.continuations) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length, cache_length + length), dtype=torch.bool)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    placed: list[tuple[Placement, ...]] = []
    for index, (row, context_start) in enumerate(zip(rows, context_starts, strict=True)):
        start, placements = 0, []
        for continuation in row.continuations:
            end = start + len(continuation.token_ids)
            cut = context_start + continuation.cut  # the cut in cache positions
            input_ids[index, start:end] = torch.tensor(list(continuation.token_ids), dtype=torch.long)
            position_ids[index, start:end] = torch.arange(cut, cut + end - start)
            attention_mask[index, start:end, context_start:cut] = True
            attention_mask[index, start:end, cache_length + start : cache_length + end] = causal[: end - start, : end - start]
            placements.append(Placement(index, start, continuation.cut, end - start))
            start = end
        placed.append(tuple(placements))
    return ContinuationBatch(input_ids, attention_mask, position_ids, tuple(placed))
