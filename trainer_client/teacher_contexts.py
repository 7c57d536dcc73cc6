"""What the SDPO teacher reads at a hint site that the student did not: its hint sources (decision 129).

Two kinds of source, told apart by which turns they make sites:

- **Feedback** (`template`, `raw_error`): about one turn's failure, so a site is a turn the policy got
  wrong (decisions 063, 074). `template` is the hint the service (or the trainer, for what TRL answers
  itself) wrote for the failure; `raw_error` is the tool answer the turn got, verbatim and clamped.
- **Privileged** (`sibling`, `reference`): about the task, so every turn of a rollout that did not earn
  reward 1 is a site, the turn that wrote the code as much as the one that submitted. `sibling` is a
  rollout of the same GRPO group that earned 1: the calls it made. `reference` is the task's reference
  solution as a diff (`GET /references/...`, with the service's privileged token).

The teacher reads them in one message, at a placement: just before the turn's assistant header
(`before_turn`), or right after the task prompt, before the first turn (`after_prompt`), where it
reads the rest of the rollout after it. None of it ever enters the policy's context, the sandbox or
an observation: the message is spliced into the teacher's copy of the tokens only (`hint_sites.teacher_row`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from env_server.models import TaskReference

HintSource = Literal["template", "raw_error", "sibling", "reference"]
HINT_SOURCES: tuple[HintSource, ...] = get_args(HintSource)
FEEDBACK_SOURCES: frozenset[HintSource] = frozenset({"template", "raw_error"})
PRIVILEGED_SOURCES: frozenset[HintSource] = frozenset({"sibling", "reference"})

HintPlacement = Literal["before_turn", "after_prompt"]
HINT_PLACEMENTS: tuple[HintPlacement, ...] = get_args(HintPlacement)

RAW_ERROR_CHARS = 600
"""Longest tool answer quoted by the `raw_error` source (the head: where a traceback names the call)."""
PRIVILEGED_CHARS = 6000
"""Longest sibling solution or reference diff the teacher reads (about 1,500 tokens)."""


def hint_sources(names: Sequence[str]) -> tuple[HintSource, ...]:
    """`names` checked against `HINT_SOURCES`, deduplicated in order; ValueError for an unknown or empty list."""
    unknown = [name for name in names if name not in HINT_SOURCES]
    if unknown or not names:
        raise ValueError(f"hint sources must be a non-empty list of {', '.join(HINT_SOURCES)}; got {list(names)}")
    return tuple(dict.fromkeys(names))  # type: ignore[arg-type]


def clamp(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars`, marked where it was cut."""
    return text if len(text) <= max_chars else text[: max_chars - 10].rstrip() + " [...cut]"


def turn_answers(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Per assistant turn of a completion, the text of the tool messages that answered it ("" for none)."""
    answers: list[list[str]] = []
    for message in messages:
        if message.get("role") == "assistant":
            answers.append([])
        elif message.get("role") == "tool" and answers:
            content = message.get("content")
            answers[-1].append(content if isinstance(content, str) else str(content))
    return ["\n".join(parts) for parts in answers]


def solution_calls(messages: Sequence[dict[str, Any]]) -> str:
    """A rollout's tool calls (but `submit`), one `<tool_call>` line each, as the policy writes them."""
    # The format the service reads from the policy; imported here because `environment` imports
    # `hint_sites`, which imports this module.
    from trainer_client.environment import turn_message

    calls = [
        (call["function"]["name"], call["function"].get("arguments") or {})
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
        if call.get("type") == "function" and call["function"].get("name") != "submit"
    ]
    return turn_message([(name, arguments if isinstance(arguments, dict) else {"_": arguments}) for name, arguments in calls])


def sibling_solutions(rewards: Sequence[float], solutions: Sequence[str], group_size: int) -> list[str | None]:
    """Per rollout, the solution of the first rollout of its GRPO group (consecutive runs of `group_size`)
    that earned reward 1, where the rollout itself did not; None otherwise."""
    if group_size < 1 or len(rewards) != len(solutions) or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards and {len(solutions)} solutions do not make groups of {group_size}")
    siblings: list[str | None] = []
    for start in range(0, len(rewards), group_size):
        group = range(start, start + group_size)
        winner = next((index for index in group if rewards[index] >= 1.0), None)
        siblings += [solutions[winner] if winner is not None and rewards[index] < 1.0 else None for index in group]
    return siblings


def reference_text(reference: TaskReference) -> str:
    """What the `reference` source reads of a task's reference: its diff, and its command where it has one."""
    command = f"Then run: {reference.command}\n" if reference.command else ""
    return reference.diff + command


def privileged_context(sibling: str | None, reference: str | None) -> str | None:
    """The privileged part of the teacher's message: a successful sibling's calls and/or the reference
    diff, each clamped; None when there is neither."""
    parts = []
    if sibling:
        parts.append("A successful attempt at this task made these tool calls:\n" + clamp(sibling, PRIVILEGED_CHARS))
    if reference:
        parts.append("A reference solution to this task, as a diff of the workspace:\n" + clamp(reference, PRIVILEGED_CHARS))
    return "\n\n".join(parts) or None
