"""Two real ComposerTrainer steps (alpha > 0, beta > 0) against the real service and Docker sandboxes.

A random model emits no tool calls, so the policy's sampler is scripted: each rollout's turns are
fixed token sequences (a failing or a working bash call, then `submit`, then a closing text). All
else is real: TRL's tool loop, the environment adapter, the service's error kinds and hints, hint
site location, the three losses and the optimizer.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from tests.trainer.conftest import SERVICE_TOKEN, make_config, preference_pairs, tool_call_text
from trainer_client.client import ClientSettings
from trainer_client.environment import environment_factory
from trainer_client.trainer import ComposerTrainer

pytestmark = pytest.mark.docker


class ScriptedSamplerTrainer(ComposerTrainer):
    """Replaces only sampling: turn 0 is a bad command in even rollouts, a good one in odd ones."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tokenizer = self._tokenizer
        completions = []
        for index, ids in enumerate(prompt_ids):
            rounds = tokenizer.decode(ids).count("<tool_response>")
            if rounds == 0:
                text = tool_call_text("pytset -q" if index % 2 == 0 else "ls")
            elif rounds == 1:
                text = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>'
            else:
                text = "Done.<|im_end|>"
            completions.append(tokenizer.encode(text, add_special_tokens=False))
        return completions, None


class GradientCheck(TrainerCallback):
    def __init__(self) -> None:
        self.steps_checked = 0

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        for name, param in model.named_parameters():
            assert param.grad is not None, f"{name} got no gradient"
            assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
        self.steps_checked += 1


def test_two_steps_with_all_three_channels(service_url, tokenizer, base_model, tmp_path) -> None:
    factory = environment_factory(ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "task_id": "builtin/fizzbuzz"}] * 4)
    config = make_config(
        tmp_path, max_steps=2, max_completion_length=256, sdpo_weight=1.0, dpo_weight=0.5, dpo_batch_size=2, jsd_top_k=64
    )
    check = GradientCheck()
    trainer = ScriptedSamplerTrainer(
        model=base_model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=factory,
        preference_pairs=preference_pairs(),
        callbacks=[check],
    )
    try:
        trainer.train()
    finally:
        trainer.close_environments()
    assert check.steps_checked == 2
    logs = [entry for entry in trainer.state.log_history if "sdpo/loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        # one rollout of two hit `command_not_found` with a hint: one site, scored by the teacher
        assert entry["sdpo/hint_sites"] == 1
        assert entry["sdpo/loss"] > 0 and entry["sdpo/jsd"] > 0
        assert entry["env/error_rate/command_not_found"] == pytest.approx(0.25)  # 1 of 4 calls
        assert "dpo/loss" in entry and 0.0 <= entry["dpo/accuracy"] <= 1.0
        assert "reward" in entry
