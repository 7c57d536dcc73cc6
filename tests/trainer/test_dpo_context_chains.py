"""DPO pairs taken at consecutive states of one trace (decision 078): each state's context extends the
one before, so the sampler draws a mini-batch from such a chain and one row runs the longest context
once, every action still scored exactly as it would be alone. Pairs of different traces share their
system prompt in a prefix-tree row (decision 079)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.trainer.conftest import bash_call, expected_pair_logps, make_config, make_trainer
from trainer_client.preferences import PreferenceBatches, context_chains
from trainer_client.records import PreferencePair


def trace_pairs(traces: int, states: int) -> list[PreferencePair]:
    """A pair at each of the first `states` states of `traces` traces (state k: the history after k
    exchanges), listed state by state across traces, so that no two states of a trace are neighbours."""
    histories = [
        [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"Fix bug {trace} in stats.py."}]
        for trace in range(traces)
    ]
    pairs = []
    for state in range(states):
        for trace, history in enumerate(histories):
            pairs.append(PreferencePair(
                state_id=f"t{trace}/s{state}", messages=list(history),
                chosen=bash_call("python3 -m pytest -q"), rejected=bash_call(f"pytset -q {state}"),
            ))
            history += [bash_call(f"cat part{state}.py"), {"role": "tool", "content": f"def part{state}():\n    return {state}\n"}]
    return pairs


def trace_of(preferences: PreferenceBatches, index: int, pairs: list[PreferencePair]) -> str:
    return pairs[preferences.pair_ids[index]].state_id.split("/")[0]


def test_context_chains_follow_extensions_and_cover_every_context_once() -> None:
    contexts = [(1, 2, 3), (1, 2), (5,), (1, 2, 3, 4), (1, 2, 9), (5, 6)]
    # (1, 2, 9) extends (1, 2) but branches off (1, 2, 3): a chain of its own
    assert context_chains(contexts) == [[1, 0, 3], [4], [2, 5]]
    assert context_chains([(7, 7), (7, 7)]) == [[0, 1]]  # one state replayed twice
    assert context_chains([]) == []


def test_a_mini_batch_is_drawn_from_one_trace_and_each_pass_serves_every_pair_once(tokenizer: Any) -> None:
    pairs = trace_pairs(traces=3, states=2)
    grouped = PreferenceBatches(pairs, tokenizer, batch_size=2, max_length=4096, seed=3)
    passes = [[grouped.next_indices() for _ in range(3)] for _ in range(4)]
    for batches in passes:
        assert sorted(index for batch in batches for index in batch) == list(range(len(pairs)))
        for first, second in batches:  # two states of one trace, the earlier first
            assert trace_of(grouped, first, pairs) == trace_of(grouped, second, pairs)
            assert len(grouped.pairs[first].context_ids) < len(grouped.pairs[second].context_ids)
    assert len({tuple(map(tuple, batches)) for batches in passes}) > 1  # the traces' order is reshuffled

    shuffled = PreferenceBatches(pairs, tokenizer, batch_size=2, max_length=4096, seed=3, group_by_context=False)
    draws = [shuffled.next_indices() for _ in range(12)]
    assert any(trace_of(shuffled, a, pairs) != trace_of(shuffled, b, pairs) for a, b in draws)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_one_row_runs_a_traces_context_once_and_scores_each_action_as_if_alone(
    tmp_path, tokenizer, base_model, attention: str
) -> None:
    model = copy.deepcopy(base_model)
    model.set_attn_implementation(attention)
    pairs = trace_pairs(traces=2, states=3)
    trainer = make_trainer(model, tokenizer, make_config(tmp_path, dpo_weight=1.0, dpo_batch_size=3), preference_pairs=pairs)
    preferences, causal_lm = trainer.dpo.preferences, trainer.model
    assert trainer.shared_prefixes
    chain = preferences.next_indices()
    assert len({trace_of(preferences, index, pairs) for index in chain}) == 1

    def logps_and_gradients(shared: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
        causal_lm.zero_grad()
        batch = preferences.collate(chain, tokenizer.pad_token_id, shared_prefix=shared)
        logps = trainer.dpo.sequence_logps(causal_lm, batch)
        (logps * torch.arange(1.0, logps.numel() + 1)).sum().backward()  # unequal weights: a leak shows in the gradients
        gradients = torch.cat([parameter.grad.flatten() for parameter in causal_lm.parameters()])
        return logps.detach(), gradients, batch.token_count()

    shared, shared_gradients, shared_tokens = logps_and_gradients(True)
    separate, separate_gradients, separate_tokens = logps_and_gradients(False)
    contexts = [preferences.pairs[index].context_ids for index in chain]
    actions = sum(len(preferences.pairs[i].chosen_ids) + len(preferences.pairs[i].rejected_ids) for i in chain)
    assert shared_tokens == len(contexts[-1]) + actions  # the longest context, once
    assert separate_tokens == 2 * sum(map(len, contexts)) + actions
    torch.testing.assert_close(shared, separate, rtol=1e-4, atol=1e-4)
    assert (shared_gradients - separate_gradients).norm() < 1e-5 * separate_gradients.norm()

    # the cached reference log-probs, computed chain by chain, are each pair's own full forward's
    reference = trainer.dpo.reference_logps()
    torch.testing.assert_close(reference, expected_pair_logps(causal_lm, preferences), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(reference[chain], shared.view(-1, 2), rtol=1e-4, atol=1e-4)


def test_pairs_of_different_tasks_share_their_head_and_other_system_prompts_keep_rows_of_their_own(tokenizer: Any) -> None:
    """Decision 079: the row is a prefix tree, every distinct prefix of the contexts run once."""
    pairs = trace_pairs(traces=3, states=1)  # three tasks: no context extends another, all share the system prompt
    stranger = [{"role": "system", "content": "You review pull requests for style. " * 8}, {"role": "user", "content": "Review."}]
    pairs.append(PreferencePair(state_id="review", messages=stranger, chosen=bash_call("git diff"), rejected=bash_call("ls")))
    preferences = PreferenceBatches(pairs, tokenizer, batch_size=4, max_length=4096)
    batch = preferences.collate([0, 1, 2, 3], tokenizer.pad_token_id, shared_prefix=True)
    assert batch.input_ids.size(0) == 2
    contexts = [preferences.pairs[index].context_ids for index in range(3)]
    distinct_prefixes = len({context[:end] for context in contexts for end in range(1, len(context) + 1)})
    assert distinct_prefixes < sum(map(len, contexts))
    actions = sum(len(pair.chosen_ids) + len(pair.rejected_ids) for pair in preferences.pairs)
    assert batch.token_count() == distinct_prefixes + len(preferences.pairs[3].context_ids) + actions


def test_the_config_switches_the_sampler(tmp_path, tokenizer, base_model) -> None:
    pairs = trace_pairs(traces=2, states=2)
    for grouped, chains in ((True, 2), (False, 4)):
        config = make_config(tmp_path, dpo_weight=1.0, dpo_group_by_context=grouped)
        assert len(make_trainer(base_model, tokenizer, config, preference_pairs=pairs).dpo.preferences.chains) == chains
