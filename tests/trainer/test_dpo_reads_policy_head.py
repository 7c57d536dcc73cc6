"""The DPO mini-batch reads the head its pairs share with a rollout's prompt (system prompt, tools) from
GRPO's forward, keys and values with their gradient (decision 079): the same DPO loss and gradients as
running the head again, with the head's tokens no longer run."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.trainer.conftest import TOOLS, bash_call, build_batch, make_config, make_trainer
from trainer_client.records import PreferencePair


def pairs_of_the_rollouts_task() -> list[PreferencePair]:
    """Two states of the rollouts' own task and one of another, rendered with the rollouts' tools: each
    context opens with the rollouts' prompt head, and the mini-batch's row branches after it."""
    task = [{"role": "user", "content": "Make the tests pass."}]
    later = [*task, bash_call("cat stats.py"), {"role": "tool", "content": "def mean(xs):\n    return sum(xs)\n"}]
    other = [{"role": "user", "content": "Document stats.py."}]
    return [
        PreferencePair(state_id=state_id, messages=messages, tools=TOOLS, chosen=bash_call("python3 -m pytest -q"), rejected=bash_call("pytset"))
        for state_id, messages in (("a/0", task), ("a/1", later), ("b/0", other))
    ]


def loss_gradients_and_share(trainer: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, float]:
    trainer.model.zero_grad()
    torch.manual_seed(0)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    gradients = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return loss.detach(), gradients, trainer._metrics["train"]["dpo/token_share"][-1]


@pytest.mark.parametrize(
    ("sdpo_weight", "checkpointing"),
    [(0.0, None), (1.0, None), (1.0, {"use_reentrant": False}), (0.0, {"use_reentrant": True})],
)
def test_dpo_loss_and_gradients_are_the_same_with_the_head_read_or_run(
    tmp_path, tokenizer, base_model, sdpo_weight: float, checkpointing: dict[str, bool] | None
) -> None:
    results = {}
    for reuse in (True, False):
        config = make_config(
            tmp_path, sdpo_weight=sdpo_weight, dpo_weight=1.0, dpo_batch_size=3, dpo_group_by_context=False,
            dpo_reuse_policy_cache=reuse, activation_checkpointing=checkpointing is not None,
        )
        trainer = make_trainer(base_model, tokenizer, config, preference_pairs=pairs_of_the_rollouts_task())
        if checkpointing is not None:
            trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing)
        trainer.model.train()
        inputs = build_batch(trainer, tokenizer, hinted=[True, False])
        inputs["prompt_ids"] = torch.cat([torch.full((2, 3), tokenizer.pad_token_id), inputs["prompt_ids"]], dim=1)
        inputs["prompt_mask"] = torch.cat([torch.zeros(2, 3, dtype=torch.long), inputs["prompt_mask"]], dim=1)
        inputs["prompt_ids"][1, :3] = inputs["prompt_ids"][1, 3:6]  # row 1 has no left padding: its head is read
        inputs["prompt_ids"][1, 3:] = torch.roll(inputs["prompt_ids"][1, 3:], -3)
        inputs["prompt_mask"][1] = 1
        dpo = trainer.dpo.next_batch(inputs)
        trainer.dpo.preferences._order = iter(dpo.indices)  # `compute_loss` draws this same mini-batch
        results[reuse] = loss_gradients_and_share(trainer, inputs), dpo
    (loss, gradients, share), dpo = results[True]
    (plain_loss, plain_gradients, plain_share), plain_dpo = results[False]
    assert plain_dpo.head is None and dpo.head is not None and dpo.head.row == 1
    if checkpointing == {"use_reentrant": True}:
        assert share == plain_share  # a reentrant forward records no graph: the head runs again
    else:
        rows = dpo.batch.input_ids.size(0)
        assert rows == 1 and share == pytest.approx(plain_share - dpo.head.length * rows / share_denominator(inputs))
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
    # a head read without its gradient (detached) leaves the DPO gradient through it out: over half the norm here
    assert (gradients - plain_gradients).norm() < 1e-5 * plain_gradients.norm()


def share_denominator(inputs: dict[str, Any]) -> int:
    return int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
