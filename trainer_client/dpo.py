"""The DPO channel: trace-replay preference pairs, a mini-batch per micro-step (each rank its own shard).

The reference's log-probs are computed at the first DPO loss (after `accelerator.prepare`: a sharded
model runs only from then on) and cached with the pairs. The reference is the policy before training
(the base model for a PEFT policy), or with trust-region DPO (decision 068) it moves towards the policy
every `dpo_ref_model_sync_steps` steps (`sync_reference`): its own copy for a soft update, the policy
itself for a hard one. A mini-batch may read the head its pairs share with a rollout's prompt from GRPO's
forward (decision 079). What it needs from the trainer is `policy_forward.PolicyHost`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal

import torch
from trl.models.utils import disable_gradient_checkpointing

from trainer_client.losses import dpo_loss
from trainer_client.output_head import output_logits
from trainer_client.packing import PackedBatch, common_prefix_length
from trainer_client.policy_copies import frozen_copy, mix_into
from trainer_client.policy_forward import (
    HeadCache,
    KeysValues,
    PolicyHost,
    PromptHead,
    checkpointed_layers_keep_cache,
)
from trainer_client.preferences import PreferenceBatches


@dataclass(frozen=True)
class DpoSettings:
    """The channel's knobs (`ComposerConfig`'s `dpo_*` fields)."""

    beta: float = 0.1
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"
    reuse_policy_cache: bool = True
    reference_mixup_alpha: float | None = None
    """Trust-region DPO's alpha at each sync; None: no sync (the reference stays the policy before training)."""


@dataclass(frozen=True)
class DpoBatch:
    """One micro-step's DPO mini-batch."""

    indices: list[int]
    """The pairs' positions in the rank's shard."""
    batch: PackedBatch
    """Their rows (`PreferenceBatches.collate`)."""
    head: PromptHead | None
    """The rollout prompt head every row opens with, whose keys and values GRPO's forward records for it."""


class DpoChannel:
    """The DPO loss of each micro-step's mini-batch of `preferences`, against a cached reference."""

    def __init__(self, host: PolicyHost, preferences: PreferenceBatches, settings: DpoSettings) -> None:
        self._host = host
        self.preferences = preferences
        self._settings = settings
        alpha = settings.reference_mixup_alpha
        self.reference: torch.nn.Module | None = frozen_copy(host.policy_causal_lm()) if alpha is not None and alpha < 1.0 else None
        """Trust-region DPO with alpha < 1: the reference's own weights. Otherwise None: the reference is
        the policy itself when its log-probs are computed (at the first DPO loss, or at a hard sync)."""

    def collate(self, indices: list[int]) -> PackedBatch:
        return self.preferences.collate(indices, self._host.pad_token_id, shared_prefix=self._host.shared_prefixes)

    def next_batch(self, inputs: dict[str, Any]) -> DpoBatch:
        """The micro-step's DPO mini-batch, and the head its pairs share with a rollout's prompt, if GRPO's
        forward may record it for them (decision 079)."""
        indices = self.preferences.next_indices()
        batch = self.collate(indices)
        head = None
        if self._settings.reuse_policy_cache and self._host.shared_prefixes:
            contexts = [self.preferences.pairs[index].context_ids for index in indices]
            longest = min(map(len, contexts)) - 1  # a context's last token predicts its actions: it must run
            # Rows without left padding: there the head's positions are those of the pairs' own rows.
            for row in (inputs["prompt_mask"][:, 0] == 1).nonzero().flatten().tolist():
                prompt = inputs["prompt_ids"][row].tolist()
                length = min(longest, *(common_prefix_length(prompt, context) for context in contexts))
                if length > (head.length if head else 0):
                    head = PromptHead(row, length)
        return DpoBatch(indices, batch, head)

    def loss(
        self,
        model: torch.nn.Module,
        policy_tokens: torch.Tensor,
        dpo: DpoBatch | None = None,
        head_keys_values: KeysValues | None = None,
    ) -> torch.Tensor:
        """The loss of the DPO mini-batch `dpo` (by default the next one, run whole); logs `dpo/token_share`,
        the tokens it ran over GRPO's `policy_tokens` in this micro-step, which is what the channel adds to
        the step's time (decision 077). The head recorded in GRPO's forward (`head_keys_values`) is read, not
        run, where it carries its gradient: not under reentrant activation checkpointing, whose forward
        records no graph."""
        host, preferences = self._host, self.preferences
        if dpo is None:
            indices = preferences.next_indices()
            dpo = DpoBatch(indices, self.collate(indices), head=None)
        if preferences.reference_logps is None:
            preferences.reference_logps = self.reference_logps()
        if head_keys_values is not None and torch.is_grad_enabled() and not head_keys_values[0][0].requires_grad:
            head_keys_values = None
        policy = self.sequence_logps(host.policy_causal_lm(model), dpo.batch, head_keys_values).view(-1, 2)  # (pairs, chosen / rejected)
        reference = preferences.reference_logps[dpo.indices].to(policy.device)
        out = dpo_loss(
            policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], beta=self._settings.beta, loss_type=self._settings.loss_type
        )
        loss = out.losses.mean()
        head = 0 if head_keys_values is None else head_keys_values[0][0].size(-2)
        # every rank scores as many pairs (`rank_shard`): the global means are the means of the ranks'
        ranks = host.gather_ranks(
            loss,
            (out.chosen_rewards > out.rejected_rewards).float().mean(),
            (out.chosen_rewards - out.rejected_rewards).mean(),
            dpo.batch.token_count() - head * dpo.batch.input_ids.size(0),
            policy_tokens,
        )
        for name, value in zip(("dpo/loss", "dpo/accuracy", "dpo/margin"), ranks[:, :3].mean(dim=0).tolist()):
            host.record_metric(name, value)
        host.record_metric("dpo/token_share", (ranks[:, 3].sum() / ranks[:, 4].sum().clamp(min=1)).item())
        return loss / host.accumulation_share()

    def sequence_logps(
        self, causal_lm: torch.nn.Module, batch: PackedBatch, head_keys_values: KeysValues | None = None
    ) -> torch.Tensor:
        """Summed log-probs of each continuation, in order; the vocabulary is projected only at its tokens.
        With `head_keys_values`, every row's first positions are read from them (a prompt head recorded in
        GRPO's forward, its gradient included) and only the rest of the rows runs."""
        device = self._host.device
        head, cache, keep_cache = 0, None, contextlib.nullcontext()
        if head_keys_values is not None:
            head, cache = head_keys_values[0][0].size(-2), HeadCache(head_keys_values, rows=batch.input_ids.size(0))
            keep_cache = checkpointed_layers_keep_cache(causal_lm.base_model)
        with keep_cache:
            hidden = self._host.run_backbone(
                causal_lm,
                batch.input_ids[:, head:].to(device),
                batch.attention_mask[:, head:].to(device),  # a packed mask: the rest's queries, every key
                batch.position_ids[:, head:].to(device),
                cache,
            )
        rows, predictors, targets, numbers = (t.to(device) for t in batch.scored_tokens())
        logits = output_logits(causal_lm, hidden[rows, predictors - head])
        token_logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        continuations = sum(len(placements) for placements in batch.placements)  # known on the host: no device sync
        return torch.zeros(continuations, device=device).index_add(0, numbers, token_logps)

    @torch.no_grad()
    def reference_logps(self) -> torch.Tensor:
        """(chosen, rejected) log-probs of this rank's pairs under the DPO reference: its own copy (soft
        trust-region DPO), else the policy as it is now, adapter off for a PEFT policy (its base). Every rank
        has as many pairs, so as many forwards."""
        preferences = self.preferences
        own_copy = self.reference is not None
        causal_lm = self.reference if own_copy else self._host.policy_causal_lm()
        logps = torch.empty(len(preferences.pairs), 2)
        order = preferences.grouped_indices()  # a chain's pairs together: their shared context runs once
        was_training = causal_lm.training
        causal_lm.eval()  # no dropout in a reference
        try:
            with (
                contextlib.nullcontext() if own_copy else self._host.policy_base(),
                disable_gradient_checkpointing(causal_lm, None),
            ):
                for start in range(0, len(order), preferences.batch_size):
                    indices = order[start : start + preferences.batch_size]
                    logps[indices] = self.sequence_logps(causal_lm, self.collate(indices)).view(-1, 2).cpu()
        finally:
            causal_lm.train(was_training)
        return logps

    @torch.no_grad()
    def sync_reference(self) -> None:
        """Trust-region DPO's update (`mix_into`; for alpha = 1 the policy itself is the new reference),
        then the cached log-probs are dropped: every rank recomputes its pairs' at the next DPO loss."""
        if self.reference is not None:
            assert self._settings.reference_mixup_alpha is not None
            mix_into(self.reference, self._host.policy_causal_lm(), self._settings.reference_mixup_alpha)
        self.preferences.reference_logps = None
