"""The SDPO channel: self-distillation at hint sites (Composer's "targeted RL with textual feedback").

For an assistant turn the policy got wrong (decision 063), the teacher (`teacher.SdpoTeacher`: the
policy without gradient, reading the hint just before the turn) is distilled into the student (the
policy on the original context) with a generalized JSD (`losses.generalized_jsd`) over that turn's tokens
(those the site distils: all, or its content, decision 132).
The student's hidden states come from GRPO's own forward (decision 060), and so may the contexts the live
teacher reads: then it runs only each hint and hinted turn, after GRPO's keys and values (decision 076).
The vocabulary projection runs only at hint-site positions, through the model's own output path
(`output_head`). What it needs from the trainer is `policy_forward.PolicyHost`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from trainer_client.hint_sites import teacher_row
from trainer_client.losses import generalized_jsd
from trainer_client.output_head import output_logits
from trainer_client.packing import Continuation, PackedRow, pack, pack_after_cache
from trainer_client.policy_forward import KeysValues, PolicyContexts, PolicyHost
from trainer_client.teacher import SdpoTeacher
from trainer_client.teacher_contexts import HintPlacement

SdpoNormalizer = Literal["policy_tokens", "hint_tokens"]


@dataclass(frozen=True)
class SdpoSettings:
    """The channel's knobs (`ComposerConfig`'s `jsd_*` and `sdpo_*` fields) and the run's shape."""

    jsd_beta: float = 0.5
    jsd_temperature: float = 1.0
    jsd_top_k: int | None = None
    normalizer: SdpoNormalizer = "policy_tokens"
    reuse_policy_cache: bool = True
    placement: HintPlacement = "before_turn"
    """Where the teacher reads a site's message (`teacher_contexts`)."""
    steps_per_generation: int = 1
    """Optimizer steps a generation batch feeds (GRPOConfig's)."""
    num_processes: int = 1


class SdpoChannel:
    """The SDPO loss of a micro-batch, from GRPO's forward (hidden states, and keys and values if recorded)."""

    def __init__(self, host: PolicyHost, teacher: SdpoTeacher, hint_header_ids: Sequence[int], settings: SdpoSettings) -> None:
        self._host = host
        self.teacher = teacher
        self._header_ids = tuple(hint_header_ids)
        self._settings = settings

    @property
    def reads_policy_cache(self) -> bool:
        """Whether the teacher takes the rollouts' contexts from GRPO's forward: it is that forward's model
        (the live policy), it runs packed continuations (decision 076), and they follow the contexts
        themselves (`before_turn`; `after_prompt` rows are chains of branches off the prompt, run with it)."""
        return (
            self._settings.reuse_policy_cache
            and self.teacher.kind == "live"
            and self._host.shared_prefixes
            and self._settings.placement == "before_turn"
        )

    def loss(
        self, model: torch.nn.Module, inputs: dict[str, Any], hidden_states: torch.Tensor, keys_values: KeysValues | None = None
    ) -> torch.Tensor:
        """Generalized JSD summed over this micro-batch's hint-site tokens, divided by a token count of the
        generation batch (`normalizer`). `keys_values`: GRPO's forward's, of the micro-batch, if recorded.
        Every rank calls it in a step where any rank has a site (the forwards are collectives under ZeRO-3 / FSDP)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids = inputs["completion_ids"]
        prompt_length = prompt_ids.size(1)
        rows, positions, teacher_rows, turn_lengths, cache_rows, context_starts = [], [], [], [], [], []
        distilled: list[bool] = []  # per turn token the teacher scores, whether it is distilled (`HintSite.token_mask`)
        for row, sites in enumerate(inputs["hint_sites"]):
            if not sites:
                continue
            prompt = prompt_ids[row][prompt_mask[row].bool()].tolist()
            cache_rows.append(row)
            context_starts.append(prompt_length - len(prompt))  # TRL left-pads prompts
            completion = completion_ids[row].tolist()
            for site in sites:
                # the hidden state at t predicts token t + 1
                span = range(prompt_length + site.start - 1, prompt_length + site.end - 1)
                keep = site.token_mask if site.token_mask is not None else (True,) * len(span)
                kept = [position for position, flag in zip(span, keep) if flag]
                rows.extend([row] * len(kept))
                positions.extend(kept)
                turn_lengths.append(site.end - site.start)
                distilled.extend(keep)
            teacher_rows.append(teacher_row(prompt, completion, sites, self._header_ids, self._settings.placement))
        site_tokens = len(positions)
        if not site_tokens:
            # No site here but some on another rank: the same forwards on row 0's first completion token,
            # weighted 0, so this rank joins the parameter gathers of ZeRO-3 / FSDP in them.
            prompt = prompt_ids[0][prompt_mask[0].bool()].tolist()
            rows, positions, turn_lengths, distilled = [0], [prompt_length - 1], [1], [True]
            teacher_rows = [PackedRow(prompt, [Continuation(len(prompt), [int(completion_ids[0, 0])])])]
            keys_values = None  # the dummy's one token is predicted from the context
        device = hidden_states.device
        student_logits = output_logits(
            self._host.policy_causal_lm(model),
            hidden_states[torch.tensor(rows, device=device), torch.tensor(positions, device=device)],
        )
        contexts = PolicyContexts(keys_values, cache_rows, context_starts) if keys_values is not None else None
        teacher_logits = self.teacher_logits(teacher_rows, turn_lengths, contexts)[torch.tensor(distilled, device=device)]
        settings = self._settings
        jsd = generalized_jsd(
            student_logits,
            teacher_logits,
            beta=settings.jsd_beta,
            temperature=settings.jsd_temperature,
            top_k=settings.jsd_top_k,
            reduction="sum",
        ) * float(site_tokens > 0)
        # Normalise like TRL's token-level losses, over a count of the whole generation batch, so that the
        # micro-steps of one optimizer step add up to one token mean (decision 065 for which count).
        normalizer = self.token_count(inputs) / settings.num_processes
        if self._host.in_training:
            normalizer = normalizer * self._host.accumulation_share() / settings.steps_per_generation
        loss = jsd / normalizer
        ranks = self._host.gather_ranks(loss, jsd, site_tokens)
        self._host.record_metric("sdpo/loss", ranks[:, 0].mean().item())  # the ranks' gradients are averaged
        self._host.record_metric("sdpo/jsd", (ranks[:, 1].sum() / ranks[:, 2].sum().clamp(min=1)).item())
        self._host.record_metric("sdpo/hint_tokens", ranks[:, 2].sum().item())
        return loss

    def token_count(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The generation batch's token count the SDPO sum is divided by (decision 065)."""
        hint_tokens = inputs["hint_tokens"]
        if self._settings.normalizer == "hint_tokens":
            return hint_tokens.clamp(min=1)
        # Sites in completions TRL masks out (`mask_truncated_completions`) are not in GRPO's count.
        return torch.maximum(inputs["num_items_in_batch"], hint_tokens).clamp(min=1)

    @torch.no_grad()
    def teacher_logits(
        self, rows: Sequence[PackedRow], turn_lengths: Sequence[int], contexts: PolicyContexts | None = None
    ) -> torch.Tensor:
        """Teacher logits at the positions predicting the last `turn_length` tokens of each continuation
        (continuations in order, row by row). The contexts are read from GRPO's keys and values where
        given (`contexts`), else run: a rollout's context once for all its sites where the model allows
        (`packing`)."""
        host = self._host
        if contexts is not None:
            batch = pack_after_cache(rows, host.pad_token_id, context_starts=contexts.context_starts, cache_length=contexts.length)
            cache = contexts.cache_for_rows()
        else:
            batch = pack(rows, host.pad_token_id, shared=host.shared_prefixes)
            cache = None
        lengths = iter(turn_lengths)
        batch_rows, positions = [], []
        for row, placements in enumerate(batch.placements):
            for continuation, placement in enumerate(placements):
                count = next(lengths)
                predictors = batch.predictors(row, continuation)
                if count > len(predictors):
                    raise ValueError("a turn's first token is predicted from the cached context; put the hint before it")
                batch_rows.extend([placement.row] * count)
                positions.extend(predictors[-count:])
        device = host.device
        with self.teacher.weights() as teacher:
            hidden = host.run_backbone(
                teacher, batch.input_ids.to(device), batch.attention_mask.to(device), batch.position_ids.to(device), cache
            )
            scored = hidden[torch.tensor(batch_rows, device=device), torch.tensor(positions, device=device)]
            return output_logits(teacher, scored)
