"""Frozen copies of the policy that trail it: the SDPO channel's EMA teacher (moved every optimizer step)
and trust-region DPO's reference (moved every `dpo_ref_model_sync_steps` steps, decision 068). Both move
by the same rule, `mix_into`; `EveryOptimizerSteps` says when."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback


def frozen_copy(causal_lm: torch.nn.Module) -> torch.nn.Module:
    """A copy of the causal LM that runs its own weights, in eval mode and without gradient."""
    copied = copy.deepcopy(causal_lm)
    # TRL patches `forward` on instances with closures over the policy's own modules (fused LM head,
    # fp32 LM head); a deep copy keeps the closures and would run the policy, so restore the classes'.
    for module in copied.modules():
        vars(module).pop("forward", None)
    return copied.eval().requires_grad_(False)


@torch.no_grad()
def mix_into(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """Every target parameter becomes `alpha * source + (1 - alpha) * target`, in place (TR-DPO's rule, that of
    TRL's `SyncRefModelCallback`; an EMA with decay d is alpha = 1 - d; alpha = 1 copies the source). Same
    parameter order in both: a `frozen_copy` of the source."""
    for target_param, source_param in zip(target.parameters(), source.parameters(), strict=True):
        target_param.lerp_(source_param.detach().to(target_param.dtype), alpha)


class EveryOptimizerSteps(TrainerCallback):
    """Calls `action` after every `steps`-th optimizer step (the trainer's `global_step`)."""

    def __init__(self, steps: int, action: Callable[[], None]) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self._steps = steps
        self._action = action

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self._steps == 0:
            self._action()
