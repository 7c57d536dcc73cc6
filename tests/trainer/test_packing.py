"""Packed rows (`trainer_client.packing`, decision 075): a context run once for several continuations
scores each continuation exactly as it would be scored alone: a DPO pair's two actions, a rollout's
hinted turns for the SDPO teacher."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import MistralConfig, Qwen2Config

from env_server.models import ErrorKind
from tests.trainer.conftest import bash_call, build_batch, expected_pair_logps, make_config, make_trainer, preference_pairs, teacher_sequence
from trainer_client.hint_sites import TurnFailure, TurnReport, locate_hint_sites, teacher_row
from trainer_client.packing import Continuation, PackedRow, pack, takes_shared_prefixes
from trainer_client.records import PreferencePair


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_shared_prefix_scores_each_action_as_if_alone(tmp_path, tokenizer, base_model, attention: str) -> None:
    """One row per pair (the context run once, the rejected action masked from the chosen one) gives
    the log-probs and gradients of one row per sequence, and of each sequence run alone."""
    model = copy.deepcopy(base_model)
    model.set_attn_implementation(attention)
    longer = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in stats.py, then submit."},
    ]
    other = PreferencePair(state_id="long", messages=longer, chosen=bash_call("cat stats.py"), rejected=bash_call("rm -rf tests"))
    pairs = [*preference_pairs(), other]  # contexts and actions of different lengths: rows are padded
    trainer = make_trainer(model, tokenizer, make_config(tmp_path, dpo_weight=1.0), preference_pairs=pairs)
    assert trainer._shared_prefixes
    preferences, causal_lm = trainer._preferences, trainer.model
    indices = list(range(len(pairs)))

    def logps_and_gradients(shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        causal_lm.zero_grad()
        batch = preferences.collate(indices, tokenizer.pad_token_id, shared_prefix=shared)
        # packed: the three pairs of one context share a row (decision 078), the longer context has its own
        assert batch.input_ids.size(0) == (2 if shared else 2 * len(pairs))
        logps = trainer._sequence_logps(causal_lm, batch)
        (logps * torch.arange(1.0, logps.numel() + 1)).sum().backward()  # unequal weights: a leak shows in the gradients
        return logps.detach(), torch.cat([parameter.grad.flatten() for parameter in causal_lm.parameters()])

    shared, shared_gradients = logps_and_gradients(True)
    separate, separate_gradients = logps_and_gradients(False)
    torch.testing.assert_close(shared, separate, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shared.view(-1, 2), expected_pair_logps(causal_lm, preferences), rtol=1e-4, atol=1e-4)
    # equal up to float summation order (a rejected action that saw the chosen one differs by ~100%)
    assert (shared_gradients - separate_gradients).norm() < 1e-5 * separate_gradients.norm()


def test_models_that_slide_a_window_or_use_flash_attention_take_one_row_per_sequence() -> None:
    assert takes_shared_prefixes(Qwen2Config(_attn_implementation="sdpa"))
    assert not takes_shared_prefixes(Qwen2Config(_attn_implementation="flash_attention_2"))
    assert not takes_shared_prefixes(MistralConfig(_attn_implementation="sdpa"))  # sliding_window 4096


def test_a_rollouts_hint_sites_share_its_context_in_the_teacher(tmp_path, tokenizer, base_model) -> None:
    """Two sites of one rollout (turn 1's context holds turn 0 unhinted): one packed row gives each
    site's teacher logits from its own full forward."""
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    assert trainer._shared_prefixes
    inputs = build_batch(trainer, tokenizer, hinted=[True])
    prompt = inputs["prompt_ids"][0][inputs["prompt_mask"][0].bool()].tolist()
    completion = inputs["completion_ids"][0].tolist()
    mask = (inputs["completion_mask"][0] * inputs["tool_mask"][0]).tolist()
    reports = [
        TurnReport(1, (TurnFailure(ErrorKind.COMMAND_NOT_FOUND, "`pytset` is not a command."),)),
        TurnReport(0, (TurnFailure(ErrorKind.NO_TOOL_CALL, "Call a tool."),)),
    ]
    sites = locate_hint_sites(reports, mask, trainer._hint_template)
    assert [site.turn for site in sites] == [0, 1]
    row = teacher_row(prompt, completion, sites, trainer._hint_template.header_ids)
    batch = pack([row], tokenizer.pad_token_id, shared=True)
    assert batch.input_ids.size(0) == 1  # one row for both sites
    turns = [site.end - site.start for site in sites]
    with torch.no_grad():
        packed = trainer._teacher_logits([row], turns)
        expected = torch.cat(
            [
                trainer.model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - turn - 1 : -1]
                for sequence, turn in (
                    (teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids), turn)
                    for site, turn in zip(sites, turns, strict=True)
                )
            ]
        )
    torch.testing.assert_close(packed, expected, rtol=1e-4, atol=1e-4)


def test_a_packed_row_masks_each_continuation_from_the_others() -> None:
    row = PackedRow([10, 11, 12, 13], [Continuation(2, [20, 21]), Continuation(4, [30])])
    batch = pack([row], pad_token_id=0, shared=True)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 20, 21, 30]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 4]]  # each continuation goes on from its cut
    sees = batch.attention_mask[0].int().tolist()
    assert sees[4] == [1, 1, 0, 0, 1, 0, 0]  # cut at 2: the context before the cut and itself
    assert sees[5] == [1, 1, 0, 0, 1, 1, 0]
    assert sees[6] == [1, 1, 1, 1, 0, 0, 1]  # never the other continuation
    assert batch.predictors(0, 0) == [1, 4] and batch.predictors(0, 1) == [3]
    separate = pack([row], pad_token_id=0, shared=False)
    assert separate.input_ids.tolist() == [[10, 11, 20, 21, 0], [10, 11, 12, 13, 30]]
    assert separate.predictors(0, 0) == [1, 2] and separate.predictors(0, 1) == [3]
    assert batch.token_count() == 7 and separate.token_count() == 4 + 5  # padding left out
    with pytest.raises(ValueError):
        pack([PackedRow([10], [Continuation(0, [20])])], pad_token_id=0, shared=True)
