"""SDPO and DPO logits go through the model's own output path (softcapping, logit scaling), not a raw
`lm_head` projection: checked against `model(...).logits` on tiny random models of families that
transform their logits."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config, GraniteConfig

from tests.trainer.conftest import alone, build_batch, expected_pair_logps, make_config, make_trainer, preference_pairs, teacher_sequence
from trainer_client.output_head import output_logits

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


def test_dpo_log_probs_are_the_models_own(tmp_path, tokenizer, softcapped) -> None:
    trainer = make_trainer(softcapped, tokenizer, make_config(tmp_path, dpo_weight=1.0), preference_pairs=preference_pairs())
    assert not trainer.shared_prefixes  # Gemma 2 slides a window in every other layer: one row per sequence
    preferences = trainer.dpo.preferences
    expected = expected_pair_logps(trainer.model, preferences)
    torch.testing.assert_close(trainer.dpo.reference_logps(), expected, rtol=1e-4, atol=1e-4)


def test_sdpo_student_and_teacher_logits_are_the_models_own(tmp_path, tokenizer, softcapped) -> None:
    trainer = make_trainer(softcapped, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    inputs = build_batch(trainer, tokenizer, hinted=[True, False])
    (site,) = inputs["hint_sites"][0]
    prompt = inputs["prompt_ids"][0].tolist()
    completion = inputs["completion_ids"][0].tolist()
    turn = site.end - site.start
    sequence = teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids)
    with torch.no_grad():
        teacher = trainer.sdpo.teacher_logits([alone(sequence)], [turn])
        expected = trainer.model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - turn - 1 : -1]
    torch.testing.assert_close(teacher, expected, rtol=1e-4, atol=1e-4)
    # With no hint the teacher reads the student's context: the student's logits (from GRPO's forward)
    # must then be the same, so the divergence vanishes.
    inputs["hint_sites"] = [[dataclasses.replace(site, hint_ids=())], []]
    trainer.model.train()
    trainer.compute_loss(trainer.model, inputs)
    assert trainer._metrics["train"]["sdpo/jsd"][-1] == pytest.approx(0.0, abs=1e-5)
