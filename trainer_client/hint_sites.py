"""Where the SDPO channel acts: hinted tool errors, located in a rollout's tokens.

The environment records every tool call it served (`ToolCallRecord`). After a rollout, the trainer
maps those records onto the assistant turns of the completion (`locate_hint_sites`) and builds, per
hinted turn k, the teacher's input: the same tokens with a chat-templated hint message inserted just
before turn k's assistant header (`teacher_sequence`). Student and teacher then score the identical
tokens of turn k, position for position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from env_server.models import ErrorKind


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call as the service answered it, in the order the environment served it."""

    tool_name: str
    error_kind: ErrorKind | None
    hint: str | None


@dataclass(frozen=True)
class HintSite:
    """An assistant turn whose tool call failed with a hint, in completion token coordinates."""

    turn: int
    """Index of the assistant turn in the rollout (0 = the first reply)."""
    start: int
    """Completion index of the turn's first token."""
    end: int
    """Completion index one past the turn's last token."""
    hint_ids: tuple[int, ...]
    """The chat-templated hint message the teacher reads before the turn."""
    error_kinds: tuple[str, ...]
    """Error kinds of the turn's failed calls (for logging)."""


class HintTemplate:
    """Renders hints as chat messages in the policy's own template, as token ids.

    Both pieces are cut out of full renders (a conversation with and without the extra message),
    so they carry exactly the separators the template puts between messages.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        role: str = "user",
        prefix: str = "Hint: ",
    ) -> None:
        self._tokenizer = tokenizer
        self._chat_template = chat_template
        self._role = role
        self._prefix = prefix
        self._anchor = [{"role": "user", "content": "."}]
        anchor_ids = self._render(self._anchor, add_generation_prompt=False)
        with_header = self._render(self._anchor, add_generation_prompt=True)
        self._anchor_ids = anchor_ids
        self.header_ids: tuple[int, ...] = tuple(self._suffix(anchor_ids, with_header))
        """Tokens that open an assistant turn (the generation prompt)."""

    def _render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> list[int]:
        ids = self._tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
            chat_template=self._chat_template,
        )
        return list(ids)

    @staticmethod
    def _suffix(prefix: list[int], full: list[int]) -> list[int]:
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template does not render a conversation as a prefix of its extension")
        return full[len(prefix) :]

    def message_ids(self, hints: Sequence[str]) -> tuple[int, ...]:
        """Token ids of one message carrying `hints` (one per line)."""
        content = "\n".join(self._prefix + hint for hint in hints)
        full = self._render([*self._anchor, {"role": self._role, "content": content}], add_generation_prompt=False)
        return tuple(self._suffix(self._anchor_ids, full))


def assistant_turn_spans(model_token_mask: Sequence[int]) -> list[tuple[int, int]]:
    """`[start, end)` of each run of policy tokens (mask 1) in a completion: one per assistant turn."""
    spans = []
    start = None
    for index, flag in enumerate(model_token_mask):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            spans.append((start, index))
            start = None
    if start is not None:
        spans.append((start, len(model_token_mask)))
    return spans


def environment_calls_per_turn(messages: Sequence[dict[str, Any]], tool_names: set[str]) -> list[int]:
    """For each assistant message, how many of its tool calls reached the environment.

    Mirrors the trainer's tool loop: calls of an unknown tool or of a non-function type are answered
    by the trainer itself and never produce a `ToolCallRecord`.
    """
    counts = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        counts.append(
            sum(1 for call in calls if call.get("type") == "function" and call["function"]["name"] in tool_names)
        )
    return counts


def locate_hint_sites(
    records: Sequence[ToolCallRecord],
    messages: Sequence[dict[str, Any]],
    tool_names: set[str],
    model_token_mask: Sequence[int],
    template: HintTemplate,
) -> list[HintSite]:
    """Hint sites of one rollout, or none when records, messages and tokens do not line up.

    Args:
        records: The environment's calls in order.
        messages: The rollout's completion messages (assistant and tool), as the trainer parsed them.
        tool_names: Names of the environment's tools.
        model_token_mask: Per completion token, 1 where the policy produced it (completion mask x tool mask).
        template: Renders the teacher's hint message.
    """
    calls_per_turn = environment_calls_per_turn(messages, tool_names)
    spans = assistant_turn_spans(model_token_mask)
    if sum(calls_per_turn) != len(records) or len(spans) < len(calls_per_turn):
        return []  # a truncated or malformed rollout: better no teacher signal than a misplaced one
    sites = []
    cursor = 0
    for turn, count in enumerate(calls_per_turn):
        turn_records = records[cursor : cursor + count]
        cursor += count
        hinted = [r for r in turn_records if r.hint]
        if not hinted:
            continue
        start, end = spans[turn]
        sites.append(
            HintSite(
                turn=turn,
                start=start,
                end=end,
                hint_ids=template.message_ids([r.hint for r in hinted]),
                error_kinds=tuple(r.error_kind.value if r.error_kind else "none" for r in hinted),
            )
        )
    return sites


def teacher_sequence(
    prompt_ids: Sequence[int], completion_ids: Sequence[int], site: HintSite, header_ids: Sequence[int]
) -> list[int]:
    """The teacher's input for one site: the context up to turn k, the hint message, the header, turn k.

    The last `site.end - site.start` tokens are turn k's tokens, identical to the student's.
    """
    context = [*prompt_ids, *completion_ids[: site.start]]
    header = list(header_ids)
    if context[len(context) - len(header) :] != header:
        raise ValueError(f"turn {site.turn} is not preceded by the assistant header the chat template renders")
    return [*context[: len(context) - len(header)], *site.hint_ids, *header, *completion_ids[site.start : site.end]]
