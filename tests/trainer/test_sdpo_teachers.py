"""The SDPO teachers besides the live policy: an EMA copy of the policy and the frozen PEFT base.

Constructed batches and a tiny random model, as in test_trainer_losses.py; no service needed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from peft import LoraConfig

from tests.trainer.conftest import alone, build_batch, make_config, make_trainer, teacher_sequence
from trainer_client.losses import generalized_jsd


def hinted_teacher_input(trainer: Any, inputs: dict) -> tuple[list[int], int]:
    """The teacher's token sequence for the batch's first hint site, and the length of its turn."""
    (site,) = inputs["hint_sites"][0]
    prompt = inputs["prompt_ids"][0][inputs["prompt_mask"][0].bool()].tolist()
    completion = inputs["completion_ids"][0].tolist()
    return teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids), site.end - site.start


@torch.no_grad()
def logits_predicting_last_tokens(model: torch.nn.Module, sequence: list[int], count: int) -> torch.Tensor:
    """A full forward of `model`; the logits of the positions that predict the last `count` tokens."""
    return model(input_ids=torch.tensor([sequence])).logits[0, -count - 1 : -1]


# ----------------------------------------------------------------- ema


def test_ema_teacher_follows_the_policy_by_ema_after_an_optimizer_step(tmp_path, tokenizer, base_model) -> None:
    decay = 0.75
    config = make_config(
        tmp_path, sdpo_weight=1.0, sdpo_teacher="ema", teacher_ema_decay=decay, learning_rate=1e-2, disable_tqdm=True
    )
    trainer = make_trainer(base_model, tokenizer, config)
    inputs = build_batch(trainer, tokenizer, hinted=[True, False])
    sequence, turn_length = hinted_teacher_input(trainer, inputs)
    teacher = trainer.sdpo.teacher.ema_copy
    assert teacher is not None and not any(p.requires_grad for p in teacher.parameters())

    # At start the EMA copy is the policy: same logits.
    torch.testing.assert_close(
        trainer.sdpo.teacher_logits([alone(sequence)], [turn_length]),
        logits_predicting_last_tokens(trainer.model, sequence, turn_length),
    )
    teacher_before = {name: p.detach().clone() for name, p in teacher.named_parameters()}

    # One optimizer step with the SDPO term, then the callback event Trainer fires after `optimizer.step()`.
    trainer.create_optimizer()
    trainer.compute_loss(trainer.model, inputs).backward()
    assert trainer._metrics["train"]["sdpo/loss"][-1] > 0
    assert all(p.grad is None for p in teacher.parameters()), "a gradient reached the EMA teacher"
    trainer.optimizer.step()
    trainer.callback_handler.on_step_end(trainer.args, trainer.state, trainer.control)

    policy = {name: p.detach() for name, p in trainer.model.named_parameters()}
    assert policy.keys() == teacher_before.keys()
    moved = [name for name, p in policy.items() if not torch.equal(p, teacher_before[name])]
    assert moved, "the optimizer step changed no parameter"
    teacher_after = dict(teacher.named_parameters())
    for name in policy:
        # teacher <- decay * teacher + (1 - decay) * policy
        expected = decay * teacher_before[name] + (1 - decay) * policy[name]
        torch.testing.assert_close(teacher_after[name], expected, rtol=1e-6, atol=1e-7, msg=name)
    # One element by hand, in Python floats.
    name = moved[0]
    t0, p1 = teacher_before[name].flatten()[0].item(), policy[name].flatten()[0].item()
    assert teacher_after[name].flatten()[0].item() == pytest.approx(0.75 * t0 + 0.25 * p1, rel=1e-6, abs=1e-7)
    for name in moved:
        assert not torch.equal(teacher_after[name], policy[name]), name

    # The teacher now lags the live policy: its logits at the hint site differ.
    teacher_logits = trainer.sdpo.teacher_logits([alone(sequence)], [turn_length])
    live_logits = logits_predicting_last_tokens(trainer.model, sequence, turn_length)
    assert (teacher_logits - live_logits).abs().max() > 1e-3
    # and they are the EMA copy's own: called as a module, the copy runs its weights, not the policy's
    # (TRL's instance-patched `forward` would otherwise survive the deep copy).
    torch.testing.assert_close(teacher_logits, logits_predicting_last_tokens(teacher, sequence, turn_length))


# ----------------------------------------------------------------- base


def lora_trainer(tmp_path: Any, tokenizer: Any, base_model: torch.nn.Module) -> Any:
    # Non-zero LoRA B matrices from the start, so that the adapted policy differs from its base.
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    config = make_config(tmp_path, sdpo_weight=1.0, sdpo_teacher="base")
    return make_trainer(base_model, tokenizer, config, peft_config=lora)


def test_base_teacher_is_the_frozen_base_and_not_the_adapted_policy(tmp_path, tokenizer, base_model) -> None:
    trainer = lora_trainer(tmp_path, tokenizer, base_model)
    inputs = build_batch(trainer, tokenizer, hinted=[True, False])
    sequence, turn_length = hinted_teacher_input(trainer, inputs)
    adapted_before = logits_predicting_last_tokens(trainer.model, sequence, turn_length)

    teacher_logits = trainer.sdpo.teacher_logits([alone(sequence)], [turn_length])
    assert teacher_logits.grad_fn is None and not teacher_logits.requires_grad
    # `base_model` is the model the trainer's LoRA copy was made from, never wrapped or trained.
    torch.testing.assert_close(teacher_logits, logits_predicting_last_tokens(base_model, sequence, turn_length))
    assert (teacher_logits - adapted_before).abs().max() > 1e-3
    # Leaving the teacher turned the adapter back on.
    torch.testing.assert_close(logits_predicting_last_tokens(trainer.model, sequence, turn_length), adapted_before)


def test_base_teacher_sdpo_loss_distils_the_base_into_the_adapter_only(tmp_path, tokenizer, base_model) -> None:
    trainer = lora_trainer(tmp_path, tokenizer, base_model)
    inputs = build_batch(trainer, tokenizer, hinted=[True, False])
    sequence, turn_length = hinted_teacher_input(trainer, inputs)
    (site,) = inputs["hint_sites"][0]
    trainable = {name: p for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)

    trainer.model.zero_grad()
    trainer.compute_loss(trainer.model, inputs).backward()

    # The SDPO term is the JSD between the adapted student on the original context and the base teacher.
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        student = trainer.model(input_ids=ids, attention_mask=mask).logits[0]
    p = inputs["prompt_ids"].size(1)
    expected = generalized_jsd(
        student[p + site.start - 1 : p + site.end - 1],
        logits_predicting_last_tokens(base_model, sequence, turn_length),
        beta=trainer.args.jsd_beta,
        reduction="sum",
    ) / max(inputs["num_items_in_batch"], inputs["hint_tokens"])
    assert expected > 0
    assert trainer._metrics["train"]["sdpo/loss"][-1] == pytest.approx(expected.item(), rel=1e-5)

    # Gradients reach the adapter only: the base weights the teacher runs on stay frozen and untouched,
    # and the adapter is trainable again after the teacher switched it off.
    for name, param in trainer.model.named_parameters():
        if name in trainable:
            assert param.requires_grad, f"{name} was left frozen by the teacher"
            assert param.grad is not None and torch.isfinite(param.grad).all(), name
        else:
            assert param.grad is None, f"{name} (base, shared with the teacher) got a gradient"
