"""How the loss channels run the policy (`PolicyHost`, what each needs from the trainer), and what GRPO's
forward over the rollouts leaves for them: the backbone's last hidden states
(the SDPO student's, with their autograd graph; decision 060); for the live teacher, every layer's keys
and values of the rollouts' contexts (decision 076); for the DPO channel, the keys and values of the
head a rollout's prompt shares with the preference pairs (system prompt, tools), with their autograd
graph (decision 079).

The keys and values are recorded by a cache object handed to that forward (`ContextRecorder`), not
taken from the cache transformers returns: the recorder gives each layer its own keys and values back,
so attention runs as it does without a cache, and it records each layer once, so that it also works
under activation checkpointing, where the backward replays every layer's forward with the same object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from transformers import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer

KeysValues = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, `(keys, values)`, each `(batch, kv heads, length, head dim)`."""


class PolicyHost(Protocol):
    """What a loss channel (`sdpo`, `dpo`) needs from the trainer: the policy and its forward, the step's
    loss scale, the ranks and the metrics sink. `ComposerTrainer` is one; a test may be another."""

    shared_prefixes: bool
    """Whether a context may run once for all its continuations (`packing.takes_shared_prefixes`, decision 075)."""

    @property
    def device(self) -> torch.device:
        """The device this rank computes on."""
        ...

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's padding id."""
        ...

    @property
    def in_training(self) -> bool:
        """Whether this is a training step (else evaluation: no accumulation, metrics logged as `eval`)."""
        ...

    def policy_causal_lm(self, model: torch.nn.Module | None = None) -> torch.nn.Module:
        """The transformers causal LM inside `model` (by default the trainer's), unwrapped from accelerate and PEFT."""
        ...

    def policy_base(self) -> contextlib.AbstractContextManager[Any]:
        """While open, the policy runs without its PEFT adapter (the base model); the policy itself without one."""
        ...

    def run_backbone(
        self,
        causal_lm: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any = None,
    ) -> torch.Tensor:
        """The backbone's last hidden states, after the keys and values in `cache` if given; a `(rows, length,
        keys)` boolean `attention_mask` says which keys each query sees (a packed batch)."""
        ...

    def accumulation_share(self) -> float:
        """The micro-steps an optimizer step accumulates (1 in evaluation): what TRL's GRPO loss divides by."""
        ...

    def gather_ranks(self, *values: torch.Tensor | float) -> torch.Tensor:
        """`(ranks, len(values))`: each rank's values, detached, from every rank (all ranks must call it)."""
        ...

    def record_metric(self, name: str, value: float) -> None:
        """Log `value` under `name` with this step's metrics (averaged over the logging interval)."""
        ...


class PromptHead(NamedTuple):
    """The first `length` positions of one row of a forward's batch."""

    row: int
    length: int


class ContextRecorder(DynamicCache):
    """The cache of one training forward that records each layer's keys and values and hands the layer back
    its own: it never feeds cached states into attention. It records the whole batch detached (the teacher
    takes no gradient; `record_all`) and a `head`'s positions with their autograd graph (DPO's loss takes its
    gradient through them). Recording ends with `take`; a checkpointed layer's replay in the backward then
    records nothing, and the recorder holds no tensors through the backward."""

    def __init__(self, config: Any, *, record_all: bool = True, head: PromptHead | None = None) -> None:
        super().__init__(config=config)
        self._record_all = record_all
        self._head = head
        self._records: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = {}
        self._head_records: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._records is not None and layer_idx not in self._records and layer_idx not in self._head_records:
            if self._record_all:
                self._records[layer_idx] = (key_states.detach(), value_states.detach())
            if self._head is not None:
                row, length = self._head
                # copies: a view would hold the whole batch's keys and values through the backward
                self._head_records[layer_idx] = (
                    key_states[row : row + 1, :, :length].clone(), value_states[row : row + 1, :, :length].clone()
                )
        return key_states, value_states

    def take(self) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        """The whole batch's records and the head's, by layer index; recording ends."""
        records, self._records = self._records or {}, None
        head_records, self._head_records = self._head_records, {}
        return records, head_records


class BackboneCapture:
    """Captures the backbone's last hidden state during one forward pass (with its autograd graph) and, if
    asked to `record_contexts`, every layer's keys and values; if given a `head`, those of its positions with
    their autograd graph (`ContextRecorder`)."""

    def __init__(self, backbone: torch.nn.Module, *, record_contexts: bool, head: PromptHead | None = None) -> None:
        self._backbone = backbone
        self._record_contexts = record_contexts
        self._head = head
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._exits = contextlib.ExitStack()
        self.hidden_states: torch.Tensor | None = None
        self.keys_values: KeysValues | None = None
        """Keys and values of every input position of every layer, detached; None unless asked for, or
        where a layer did not record them all."""
        self.head_keys_values: KeysValues | None = None
        """Keys and values of the head's positions of every layer, `(1, kv heads, head length, head dim)`,
        with their autograd graph; None unless a head was given, or where a layer did not record it."""

    def __enter__(self) -> BackboneCapture:
        recording = self._record_contexts or self._head is not None
        recorder = ContextRecorder(self._backbone.config, record_all=self._record_contexts, head=self._head) if recording else None
        layers = self._backbone.config.num_hidden_layers

        def hand_recorder(_module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            return args, {**kwargs, "cache": recorder}

        def keep(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if self.hidden_states is not None:
                raise RuntimeError("the backbone ran twice in one loss computation; cannot tell the passes apart")
            self.hidden_states = output.last_hidden_state
            if recorder is not None:
                records, head_records = recorder.take()  # a layer that recorded did so over the whole input
                self.keys_values = [records[i] for i in range(layers)] if len(records) == layers else None
                self.head_keys_values = [head_records[i] for i in range(layers)] if len(head_records) == layers else None

        self._handles.append(self._backbone.register_forward_hook(keep))
        if recorder is not None:
            self._handles.append(self._backbone.register_forward_pre_hook(hand_recorder, with_kwargs=True))
            self._exits.enter_context(checkpointed_layers_keep_cache(self._backbone))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._exits.close()


@contextlib.contextmanager
def checkpointed_layers_keep_cache(backbone: torch.nn.Module) -> Iterator[None]:
    """Under activation checkpointing a layer drops the cache it is given unless it declares that its replay
    in the backward may see the cache again. A cache that stores nothing in `update` (`ContextRecorder`,
    `HeadCache`) gives the replay what the forward saw, so the layers of `backbone` may keep it while this
    context is open (it is read when a layer is called, not when it replays)."""
    opened = [
        layer for layer in backbone.modules()
        if isinstance(layer, GradientCheckpointingLayer) and not getattr(layer, "_can_checkpoint_with_cache", False)
    ]
    for layer in opened:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in opened:
            del layer._can_checkpoint_with_cache  # the class's own value again


class HeadCache(DynamicCache):
    """Keys and values of a prompt head that every row of a forward reads before its own tokens: each layer
    attends to the head, then to the row. Read-only: `update` stores nothing, so a checkpointed layer's
    replay sees the same keys, and the head's tensors keep their autograd graph (decision 079)."""

    def __init__(self, head_keys_values: KeysValues, rows: int) -> None:
        super().__init__(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in head_keys_values])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


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
