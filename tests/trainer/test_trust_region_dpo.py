"""Trust-region DPO: the reference moved softly (alpha) or hard every tau steps, its cached log-probs refreshed."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainer.conftest import make_config, make_trainer, preference_pairs
from trainer_client.policy_copies import EveryOptimizerSteps, mix_into
from trainer_client.trainer import ComposerConfig


def test_mix_into_is_the_tr_dpo_update_on_tensors() -> None:
    torch.manual_seed(0)
    target, source = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in target.parameters()]
    mix_into(target, source, 0.25)
    for new, old, src in zip(target.parameters(), before, source.parameters()):
        torch.testing.assert_close(new, 0.25 * src + 0.75 * old)
    mix_into(target, source, 1.0)  # hard update: a copy
    assert all(torch.equal(t, s) for t, s in zip(target.parameters(), source.parameters()))


@pytest.mark.parametrize(
    "overrides", [{"dpo_ref_model_mixup_alpha": 0.0}, {"dpo_ref_model_mixup_alpha": 1.5}, {"dpo_ref_model_sync_steps": 0}]
)
def test_bad_sync_settings_are_refused(tmp_path, overrides: dict) -> None:
    with pytest.raises(ValueError, match="dpo_ref_model"):
        make_config(tmp_path, dpo_weight=1.0, dpo_sync_ref_model=True, **overrides)


def test_sync_without_the_dpo_channel_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="dpo_weight"):
        make_config(tmp_path, dpo_sync_ref_model=True)


def test_the_default_is_a_fixed_reference() -> None:
    """The seed's TR-DPO (trace-replay DPO) is plain DPO against the initial policy (decision 068)."""
    assert ComposerConfig.dpo_sync_ref_model is False


def _step_end(trainer, global_step: int) -> None:
    """The sync callback's event, as `Trainer` fires it after optimizer step `global_step`."""
    trainer.state.global_step = global_step
    (sync,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EveryOptimizerSteps)]
    sync.on_step_end(trainer.args, trainer.state, trainer.control)


def _shift_policy(trainer) -> None:
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(0.05 * torch.randn_like(param))


def test_soft_sync_mixes_the_reference_every_tau_steps_and_refreshes_its_log_probs(tmp_path, tokenizer, base_model) -> None:
    config = make_config(
        tmp_path, dpo_weight=1.0, dpo_batch_size=3, dpo_sync_ref_model=True, dpo_ref_model_mixup_alpha=0.5, dpo_ref_model_sync_steps=2
    )
    trainer = make_trainer(base_model, tokenizer, config, preference_pairs=preference_pairs())
    reference = trainer.dpo.reference
    assert reference is not None and not any(p.requires_grad for p in reference.parameters())
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    initial_logps = trainer.dpo.preferences.reference_logps.clone()
    initial = [p.detach().clone() for p in reference.parameters()]

    torch.manual_seed(0)
    _shift_policy(trainer)
    _step_end(trainer, 1)  # not a multiple of tau: nothing moves
    assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), initial))
    assert torch.equal(trainer.dpo.preferences.reference_logps, initial_logps)

    _step_end(trainer, 2)
    for new, old, policy in zip(reference.parameters(), initial, trainer.model.parameters()):
        torch.testing.assert_close(new, 0.5 * policy.detach() + 0.5 * old)
    assert trainer.dpo.preferences.reference_logps is None  # dropped, recomputed at the next DPO loss
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    mixed = copy.deepcopy(base_model)
    with torch.no_grad():
        for param, value in zip(mixed.parameters(), reference.parameters()):
            param.copy_(value)
    expected = make_trainer(mixed, tokenizer, make_config(tmp_path, dpo_weight=1.0, dpo_batch_size=3), preference_pairs=preference_pairs())
    torch.testing.assert_close(trainer.dpo.preferences.reference_logps, expected.dpo.reference_logps())
    assert not torch.allclose(trainer.dpo.preferences.reference_logps, initial_logps)


def test_hard_sync_makes_the_policy_the_reference_without_a_copy(tmp_path, tokenizer, base_model) -> None:
    config = make_config(
        tmp_path, dpo_weight=1.0, dpo_batch_size=3, dpo_sync_ref_model=True, dpo_ref_model_mixup_alpha=1.0, dpo_ref_model_sync_steps=1
    )
    trainer = make_trainer(base_model, tokenizer, config, preference_pairs=preference_pairs())
    assert trainer.dpo.reference is None
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    torch.manual_seed(1)
    _shift_policy(trainer)
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    assert trainer._metrics["train"]["dpo/margin"][-1] != pytest.approx(0.0, abs=1e-5)  # policy moved off the reference
    _step_end(trainer, 1)
    trainer.dpo.loss(trainer.model, policy_tokens=torch.tensor(1000))
    assert trainer._metrics["train"]["dpo/margin"][-1] == pytest.approx(0.0, abs=1e-5)  # the reference is the policy now
    assert trainer._metrics["train"]["dpo/loss"][-1] == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-5)


def test_sync_is_refused_for_a_peft_policy(tmp_path, tokenizer, base_model) -> None:
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(copy.deepcopy(base_model), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    config = make_config(tmp_path, dpo_weight=1.0, dpo_sync_ref_model=True)
    with pytest.raises(ValueError, match="full fine-tuning"):
        make_trainer(lora, tokenizer, config, preference_pairs=preference_pairs())
