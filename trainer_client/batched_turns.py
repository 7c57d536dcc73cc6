"""One assistant turn for many conversations at once, each resuming from its own KV cache.

A multi-turn episode re-reads nothing it has read before if it keeps its KV cache between turns; a
batch of episodes decodes many sequences for about the price of one. Both at once need the caches,
which have different lengths, in one batch: each row is laid out as

    [pad .. pad | cached tokens | pad .. pad | tokens new since the cache]

with the pads masked out. `generate` numbers positions by the attention mask (a row's real tokens are
0, 1, 2, ... whatever padding sits between them), which is how every cache here was computed, so a
row's logits are those of its conversation alone. Afterwards each row's cache is cut back out of the
batch: its real columns, up to the last token it generated (`generate` leaves the final token out of
the cache; the next turn feeds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache


@dataclass
class Turn:
    """What one conversation's row generated."""

    tokens: list[int]
    """The new turn, through its first end-of-turn token, cut to the row's limit."""
    cache: DynamicCache | None
    """KV cache of the conversation's context plus `tokens[:-1]` (None when the model returns none)."""


def _cached_length(cache: DynamicCache | None, context_length: int) -> int:
    """Cached tokens a row reuses: at least one context token must be fed to get the next token's logits."""
    return min(cache.get_seq_length(), context_length - 1) if cache is not None else 0


def _batch_cache(caches: list[DynamicCache | None], lengths: list[int], width: int) -> DynamicCache | None:
    """The rows' caches cut to `lengths` and left-padded with zeros to `width` columns, in one cache."""
    reference = next((cache for cache, n in zip(caches, lengths) if cache is not None and n > 0), None)
    if reference is None:
        return None
    batched = DynamicCache()
    for index, layer in enumerate(reference.layers):
        keys, values = [], []
        for cache, n in zip(caches, lengths):
            for part, out in (("keys", keys), ("values", values)):
                like = getattr(layer, part)
                padded = like.new_zeros((1, like.shape[1], width, like.shape[3]))
                if n:
                    padded[:, :, width - n :] = getattr(cache.layers[index], part)[:, :, :n]
                out.append(padded)
        batched.update(torch.cat(keys), torch.cat(values), index)
    return batched


def _row_cache(cache: Any, row: int, columns: torch.Tensor) -> DynamicCache | None:
    """One row's cache: the given columns of the batch's cache."""
    if not isinstance(cache, DynamicCache):
        return None
    own = DynamicCache()
    for index, layer in enumerate(cache.layers):
        own.update(layer.keys[row : row + 1, :, columns], layer.values[row : row + 1, :, columns], index)
    return own


def generate_turns(
    model: Any,
    contexts: Sequence[Sequence[int]],
    caches: Sequence[DynamicCache | None],
    limits: Sequence[int],
    *,
    pad_token_id: int,
    eos_token_id: int,
    **sampling: Any,
) -> list[Turn]:
    """The next turn of every conversation, sampled in one batch.

    Args:
        model: A causal LM whose `generate` numbers positions by the attention mask (transformers >= 5).
        contexts: Each conversation's tokens so far (non-empty).
        caches: Each conversation's cache of a prefix of its context (as a previous call returned it), or None.
        limits: Tokens each row may generate (>= 1).
        pad_token_id: Fills the layout's gaps (masked out).
        eos_token_id: Ends a turn.
        sampling: `do_sample`, `temperature` and the like, passed to `generate`.
    """
    cached = [_cached_length(cache, len(context)) for cache, context in zip(caches, contexts)]
    new = [list(context[n:]) for context, n in zip(contexts, cached)]
    width, span = max(cached), max(map(len, new))
    rows, masks = [], []
    for context, n, tokens in zip(contexts, cached, new):
        gap_before, gap_after = width - n, span - len(tokens)
        rows.append([pad_token_id] * gap_before + list(context[:n]) + [pad_token_id] * gap_after + tokens)
        masks.append([0] * gap_before + [1] * n + [0] * gap_after + [1] * len(tokens))
    device = model.device
    input_ids, attention_mask = torch.tensor(rows, device=device), torch.tensor(masks, device=device)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=_batch_cache(list(caches), cached, width),
            max_new_tokens=max(limits),
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            return_dict_in_generate=True,
            **sampling,
        )
    generated = output.sequences[:, width + span :].tolist()
    turns = []
    for row, (context, limit) in enumerate(zip(contexts, limits)):
        tokens = generated[row][:limit]
        if eos_token_id in tokens:
            tokens = tokens[: tokens.index(eos_token_id) + 1]
        # The row's real columns, in order: its context, then every token it generated but the last.
        real = torch.cat([attention_mask[row], torch.ones(len(generated[row]), dtype=attention_mask.dtype, device=device)])
        columns = real.nonzero().squeeze(1)[: len(context) + len(tokens) - 1]
        turns.append(Turn(tokens, _row_cache(output.past_key_values, row, columns)))
    return turns
