"""ComposerTrainer's loss on constructed rollouts: GRPO parity, the SDPO and DPO channels, alignment."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tests.trainer.conftest import alone, build_batch, make_config, make_trainer, preference_pairs, teacher_sequence
from trainer_client.cpu_logprob_tiles import cpu_logprob_tiles
from trainer_client.packing import common_prefix_length


def loss_and_grads(trainer: Any, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainer.model.zero_grad()
    torch.manual_seed(0)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_zero_weights_reproduce_trl_grpo_exactly(tmp_path, tokenizer, base_model) -> None:
    composer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=0.0, dpo_weight=0.0))
    plain = make_trainer(base_model, tokenizer, make_config(tmp_path, GRPOConfig), trainer_class=GRPOTrainer)
    inputs = build_batch(composer, tokenizer, hinted=[True, False])
    composer_loss, composer_grads = loss_and_grads(composer, inputs)
    plain_inputs = {k: v for k, v in inputs.items() if k not in ("hint_sites", "hint_tokens")}
    with cpu_logprob_tiles(torch.device("cpu")):  # the tiles ComposerTrainer scores in on the CPU: the same sums, in the same order
        plain_loss, plain_grads = loss_and_grads(plain, plain_inputs)
    assert torch.equal(composer_loss, plain_loss)
    assert composer_grads.keys() == plain_grads.keys() and composer_grads
    for name, grad in composer_grads.items():
        assert torch.equal(grad, plain_grads[name]), name


def test_hint_sites_give_an_sdpo_loss_and_every_parameter_a_finite_gradient(tmp_path, tokenizer, base_model) -> None:
    config = make_config(tmp_path, sdpo_weight=1.0, dpo_weight=0.5, dpo_batch_size=2)
    trainer = make_trainer(base_model, tokenizer, config, preference_pairs=preference_pairs())
    inputs = build_batch(trainer, tokenizer, hinted=[True, False])
    assert [len(s) for s in inputs["hint_sites"]] == [1, 0]
    _, grads = loss_and_grads(trainer, inputs)
    metrics = trainer._metrics["train"]
    assert metrics["sdpo/loss"][-1] > 0
    assert metrics["sdpo/hint_tokens"][-1] == inputs["hint_tokens"].item()
    # Before any update the policy is its own reference: every margin is 0, no pair is won (strict >),
    # and the loss of each pair is -log(sigmoid(0)) = ln 2.
    assert metrics["dpo/accuracy"][-1] == 0.0 and metrics["dpo/loss"][-1] == pytest.approx(math.log(2))
    # The DPO forward's tokens (the pairs' one context once, both actions of each), less the head the context
    # shares with the rollouts' prompt (read from GRPO's forward), over the tokens of GRPO's forward.
    pairs = trainer.dpo.collate([0, 1])  # the three pairs are one context
    context = trainer.dpo.preferences.pairs[0].context_ids
    head = common_prefix_length(inputs["prompt_ids"][0].tolist(), context)
    assert 0 < head < len(context) and pairs.input_ids.size(0) == 1
    policy_tokens = (inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()).item()
    assert metrics["dpo/token_share"][-1] == pytest.approx((pairs.token_count() - head) / policy_tokens)
    for name, param in trainer.model.named_parameters():
        assert name in grads, f"{name} got no gradient"
        assert torch.isfinite(grads[name]).all(), name


def test_no_hint_sites_means_no_sdpo_term(tmp_path, tokenizer, base_model) -> None:
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    inputs = build_batch(trainer, tokenizer, hinted=[False, False])
    assert inputs["hint_sites"] == [[], []]
    calls = []
    trainer.sdpo.teacher_logits = lambda *a: calls.append(a)  # the teacher must not even run
    loss_and_grads(trainer, inputs)
    assert trainer._metrics["train"]["sdpo/loss"] == [0.0]
    assert calls == []


def test_student_and_teacher_score_the_same_tokens_position_by_position(tmp_path, tokenizer, base_model) -> None:
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    inputs = build_batch(trainer, tokenizer, hinted=[True])
    (site,) = inputs["hint_sites"][0]
    prompt = inputs["prompt_ids"][0][inputs["prompt_mask"][0].bool()].tolist()
    completion = inputs["completion_ids"][0].tolist()
    teacher = teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids)
    turn = completion[site.start : site.end]
    assert teacher[len(teacher) - len(turn) :] == turn
    assert tokenizer.decode(turn).startswith("<tool_call>")
    # The hint message sits right before the assistant header that opens turn k.
    before_turn = tokenizer.decode(teacher[: len(teacher) - len(turn)])
    assert before_turn.endswith("<|im_start|>user\nHint: `pytset` is not a command; did you mean `pytest`?<|im_end|>\n<|im_start|>assistant\n")

    # With an empty hint the teacher reads the student's exact context, so its logits at the site
    # must equal the student's logits at the site token by token.
    empty = dataclasses.replace(site, hint_ids=())
    model = trainer.model
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        student_logits = model.lm_head(model.model(input_ids=ids, attention_mask=mask).last_hidden_state)[0]
        p = inputs["prompt_ids"].size(1)
        student_at_site = student_logits[p + site.start - 1 : p + site.end - 1]
        teacher_logits = trainer.sdpo.teacher_logits([alone(teacher_sequence(prompt, completion, empty, trainer._hint_template.header_ids))], [len(turn)])
    assert teacher_logits.shape == student_at_site.shape
    torch.testing.assert_close(teacher_logits, student_at_site, rtol=1e-4, atol=1e-4)
    # and the argmax prediction of each position agrees token by token
    assert teacher_logits.argmax(-1).tolist() == student_at_site.argmax(-1).tolist()


def test_sdpo_term_is_a_token_mean_across_gradient_accumulation(tmp_path, tokenizer, base_model) -> None:
    """Two micro-steps of one optimizer step add up to the loss of the whole generation batch."""
    whole = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0, per_device_train_batch_size=4, num_generations=2))
    inputs = build_batch(whole, tokenizer, hinted=[True, True, False, True])
    whole_loss = whole.sdpo.loss(whole.model, inputs, _hidden(whole, inputs))

    split = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0, gradient_accumulation_steps=2, steps_per_generation=2))
    halves = [{k: (v[i : i + 2] if k not in ("hint_tokens", "num_items_in_batch") else v) for k, v in inputs.items()} for i in (0, 2)]
    split_loss = sum(split.sdpo.loss(split.model, half, _hidden(split, half)) for half in halves)
    torch.testing.assert_close(split_loss, whole_loss)


def _hidden(trainer: Any, inputs: dict) -> torch.Tensor:
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    return trainer.model.model(input_ids=ids, attention_mask=mask).last_hidden_state


def test_dpo_reference_log_probs_are_computed_at_the_first_dpo_loss_and_kept(tmp_path, tokenizer, base_model) -> None:
    """Not in `__init__`: a model sharded by `accelerator.prepare` (ZeRO-3, FSDP) can only run after it."""
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, dpo_weight=1.0, dpo_batch_size=3), preference_pairs=preference_pairs())
    assert trainer.dpo.preferences.reference_logps is None
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    # at the reference weights the implicit rewards are zero: margin 0
    assert trainer._metrics["train"]["dpo/margin"][-1] == pytest.approx(0.0, abs=1e-5)
    reference = trainer.dpo.preferences.reference_logps.clone()
    assert reference.shape == (3, 2) and torch.isfinite(reference).all()
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(0.01)
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    assert torch.equal(trainer.dpo.preferences.reference_logps, reference)
    assert trainer._metrics["train"]["dpo/margin"][-1] != pytest.approx(0.0, abs=1e-5)
