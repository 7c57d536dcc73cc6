"""The live SDPO teacher reads the rollouts' contexts from the keys and values of GRPO's own forward
(decision 076): the same teacher logits, SDPO loss and gradients as running the contexts again, with
only the hints and hinted turns run."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from env_server.models import ErrorKind
from tests.trainer.conftest import build_batch, make_config, make_trainer
from trainer_client.hint_sites import TurnFailure, TurnReport, locate_hint_sites, teacher_row
from trainer_client.packing import Continuation, PackedRow, pack_after_cache
from trainer_client.policy_forward import BackboneCapture, ContextRecorder, PolicyContexts, PromptHead


def two_rollouts_of_unequal_prompts(trainer: Any, tokenizer: Any) -> dict[str, Any]:
    """Rollout 0 with sites on both its turns; rollout 1 with one site and a prompt 5 tokens shorter,
    so that its context starts after 5 positions of left padding in GRPO's batch."""
    inputs = build_batch(trainer, tokenizer, hinted=[True, True])
    inputs["prompt_ids"][1, :5] = tokenizer.pad_token_id
    inputs["prompt_mask"][1, :5] = 0
    mask = (inputs["completion_mask"][0] * inputs["tool_mask"][0]).tolist()
    reports = [
        TurnReport(0, (TurnFailure(ErrorKind.COMMAND_NOT_FOUND, "`pytset` is not a command."),)),
        TurnReport(1, (TurnFailure(ErrorKind.NO_TOOL_CALL, "Call a tool."),)),
    ]
    inputs["hint_sites"][0] = locate_hint_sites(reports, mask, trainer._hint_template)
    assert [len(sites) for sites in inputs["hint_sites"]] == [2, 1]
    inputs["hint_tokens"] = torch.tensor(sum(s.end - s.start for sites in inputs["hint_sites"] for s in sites))
    return inputs


def grpo_forward_contexts(trainer: Any, inputs: dict[str, Any]) -> tuple[PolicyContexts, list[PackedRow], list[int]]:
    """The policy's forward over the batch as TRL runs it (left-padded prompt, then completion), its
    cache kept; and the teacher rows and turn lengths `SdpoChannel.loss` builds."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad(), BackboneCapture(trainer.model.model, record_contexts=True) as captured:
        trainer.model(input_ids=ids, attention_mask=mask)
    keys_values = captured.keys_values
    assert keys_values is not None and len(keys_values) == trainer.model.config.num_hidden_layers
    rows, turn_lengths, starts = [], [], []
    for row, sites in enumerate(inputs["hint_sites"]):
        prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
        rows.append(teacher_row(prompt, inputs["completion_ids"][row].tolist(), sites, trainer._hint_template.header_ids))
        turn_lengths.extend(site.end - site.start for site in sites)
        starts.append(inputs["prompt_ids"].size(1) - len(prompt))
    assert starts == [0, 5]
    contexts = PolicyContexts(keys_values, [0, 1], starts)
    assert contexts.length == ids.size(1)
    return contexts, rows, turn_lengths


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_teacher_logits_from_the_cached_contexts_equal_running_the_contexts(tmp_path, tokenizer, base_model, attention) -> None:
    model = copy.deepcopy(base_model)
    model.set_attn_implementation(attention)
    trainer = make_trainer(model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    inputs = two_rollouts_of_unequal_prompts(trainer, tokenizer)
    contexts, rows, turn_lengths = grpo_forward_contexts(trainer, inputs)
    run_lengths = []
    hidden_states = trainer.run_backbone
    trainer.run_backbone = lambda causal_lm, input_ids, *rest: run_lengths.append(input_ids.size(1)) or hidden_states(causal_lm, input_ids, *rest)
    with torch.no_grad():
        from_cache = trainer.sdpo.teacher_logits(rows, turn_lengths, contexts)
        from_contexts = trainer.sdpo.teacher_logits(rows, turn_lengths)
    assert from_cache.shape == (sum(turn_lengths), len(tokenizer))
    # Rollout 1's cached keys carry rotary positions 5 further on than a context run alone: equal in exact
    # arithmetic, ~1e-4 apart in float32 for this sharp random model (logits up to ~16). A context token
    # leaked or a position off by one moves logits by ~0.1 or more.
    torch.testing.assert_close(from_cache, from_contexts, rtol=1e-3, atol=2e-3)
    # the cached run holds only the hints and turns: rollout 0's two continuations, not its context
    continuations = sum(len(c.token_ids) for c in rows[0].continuations)
    assert run_lengths == [continuations, len(rows[0].context[: max(c.cut for c in rows[0].continuations)]) + continuations]


def loss_and_grads(trainer: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("activation_checkpointing", [False, True])
def test_sdpo_loss_and_gradients_are_the_same_with_the_cache_read_or_not(
    tmp_path, tokenizer, base_model, activation_checkpointing
) -> None:
    """Through `compute_loss`: GRPO's forward records its keys and values for the teacher, also under activation
    checkpointing, whose backward replays each layer's forward with the recorder."""
    losses, gradients, teacher_inputs = {}, {}, {}
    for reuse in (True, False):
        config = make_config(tmp_path, sdpo_weight=1.0, sdpo_reuse_policy_cache=reuse, activation_checkpointing=activation_checkpointing)
        trainer = make_trainer(base_model, tokenizer, config)
        if activation_checkpointing:
            trainer.model.activation_checkpointing_enable()
        inputs = two_rollouts_of_unequal_prompts(trainer, tokenizer)
        calls = []
        teacher_logits = trainer.sdpo.teacher_logits
        trainer.sdpo.teacher_logits = lambda rows, lengths, contexts=None: calls.append(contexts) or teacher_logits(rows, lengths, contexts)
        losses[reuse], gradients[reuse] = loss_and_grads(trainer, inputs)
        assert not any(getattr(layer, "_can_checkpoint_with_cache", False) for layer in trainer.model.modules())
        assert trainer._metrics["train"]["sdpo/loss"][-1] > 0
        teacher_inputs[reuse] = calls
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-6)
    assert (gradients[True] - gradients[False]).norm() < 1e-4 * gradients[False].norm()
    assert teacher_inputs[False] == [None]
    (contexts,) = teacher_inputs[True]
    assert contexts is not None and contexts.rows == [0, 1] and contexts.context_starts == [0, 5]


def test_the_recorder_hands_attention_its_own_states_and_records_each_layer_once(base_model) -> None:
    recorder = ContextRecorder(base_model.config)
    states, replayed = torch.randn(1, 2, 3, 4, requires_grad=True), torch.randn(1, 2, 3, 4)
    keys, values = recorder.update(states, states * 2, 0)
    assert keys is states and values.requires_grad  # attention runs as without a cache, gradient and all
    recorder.update(replayed, replayed, 0)  # a checkpointed layer's replay in the backward
    records, head_records = recorder.take()
    assert list(records) == [0] and torch.equal(records[0][0], states) and not records[0][0].requires_grad
    assert head_records == {}  # no head asked for
    recorder.update(replayed, replayed, 1)  # after `take`: nothing is held through the backward
    assert recorder.take() == ({}, {}) and recorder.get_seq_length() == 0


def test_the_recorder_keeps_a_heads_keys_and_values_with_their_graph(base_model) -> None:
    recorder = ContextRecorder(base_model.config, record_all=False, head=PromptHead(row=1, length=2))
    states = torch.randn(2, 2, 3, 4, requires_grad=True)
    recorder.update(states, states * 2, 0)
    records, head_records = recorder.take()
    keys, values = head_records[0]
    assert records == {} and keys.shape == (1, 2, 2, 4)
    assert torch.equal(keys, states[1:, :, :2]) and torch.equal(values, 2 * states[1:, :, :2])
    values.sum().backward()  # the gradient reaches the states the head was taken from, only there
    assert states.grad[1, :, :2].eq(2).all() and states.grad.sum() == 2 * keys.numel()


def test_continuations_after_a_cache_see_their_context_from_its_start_to_their_cut() -> None:
    rows = [PackedRow([10, 11, 12], [Continuation(2, [20, 21]), Continuation(3, [30])]), PackedRow([40, 41], [Continuation(1, [50])])]
    batch = pack_after_cache(rows, pad_token_id=0, context_starts=[1, 0], cache_length=4)
    assert batch.input_ids.tolist() == [[20, 21, 30], [50, 0, 0]]
    # positions go on from the cut's cache index (row 0's context starts at index 1)
    assert batch.position_ids.tolist()[0] == [3, 4, 4] and batch.position_ids.tolist()[1][0] == 1
    sees = batch.attention_mask.int().tolist()
    #                    cache         own tokens
    assert sees[0][0] == [0, 1, 1, 0] + [1, 0, 0]
    assert sees[0][1] == [0, 1, 1, 0] + [1, 1, 0]
    assert sees[0][2] == [0, 1, 1, 1] + [0, 0, 1]  # never the other continuation
    assert sees[1][0] == [1, 0, 0, 0] + [1, 0, 0]
    assert batch.predictors(0, 0) == [0] and batch.predictors(0, 1) == [] and batch.predictors(1, 0) == []
    with pytest.raises(ValueError):
        pack_after_cache(rows, pad_token_id=0, context_starts=[2, 0], cache_length=4)  # row 0's cut past the cache
