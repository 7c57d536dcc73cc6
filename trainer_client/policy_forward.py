"""What GRPO's forward over the rollouts leaves for the SDPO channel: the backbone's last hidden states
(the student's, with their autograd graph; decision 060) and, for the live teacher, every layer's keys
and values of the rollouts' contexts (decision 076).

The keys and values are recorded by a cache object handed to that forward (`ContextRecorder`), not
taken from the cache transformers returns: the recorder gives each layer its own keys and values back,
so attention runs as it does without a cache, and it records each layer once, so that it also works
under activation checkpointing, where the backward replays every layer's forward with the same object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer

KeysValues = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, `(keys, values)`, each `(batch, kv heads, length, head dim)`."""


class ContextRecorder(DynamicCache):
    """The cache of one training forward that records each layer's keys and values, detached (the teacher
    takes no gradient), and hands the layer back its own: it never feeds cached states into attention.
    Recording ends with `take`; a checkpointed layer's replay in the backward then records nothing, and
    the recorder holds no tensors through the backward."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config)
        self._records: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._records is not None:
            self._records.setdefault(layer_idx, (key_states.detach(), value_states.detach()))
        return key_states, value_states

    def take(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The records by layer index; recording ends."""
        records, self._records = self._records or {}, None
        return records


class BackboneCapture:
    """Captures the backbone's last hidden state during one forward pass (with its autograd graph) and, if
    asked to `record_contexts`, every layer's keys and values (`ContextRecorder`)."""

    def __init__(self, backbone: torch.nn.Module, *, record_contexts: bool) -> None:
        self._backbone = backbone
        self._record_contexts = record_contexts
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._opened: list[GradientCheckpointingLayer] = []
        self.hidden_states: torch.Tensor | None = None
        self.keys_values: KeysValues | None = None
        """Keys and values of every input position of every layer, detached; None unless asked for, or
        where a layer did not record them all."""

    def __enter__(self) -> BackboneCapture:
        recorder = ContextRecorder(self._backbone.config) if self._record_contexts else None
        layers = self._backbone.config.num_hidden_layers

        def hand_recorder(_module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            return args, {**kwargs, "cache": recorder}

        def keep(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if self.hidden_states is not None:
                raise RuntimeError("the backbone ran twice in one loss computation; cannot tell the passes apart")
            self.hidden_states = output.last_hidden_state
            if recorder is not None:
                records = recorder.take()  # a layer that recorded did so over the whole input
                self.keys_values = [records[i] for i in range(layers)] if len(records) == layers else None

        self._handles.append(self._backbone.register_forward_hook(keep))
        if recorder is not None:
            self._handles.append(self._backbone.register_forward_pre_hook(hand_recorder, with_kwargs=True))
            # Under activation checkpointing a layer drops the cache it is given unless it declares that its
            # replay may see the cache again; the recorder's replay records and feeds nothing, so it may.
            self._opened = [
                layer for layer in self._backbone.modules()
                if isinstance(layer, GradientCheckpointingLayer) and not getattr(layer, "_can_checkpoint_with_cache", False)
            ]
            for layer in self._opened:
                layer._can_checkpoint_with_cache = True
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        for layer in self._opened:
            del layer._can_checkpoint_with_cache  # the class's own value again


@dataclass(frozen=True)
class PolicyContexts:
    """The rollouts' contexts as the policy's GRPO forward recorded them: the live teacher reads them
    instead of running them again (decision 076)."""

    keys_values: KeysValues
    """Keys and values of the micro-batch's rows (left-padded prompt, then completion), per layer."""
    rows: list[int]
    """Per teacher row, its row in the micro-batch."""
    context_starts: list[int]
    """Per teacher row, the cache index of its first token (the prompt's left padding)."""

    def cache_for_rows(self) -> DynamicCache:
        """A cache of the teacher rows' contexts alone, for the teacher's forward to extend."""
        index = torch.tensor(self.rows, device=self.keys_values[0][0].device)
        return DynamicCache(ddp_cache_data=[(keys[index], values[index]) for keys, values in self.keys_values])

    @property
    def length(self) -> int:
        """Positions in the recorded contexts."""
        return self.keys_values[0][0].size(-2)
