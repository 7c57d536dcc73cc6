"""The SDPO teacher's weights: the policy as it is now (`live`), an EMA copy of it (`ema`), or its base
model, the PEFT adapter off (`base`). Whichever it is, it runs without gradient and without activation
checkpointing (a no-grad forward has nothing to recompute)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch
from trl.models.utils import disable_gradient_checkpointing

from trainer_client.policy_copies import frozen_copy, mix_into
from trainer_client.policy_forward import PolicyHost

TeacherKind = Literal["live", "ema", "base"]
TEACHER_KINDS: tuple[TeacherKind, ...] = get_args(TeacherKind)


class SdpoTeacher:
    """The teacher of one kind over `host`'s policy. `ema` keeps a full copy of the policy, moved towards it
    by `update_ema` (after every optimizer step: the trainer's wiring calls it)."""

    def __init__(
        self,
        host: PolicyHost,
        kind: TeacherKind,
        *,
        ema_decay: float = 0.99,
        gradient_checkpointing_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if kind not in TEACHER_KINDS:
            raise ValueError(f"sdpo_teacher must be one of {TEACHER_KINDS}, got {kind!r}")
        self.kind = kind
        self._host = host
        self._ema_decay = ema_decay
        self._gradient_checkpointing_kwargs = gradient_checkpointing_kwargs
        self.ema_copy: torch.nn.Module | None = frozen_copy(host.policy_causal_lm()) if kind == "ema" else None

    def update_ema(self) -> None:
        """Move the EMA copy towards the policy by `1 - ema_decay`."""
        assert self.ema_copy is not None
        mix_into(self.ema_copy, self._host.policy_causal_lm(), 1.0 - self._ema_decay)

    @contextlib.contextmanager
    def weights(self) -> Iterator[torch.nn.Module]:
        """The teacher's causal LM, for a forward without gradient."""
        if self.ema_copy is not None:
            yield self.ema_copy
            return
        causal_lm = self._host.policy_causal_lm()
        with (
            self._host.policy_base() if self.kind == "base" else contextlib.nullcontext(),
            disable_gradient_checkpointing(causal_lm, self._gradient_checkpointing_kwargs),
        ):
            yield causal_lm
