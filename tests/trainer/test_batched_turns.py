"""Batched turns that resume from per-conversation KV caches: each row's cache is exactly its own
conversation's, as a forward over that conversation alone computes it, on a real (tiny) model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainer_client.batched_turns import generate_turns
from trainer_client.policy import load_policy


@pytest.fixture(scope="module")
def model() -> Any:
    model, _ = load_policy("tiny-random")
    return model.eval()


def alone(model: Any, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (keys, values) of one conversation read on its own, with no padding."""
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([tokens]), use_cache=True).past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def assert_cache_is_the_conversations(model: Any, cache: Any, tokens: list[int]) -> None:
    assert cache.get_seq_length() == len(tokens)
    for layer, (keys, values) in zip(cache.layers, alone(model, tokens)):
        torch.testing.assert_close(layer.keys, keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer.values, values, atol=1e-4, rtol=1e-4)


def test_each_rows_cache_is_its_own_conversations_across_turns(model: Any) -> None:
    generator = torch.Generator().manual_seed(0)
    contexts = [torch.randint(10, 1000, (n,), generator=generator).tolist() for n in (7, 19, 12)]
    eos = 1
    first = generate_turns(model, contexts, [None] * 3, [3, 5, 4], pad_token_id=0, eos_token_id=eos, do_sample=False)
    for context, turn, limit in zip(contexts, first, [3, 5, 4]):
        assert 1 <= len(turn.tokens) <= limit
        assert eos not in turn.tokens[:-1]
        assert_cache_is_the_conversations(model, turn.cache, context + turn.tokens[:-1])

    # The next turn: each context grows by its turn and a "tool result" of its own length.
    contexts = [context + turn.tokens + [500 + i] * (2 + 3 * i) for i, (context, turn) in enumerate(zip(contexts, first))]
    second = generate_turns(model, contexts, [turn.cache for turn in first], [4, 4, 4], pad_token_id=0, eos_token_id=eos, do_sample=False)
    for context, turn in zip(contexts, second):
        assert_cache_is_the_conversations(model, turn.cache, context + turn.tokens[:-1])
        # Greedy from the batch equals greedy of the conversation alone.
        with torch.no_grad():
            own = model.generate(input_ids=torch.tensor([context]), max_new_tokens=len(turn.tokens), do_sample=False, pad_token_id=0, eos_token_id=eos)
        assert own[0, len(context) :].tolist() == turn.tokens


def test_a_row_whose_cache_covers_its_whole_context_feeds_its_last_token_again(model: Any) -> None:
    context = list(range(20, 40))
    (turn,) = generate_turns(model, [context], [None], [3], pad_token_id=0, eos_token_id=1, do_sample=False)
    covered = context + turn.tokens[:-1]
    assert turn.cache.get_seq_length() == len(covered)
    (again,) = generate_turns(model, [covered], [turn.cache], [1], pad_token_id=0, eos_token_id=1, do_sample=False)
    assert again.tokens == turn.tokens[-1:]  # greedy: the same token as before
    assert_cache_is_the_conversations(model, again.cache, covered)
