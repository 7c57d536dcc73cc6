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

Several contexts that share their first tokens (a DPO mini-batch: every pair opens with the same
system prompt and tools) make one row as a prefix tree (decision 079): the first context, then each
other one as a *branch* of the tokens past where it parts from the row's sequences (`add_context`);
continuations may follow a branch. A token sees what its segment follows and its segment's earlier
tokens.

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
    """Tokens that follow the first `cut` tokens of a sequence: the row's context, or one of its branches."""

    cut: int
    token_ids: Sequence[int]
    branch: int | None = None
    """Index in the row's `branches` of the branch whose sequence it follows; None: the context."""


@dataclass(frozen=True)
class PackedRow:
    """A context, branches off it, and the continuations to score."""

    context: Sequence[int]
    continuations: Sequence[Continuation]
    branches: Sequence[Continuation] = ()
    """Unscored extensions, each following the context or an earlier branch: other contexts that share
    their first tokens with this one (a prefix tree). A branch's sequence is what it follows, then its tokens."""

    def sequence(self, branch: int | None) -> list[int]:
        """The whole sequence of the context (None) or of a branch."""
        if branch is None:
            return list(self.context)
        extension = self.branches[branch]
        return [*self.sequence(extension.branch)[: extension.cut], *extension.token_ids]


class Placement(NamedTuple):
    """Where one continuation landed in a batch."""

    row: int
    """The batch row holding it."""
    start: int
    """Index of its first token in that row."""
    follows: int
    """Index of the token it follows, whose hidden state predicts its first token: in its batch row
    (`pack`), in the key-value cache (`pack_after_cache`)."""
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
    """`(rows, length)` position of each token in its own sequence."""
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
        ends: dict[int, int] = {}  # per batch row, where its last continuation ends (continuations are laid out last)
        for placements in self.placements:
            for placement in placements:
                ends[placement.row] = max(ends.get(placement.row, 0), placement.start + placement.length)
        return sum(ends.values())

    def predictors(self, row: int, continuation: int) -> list[int]:
        """Per token of a continuation, the index (in its batch row) whose hidden state predicts it:
        the token it follows for the first, the previous token for the others."""
        placement = self.placements[row][continuation]
        return [placement.follows, *range(placement.start, placement.start + placement.length - 1)]


def takes_shared_prefixes(config: Any) -> bool:
    """Whether a model runs a packed batch as it runs each sequence alone: its attention adds a custom
    4D mask (eager, SDPA) and no layer slides a window, which that mask would override."""
    return (
        config._attn_implementation in ("eager", "sdpa")
        and getattr(config, "sliding_window", None) is None
        and "sliding_attention" not in (getattr(config, "layer_types", None) or ())
    )


def _check_rows(rows: Sequence[PackedRow]) -> None:
    for row in rows:
        if not row.continuations:
            raise ValueError("a packed row needs a continuation to score")
        for number, follower in enumerate((*row.branches, *row.continuations)):
            if follower.branch is None:
                first, last = 0, len(row.context)
            elif not 0 <= follower.branch < min(number, len(row.branches)):
                raise ValueError("a branch or continuation can only follow an earlier branch")
            else:  # it follows at least one of the branch's own tokens, or it would follow what the branch follows
                first, last = row.branches[follower.branch].cut, len(row.sequence(follower.branch))
            if not first < follower.cut <= last or not follower.token_ids:
                raise ValueError("a continuation must follow a non-empty part of its sequence and hold tokens")


Spans = tuple[tuple[int, int], ...]
"""`(start, count)` runs of a row's indices that hold a sequence, in order."""


def _first(spans: Spans, count: int) -> Spans:
    """The runs that hold the first `count` tokens of `spans`' sequence."""
    taken = []
    for start, length in spans:
        if count <= 0:
            break
        taken.append((start, min(length, count)))
        count -= length
    return tuple(taken)


class _Segment(NamedTuple):
    """Tokens laid out one after another in a batch row."""

    token_ids: Sequence[int]
    position: int
    """Position of its first token in its sequence."""
    sees: Spans
    """What its tokens see besides its own earlier tokens: the runs of what it follows."""
    scored: bool


def _shared_segments(row: PackedRow) -> list[_Segment]:
    """The row as a prefix tree: the context as far as anything follows it, each branch, each continuation."""
    context = row.context[: max(f.cut for f in (*row.branches, *row.continuations) if f.branch is None)]
    segments = [_Segment(context, 0, (), False)]
    paths: list[Spans] = []  # per branch, the runs of its whole sequence
    start = len(context)
    for follower, scored in [*((b, False) for b in row.branches), *((c, True) for c in row.continuations)]:
        sees = _first(((0, len(context)),) if follower.branch is None else paths[follower.branch], follower.cut)
        segments.append(_Segment(follower.token_ids, follower.cut, sees, scored))
        if not scored:
            paths.append((*sees, (start, len(follower.token_ids))))
        start += len(follower.token_ids)
    return segments


def _own_segments(row: PackedRow, continuation: Continuation) -> list[_Segment]:
    """One continuation after its whole prefix."""
    prefix = row.sequence(continuation.branch)[: continuation.cut]
    return [_Segment(prefix, 0, (), False), _Segment(continuation.token_ids, continuation.cut, ((0, len(prefix)),), True)]


def pack(rows: Sequence[PackedRow], pad_token_id: int, *, shared: bool) -> PackedBatch:
    """Lay `rows` out as one batch: each packed (`shared`), or one row per continuation."""
    _check_rows(rows)
    layouts = [_shared_segments(row) for row in rows] if shared else [_own_segments(row, c) for row in rows for c in row.continuations]
    length = max(sum(len(segment.token_ids) for segment in layout) for layout in layouts)
    input_ids = torch.full((len(layouts), length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(layouts), length), dtype=torch.long)
    sees = torch.zeros((len(layouts), length, length), dtype=torch.bool) if shared else None
    real = torch.zeros((len(layouts), length), dtype=torch.long)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    placed: list[Placement] = []
    for batch_row, layout in enumerate(layouts):
        start = 0
        for segment in layout:
            end = start + len(segment.token_ids)
            input_ids[batch_row, start:end] = torch.tensor(list(segment.token_ids), dtype=torch.long)
            position_ids[batch_row, start:end] = torch.arange(segment.position, segment.position + end - start)
            real[batch_row, start:end] = 1
            if sees is not None:
                sees[batch_row, start:end, start:end] = causal[: end - start, : end - start]
                for seen, count in segment.sees:
                    sees[batch_row, start:end, seen : seen + count] = True
            if segment.scored:
                last_seen, count = segment.sees[-1]
                placed.append(Placement(batch_row, start, last_seen + count - 1, end - start))
            start = end
    cursor = iter(placed)  # continuations were placed in the order given, packed or not
    placements = tuple(tuple(next(cursor) for _ in row.continuations) for row in rows)
    return PackedBatch(input_ids, real if sees is None else sees, position_ids, placements)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens `a` and `b` share."""
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def shares_enough(row: PackedRow, context: Sequence[int]) -> bool:
    """Whether `context` shares at least half of the shorter of itself and one of `row`'s sequences.

    Joining a row always runs fewer tokens than a row of its own; the bound is for the attention, which
    a dense mask makes cost the square of a row's length: contexts that share little (different system
    prompts) keep rows of their own.
    """
    for branch in (None, *range(len(row.branches))):
        sequence = row.sequence(branch)
        if 2 * common_prefix_length(sequence, context) >= min(len(sequence), len(context)):
            return True
    return False


def add_context(row: PackedRow, context: Sequence[int], continuations: Sequence[Sequence[int]]) -> PackedRow:
    """`row` with `context` added as a branch where it parts from the row's sequences (no branch where
    it ends inside one), and `continuations` after it. `context` must share its first token with the row."""
    owners = (None, *range(len(row.branches)))
    shared, owner = max((common_prefix_length(row.sequence(branch), context), -number) for number, branch in enumerate(owners))
    owner_branch = owners[-owner]
    if shared == 0:
        raise ValueError("a context shares no first token with the row")
    while owner_branch is not None and shared <= row.branches[owner_branch].cut:
        owner_branch = row.branches[owner_branch].branch  # the shared part ends before this branch's own tokens
    branches = list(row.branches)
    if shared < len(context):
        branches.append(Continuation(shared, context[shared:], owner_branch))
        owner_branch = len(branches) - 1
    added = [Continuation(len(context), tokens, owner_branch) for tokens in continuations]
    return PackedRow(row.context, [*row.continuations, *added], branches)


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
    if any(row.branches for row in rows):
        raise ValueError("a row after a cache takes no branches: its context is the cache's")
    _check_rows(rows)
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
            placements.append(Placement(index, start, cut - 1, end - start))
            start = end
        placed.append(tuple(placements))
    return ContinuationBatch(input_ids, attention_mask, position_ids, tuple(placed))
