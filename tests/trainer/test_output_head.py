"""SDPO and DPO logits go through the model's own output path (softcapping, logit scaling), not a raw
`lm_head` projection: checked against `model(...).logits` on tiny random models of families that
transform their logits."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config, GraniteConfig, MistralConfig, Qwen2Config

from tests.trainer.conftest import build_batch, make_config, make_trainer, preference_pairs
from trainer_client.hint_sites import teacher_sequence
from trainer_client.output_head import output_logits
from trainer_client.records import PreferencePair
from trainer_client.trainer import takes_shared_prefixes

SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


def tiny(config: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def gemma2(vocab_size: int) -> torch.nn.Module:
    return tiny(Gemma2Config(vocab_size=vocab_size, head_dim=16, final_logit_softcapping=0.5, initializer_range=0.5, **SHAPE))


FAMILIES = {
    "gemma2-softcapping": gemma2,
    "granite-logits-scaling": lambda v: tiny(GraniteConfig(vocab_size=v, logits_scaling=8.0, initializer_range=0.5, **SHAPE)),
    "cohere-logit-scale": lambda v: tiny(CohereConfig(vocab_size=v, logit_scale=4.0, initializer_range=0.5, **SHAPE)),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_output_logits_are_the_models_logits_at_the_given_positions(family: str) -> None:
    model = FAMILIES[family](96)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        hidden = model.base_model(input_ids=ids).last_hidden_state
        rows, positions = torch.tensor([0, 0, 1]), torch.tensor([2, 6, 3])
        logits = output_logits(model, hidden[rows, positions])
        raw = model.get_output_embeddings()(hidden[rows, positions])
    torch.testing.assert_close(logits, full[rows, positions])
    assert (raw - logits).abs().max() > 0.1  # the family does transform its logits: a raw projection is wrong
    assert "forward" not in vars(model.base_model)  # the backbone answers normally again


@pytest.fixture(scope="module")
def softcapped(tokenizer: Any) -> torch.nn.Module:
    return gemma2(len(tokenizer))


def bash_call(command: str) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def full_forward_logps(model: torch.nn.Module, context: tuple[int, ...], action: tuple[int, ...]) -> torch.Tensor:
    """The summed log-prob of `action` after `context`, from the model's own full forward."""
    ids = torch.tensor([[*context, *action]])
    logits = model(input_ids=ids).logits[0, len(context) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(action)[:, None]).sum()


def expected_pair_logps(model: torch.nn.Module, preferences: Any) -> torch.Tensor:
    with torch.no_grad():
        return torch.tensor(
            [
                [full_forward_logps(model, pair.context_ids, action) for action in (pair.chosen_ids, pair.rejected_ids)]
                for pair in preferences.pairs
            ]
        )


def test_dpo_log_probs_are_the_models_own(tmp_path, tokenizer, softcapped) -> None:
    trainer = make_trainer(softcapped, tokenizer, make_config(tmp_path, dpo_weight=1.0), preference_pairs=preference_pairs())
    assert not trainer._dpo_shared_prefix  # Gemma 2 slides a window in every other layer: one row per sequence
    preferences = trainer._preferences
    expected = expected_pair_logps(trainer.model, preferences)
    torch.testing.assert_close(trainer._reference_logps(preferences), expected, rtol=1e-4, atol=1e-4)


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
    assert trainer._dpo_shared_prefix
    preferences, causal_lm = trainer._preferences, trainer.model
    indices = list(range(len(pairs)))

    def logps_and_gradients(shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        causal_lm.zero_grad()
        batch = preferences.collate(indices, tokenizer.pad_token_id, shared_prefix=shared)
        assert batch.input_ids.size(0) == len(pairs) * (1 if shared else 2)
        logps = trainer._sequence_logps(causal_lm, batch)
        (logps * torch.arange(1.0, logps.numel() + 1)).sum().backward()  # unequal weights: a leak shows in the gradients
        return logps.detach(), torch.cat([parameter.grad.flatten() for parameter in causal_lm.parameters()])

    shared, shared_gradients = logps_and_gradients(True)
    separate, separate_gradients = logps_and_gradients(False)
    torch.testing.assert_close(shared, separate, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shared.view(2, -1).T, expected_pair_logps(causal_lm, preferences), rtol=1e-4, atol=1e-4)
    # equal up to float summation order (a rejected action that saw the chosen one differs by ~100%)
    assert (shared_gradients - separate_gradients).norm() < 1e-5 * separate_gradients.norm()


def test_models_that_slide_a_window_or_use_flash_attention_take_one_row_per_sequence() -> None:
    assert takes_shared_prefixes(Qwen2Config(_attn_implementation="sdpa"))
    assert not takes_shared_prefixes(Qwen2Config(_attn_implementation="flash_attention_2"))
    assert not takes_shared_prefixes(MistralConfig(_attn_implementation="sdpa"))  # sliding_window 4096


def test_sdpo_student_and_teacher_logits_are_the_models_own(tmp_path, tokenizer, softcapped) -> None:
    trainer = make_trainer(softcapped, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    inputs = build_batch(trainer, tokenizer, hinted=[True, False])
    (site,) = inputs["hint_sites"][0]
    prompt = inputs["prompt_ids"][0].tolist()
    completion = inputs["completion_ids"][0].tolist()
    turn = site.end - site.start
    sequence = teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids)
    with torch.no_grad():
        teacher = trainer._teacher_logits([sequence], [turn])
        expected = trainer.model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - turn - 1 : -1]
    torch.testing.assert_close(teacher, expected, rtol=1e-4, atol=1e-4)
    # With no hint the teacher reads the student's context: the student's logits (from GRPO's forward)
    # must then be the same, so the divergence vanishes.
    inputs["hint_sites"] = [[dataclasses.replace(site, hint_ids=())], []]
    trainer.model.train()
    trainer.compute_loss(trainer.model, inputs)
    assert trainer._metrics["train"]["sdpo/jsd"][-1] == pytest.approx(0.0, abs=1e-5)
