"""The DPO channel's data: preference pairs, tokenized once, served as cycling mini-batches.

A pair becomes two sequences sharing a context: `context + chosen` and `context + rejected`
(batched as two rows, or in one prefix-tree row with the mini-batch's other pairs, every shared token
run once: `collate(shared_prefix=True)`, decision 079). Pairs taken at consecutive states of one trace
have contexts that extend one another; by default a mini-batch is drawn from such a chain (decision 078). Pairs are rendered by the policy's chat template with the rollouts'
`chat_template_kwargs`, tools (the pair's own, or else the training environment's) and, where given,
system prompt (in place of the traced agent's). A context
too long for `max_length` loses its oldest exchanges, never its system prompt, its tools or the
task's first message. Only the assistant message's tokens are scored, and by default only up to the last token
where the two actions differ (`PairTokens`, decision 134). Under several processes each rank holds its own shard of
the pairs (`rank_shard`). The reference model's log-probs of both are computed by the trainer at
the first DPO loss and whenever the reference changes (`reference_logps`), and kept with the pairs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from trainer_client.packing import Continuation, PackedBatch, PackedRow, add_context, common_prefix_length, pack, shares_enough
from trainer_client.records import PreferencePair


PairTokens = Literal["differing", "all"]
"""Which tokens of a pair's two actions DPO scores: `differing`, each action up to its last token that the two do
not end with in common (`without_common_ending`); `all`, both whole."""


def without_common_ending(chosen: Sequence[int], rejected: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The two actions without the tokens they end with in common (decision 134).

    A pair that differs by an edit (a missing colon, a misspelt command) shares the rest of its action, each
    copy after its own version of the edit. Scored there, DPO pushes the rejected copy down, and a small policy
    lets that fall on the chosen copy too: the preferred action loses the very tokens it shares with the
    mistake (likelihood displacement, Razin et al. 2024). Cut, the pair says only what it knows: which edit is
    preferred. Each action keeps at least its first token past the common start, where the two choices part,
    so an action that only lacks tokens of the other still has one to score. The common start is kept: its
    log-probs are the same in both actions and cancel in DPO's margin."""
    start = common_prefix_length(chosen, rejected)
    ending, room = 0, min(len(chosen), len(rejected)) - start
    while ending < room and chosen[-1 - ending] == rejected[-1 - ending]:
        ending += 1
    return tuple(chosen[: max(start + 1, len(chosen) - ending)]), tuple(rejected[: max(start + 1, len(rejected) - ending)])


def load_preference_pairs(path: str | Path) -> list[PreferencePair]:
    """Read a pairs JSONL file (one `PreferencePair` per line; blank lines skipped)."""
    pairs = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                pairs.append(PreferencePair.model_validate_json(line))
            except ValueError as error:
                raise ValueError(f"{path}:{number}: not a PreferencePair: {error}") from error
    if not pairs:
        raise ValueError(f"{path}: no preference pairs")
    return pairs


def rank_shard(count: int, rank: int, world_size: int) -> list[int]:
    """The indices of the pairs rank `rank` of `world_size` trains on: every `world_size`-th pair from
    `rank`, the list of all pairs first padded by wrapping around (as torch's `DistributedSampler`).

    Shards are disjoint but for the padding and all the same size, so every rank runs as many DPO
    mini-batches and reference forwards as the others (ZeRO-3 / FSDP gather parameters in each forward:
    a rank with one forward more would wait forever).
    """
    if count < 1:
        raise ValueError("no pairs to shard")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    padded = [index % count for index in range(math.ceil(count / world_size) * world_size)]
    return padded[rank::world_size]


def _with_parsed_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI messages carry tool-call arguments as JSON strings; chat templates expect objects."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        function = dict(call.get("function", call))
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass  # keep the raw text: the template renders it as the model wrote it
        parsed.append({"type": "function", "function": function})
    return {**message, "tool_calls": parsed}


def _without_oldest_exchange(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The history less its oldest assistant turn and that turn's tool results; the head (system
    prompt and the task's first user message) always stays. None when nothing is left to drop."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    if head < len(messages) and messages[head].get("role") == "user":
        head += 1
    turns = [i for i in range(head, len(messages)) if messages[i].get("role") == "assistant"]
    if not turns:
        return None
    end = turns[1] if len(turns) > 1 else len(messages)  # up to the next assistant turn
    return [*messages[:head], *messages[end:]]


def _with_system_messages(messages: list[dict[str, Any]], system: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` opening with `system` instead of their own leading system messages: a replayed state in
    the context a rollout starts from, whose system prompt is the training prompt's (or, with none, the
    chat template's default), not the one the traced agent ran with."""
    own = 0
    while own < len(messages) and messages[own].get("role") == "system":
        own += 1
    return [*system, *messages[own:]]


def _extends(context: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(prefix) <= len(context) and context[: len(prefix)] == prefix


def context_chains(contexts: Sequence[tuple[int, ...]]) -> list[list[int]]:
    """Positions of `contexts` in chains, each context extending the one before it in its chain
    (consecutive states of one trace), shortest first; every position in exactly one chain.

    Sorted as tuples, a context comes right before the contexts that extend it (anything sorted between
    a prefix and its extension extends the prefix too), so one pass over the sorted order finds them.
    Where a trace branches (two runs of one task), each branch after the first starts a chain of its own.
    """
    chains: list[list[int]] = []
    for position in sorted(range(len(contexts)), key=contexts.__getitem__):
        if chains and _extends(contexts[position], contexts[chains[-1][-1]]):
            chains[-1].append(position)
        else:
            chains.append([position])
    return chains


@dataclass(frozen=True)
class TokenizedPair:
    """One pair as token ids; chosen and rejected are the assistant message, end-of-turn token included."""

    context_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


class PreferenceBatches:
    """One rank's shard of the pairs, tokenized, with their cached reference log-probs, served in
    shuffled mini-batches. `pairs` and `reference_logps` are indexed by position in the shard."""

    def __init__(
        self,
        pairs: Sequence[PreferencePair],
        tokenizer: Any,
        *,
        batch_size: int,
        max_length: int,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Any] | None = None,
        system_messages: Sequence[Mapping[str, Any]] | None = None,
        group_by_context: bool = True,
        tokens: PairTokens = "differing",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not pairs:
            raise ValueError("the DPO channel needs at least one preference pair")
        self.pair_ids = rank_shard(len(pairs), rank, world_size)
        """Index in the full pair list of each pair of this rank's shard."""
        self._tokenizer = tokenizer
        self._chat_template = chat_template
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
        self._tools = list(tools or [])
        self._system_messages = None if system_messages is None else [dict(m) for m in system_messages]
        """Given, they replace a pair's own leading system messages (`_with_system_messages`)."""
        self._max_length = max_length
        self._tokens = tokens
        self.batch_size = min(batch_size, len(self.pair_ids))
        self.pairs = [self._tokenize(pairs[index]) for index in self.pair_ids]
        self.chains = (
            context_chains([pair.context_ids for pair in self.pairs])
            if group_by_context
            else [[position] for position in range(len(self.pairs))]
        )
        """Positions of the shard's pairs in the chains a pass serves whole (`context_chains`); with
        `group_by_context` off, one chain per pair."""
        self.reference_logps: torch.Tensor | None = None
        """`(shard pairs, 2)` reference log-probs of (chosen, rejected); None until the trainer computes
        them, and again whenever the reference changes (trust-region DPO)."""
        self._generator = torch.Generator().manual_seed(seed)
        self._order: Iterator[int] = iter(())

    def _render(
        self, messages: list[dict[str, Any]], tools: list[Any], *, add_generation_prompt: bool, tokenize: bool = True
    ) -> Any:
        return self._tokenizer.apply_chat_template(
            [_with_parsed_arguments(m) for m in messages],
            tools=tools or None,  # as TRL renders a rollout's prompt
            add_generation_prompt=add_generation_prompt,
            tokenize=tokenize,
            return_dict=False,
            chat_template=self._chat_template,
            **self._chat_template_kwargs,
        )

    def _assistant_ids(self, messages: list[dict[str, Any]], tools: list[Any], action: dict[str, Any]) -> list[int]:
        """The tokens the model writes for `action` after the context's generation prompt.

        Cut as text and tokenized on its own, as a rollout's completion is generated after its prompt:
        cutting the full render's ids instead would merge tokens across the boundary (`</think>` + `\n\n`
        + `<tool_call>` where those are not special tokens).
        """
        context = self._render(messages, tools, add_generation_prompt=True, tokenize=False)
        full = self._render([*messages, {**action, "role": "assistant"}], tools, add_generation_prompt=False, tokenize=False)
        if not full.startswith(context):
            raise ValueError("the chat template does not render the context as a prefix of context + action")
        action_ids = self._tokenizer.encode(full[len(context) :], add_special_tokens=False)
        eos = self._tokenizer.eos_token_id
        if eos in action_ids:  # drop what the template writes after the end-of-turn token (a newline)
            action_ids = action_ids[: len(action_ids) - action_ids[::-1].index(eos)]
        return action_ids

    def _tokenize(self, pair: PreferencePair) -> TokenizedPair:
        tools = self._tools if pair.tools is None else pair.tools
        messages = pair.messages if self._system_messages is None else _with_system_messages(pair.messages, self._system_messages)
        chosen = self._assistant_ids(messages, tools, pair.chosen)
        rejected = self._assistant_ids(messages, tools, pair.rejected)
        if self._tokens == "differing":
            chosen, rejected = without_common_ending(chosen, rejected)
        budget = self._max_length - max(len(chosen), len(rejected))
        context = list(self._render(messages, tools, add_generation_prompt=True))
        while len(context) > budget:
            messages = _without_oldest_exchange(messages)
            if messages is None:
                raise ValueError(
                    f"pair {pair.state_id}: the system prompt, tools, task and action alone exceed "
                    f"dpo_max_length={self._max_length}"
                )
            context = list(self._render(messages, tools, add_generation_prompt=True))
        return TokenizedPair(tuple(context), tuple(chosen), tuple(rejected))

    def grouped_indices(self) -> list[int]:
        """Every pair of the shard once, the pairs of a context chain next to one another."""
        return [index for chain in self.chains for index in chain]

    def next_indices(self) -> list[int]:
        """The next mini-batch of pair indices. Each pass serves every pair once: the context chains in
        a fresh random order, each chain's pairs in a row (with `group_by_context` off, every pair is a
        chain of its own: a plain shuffle)."""
        indices = []
        while len(indices) < self.batch_size:
            try:
                indices.append(next(self._order))
            except StopIteration:
                order = torch.randperm(len(self.chains), generator=self._generator).tolist()
                self._order = iter([index for chain in order for index in self.chains[chain]])
        return indices

    def collate(self, indices: Sequence[int], pad_token_id: int, *, shared_prefix: bool = False) -> PackedBatch:
        """The pairs of `indices` as one batch, continuations in the order of `indices`: per pair, its
        context continued by the chosen action, then by the rejected one. With `shared_prefix` a pair
        joins the previous pair's row where its context shares enough with one there (`shares_enough`:
        the system prompt and tools of every state, a trace's history between its states): the row is a
        prefix tree, each shared token runs once and each action follows its own pair's context
        (decision 079). Otherwise one row per sequence."""
        rows: list[PackedRow] = []
        for index in indices:
            pair = self.pairs[index]
            context, actions = pair.context_ids, (pair.chosen_ids, pair.rejected_ids)
            if shared_prefix and rows and shares_enough(rows[-1], context):
                rows[-1] = add_context(rows[-1], context, actions)
            else:
                rows.append(PackedRow(context, [Continuation(len(context), action) for action in actions]))
        return pack(rows, pad_token_id, shared=shared_prefix)
