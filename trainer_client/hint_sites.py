"""Where the SDPO channel acts: the turns the policy got wrong, located in a rollout's tokens.

The environment records every tool call it served (`ToolCallRecord`). After a rollout, the trainer
reads each assistant turn (`turn_reports`): the service's error kinds for the calls that reached it,
a submission the hidden tests did not fully pass, and the failures TRL answers itself and the
service never sees (an unparsable call, an unknown tool, arguments that are not named parameters, a
turn with no call before the episode is over), each with a hint. `locate_hint_sites` puts the
failed turns into completion token coordinates, and `teacher_row` builds the teacher's input: per
turn k, the same tokens with a chat-templated hint message inserted just before turn k's assistant
header (all of a rollout's sites as continuations of its tokens: `packing`). Student and teacher
then score the identical tokens of turn k, position for position. Blame rules:
docs/decisions/063-hint-sites-at-every-policy-failure.md and 074; what else the teacher may read, and
the sites that makes (every turn that acted in a failed rollout), decision 129 (`teacher_contexts`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from env_server.models import ErrorKind
from trainer_client.packing import Continuation, PackedRow
from trainer_client.teacher_contexts import RAW_ERROR_CHARS, HintPlacement, HintSource, clamp


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call as the service answered it, in the order the environment served it."""

    tool_name: str
    error_kind: ErrorKind | None
    hint: str | None
    tests_passed: int | None = None
    """On the call that graded the workspace (`submit`, or the last step): hidden tests that passed."""
    tests_total: int | None = None
    """On the call that graded the workspace: hidden tests that count."""


@dataclass(frozen=True)
class HintSite:
    """An assistant turn the policy got wrong, with the hints for it, in completion token coordinates."""

    turn: int
    """Index of the assistant turn in the rollout (0 = the first reply)."""
    start: int
    """Completion index of the turn's first token."""
    end: int
    """Completion index one past the turn's last token."""
    hints: tuple[str, ...]
    """The hints of the turn's failures, in order."""
    hint_ids: tuple[int, ...]
    """The chat-templated hint message the teacher reads before the turn."""
    error_kinds: tuple[str, ...]
    """Error kinds of the turn's failed calls (for logging)."""
    token_mask: tuple[bool, ...] | None = None
    """Per token of the turn, whether SDPO distils it; None: every token (`call_tokens.content_sites`)."""

    @property
    def distilled_tokens(self) -> int:
        """How many of the turn's tokens SDPO distils."""
        return self.end - self.start if self.token_mask is None else sum(self.token_mask)


class HintTemplate:
    """Renders hints as chat messages in the policy's own template, as token ids.

    Both pieces are cut out of full renders (a conversation with and without the extra message),
    so they carry exactly the separators the template puts between messages. Rendered with the
    rollouts' `chat_template_kwargs`, as TRL renders the prompt and each tool round.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        role: str = "user",
        prefix: str = "Hint: ",
    ) -> None:
        self._tokenizer = tokenizer
        self._chat_template = chat_template
        # The rollouts' own template variables (TRL's `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`):
        # they change the assistant header, which must match the one in the rollout's tokens.
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
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
            **self._chat_template_kwargs,
        )
        return list(ids)

    @staticmethod
    def _suffix(prefix: list[int], full: list[int]) -> list[int]:
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template does not render a conversation as a prefix of its extension")
        return full[len(prefix) :]

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text (a message the teacher reads, for logs)."""
        return self._tokenizer.decode(list(ids))

    def message_ids(self, hints: Sequence[str], privileged: str | None = None) -> tuple[int, ...]:
        """Token ids of one message carrying `hints` (one per line), then the `privileged` context, if any."""
        content = "\n\n".join(part for part in ("\n".join(self._prefix + hint for hint in hints), privileged) if part)
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


ToolCall = tuple[str, dict[str, Any]]
"""A call as TRL hands it to an environment method: the tool's name and its keyword arguments."""


def environment_call(call: Mapping[str, Any], tool_names: Iterable[str]) -> ToolCall | None:
    """`(name, arguments)` when TRL's tool loop hands this parsed call to an environment method.

    TRL 1.16 runs `tools[name](**arguments)` for a `function` call of a known tool; anything else
    (another type, an unknown name, arguments that are not a mapping of names) it answers itself
    with an `{"error": ...}` tool message, and the environment never sees the call.
    """
    if call.get("type") != "function":
        return None
    name, arguments = call["function"]["name"], call["function"].get("arguments")
    if name not in tool_names or not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        return None
    return name, dict(arguments)


INFRASTRUCTURE_KINDS = frozenset({ErrorKind.SANDBOX_ERROR})
"""Service error kinds that are not the policy's doing: never a hint site."""

FORMAT_KINDS = frozenset({ErrorKind.JSON_DECODE, ErrorKind.TOOL_NOT_FOUND, ErrorKind.TYPE_ERROR, ErrorKind.NO_TOOL_CALL})
"""Kinds that mean the turn did not make a usable tool call (for the valid-call rate)."""

TRAINER_HINTS: dict[ErrorKind, str] = {
    ErrorKind.TOOL_NOT_FOUND: "That tool does not exist. Call one of: {tools}.",
    ErrorKind.JSON_DECODE: (
        "The tool call was not valid JSON. Write exactly one JSON object "
        '{{"name": <tool>, "arguments": {{...}}}} per call, with double-quoted keys and escaped quotes and newlines.'
    ),
    ErrorKind.TYPE_ERROR: "The arguments must be one JSON object of the tool's named parameters.",
    ErrorKind.NO_TOOL_CALL: (
        "This turn called no tool, so the episode ended unsubmitted. Every turn must call a tool ({tools}); "
        "call submit once the work is done."
    ),
    ErrorKind.SUBMISSION_FAILED: (
        "Submitting ended the episode, but the hidden tests did not all pass. Run the tests and fix what fails before you submit."
    ),
}
"""Hints for the failures the service never reports: those TRL answers itself, and a submission the hidden
tests did not fully pass (the service reports its reward, not an error; decisions 063 and 074)."""

MAX_ERROR_CHARS = 240
"""Longest error text quoted in a trainer-side hint."""


def _clamp(text: str, max_chars: int = MAX_ERROR_CHARS) -> str:
    return clamp(" ".join(text.split()), max_chars)


def _trainer_hint(kind: ErrorKind, tool_names: Iterable[str], error: str | None = None) -> str:
    hint = TRAINER_HINTS[kind].format(tools=", ".join(sorted(tool_names)))
    return f"{hint} Error: {_clamp(error)}" if error else hint


def _json_error(content: str, marker: str) -> str:
    """Why the text after the tool-call opener did not parse, with the offending text (clamped)."""
    body = content.split(marker, 1)[1]
    body = body.split(marker[:1] + "/" + marker[1:], 1)[0].strip()  # up to the closer, `</tool_call>`
    try:
        json.loads(body)
    except json.JSONDecodeError as error:
        return f"{error.msg} (char {error.pos}) in {body}"
    return f'not a call object with a "name" and an "arguments" object: {body}'


def _hidden_tests_failed(record: ToolCallRecord) -> int:
    """Hidden tests the call's grading failed (0 when it graded nothing)."""
    if record.tests_passed is None or record.tests_total is None:
        return 0
    return record.tests_total - record.tests_passed


@dataclass(frozen=True)
class TurnFailure:
    """One failure the policy caused in an assistant turn, with the hint its teacher reads."""

    kind: ErrorKind
    hint: str


@dataclass(frozen=True)
class TurnReport:
    """What one assistant turn did: how many tool calls it made and which of them failed."""

    calls: int
    """Tool calls TRL parsed out of the turn."""
    failures: tuple[TurnFailure, ...]

    @property
    def valid_call(self) -> bool:
        """The turn made at least one tool call and none was malformed."""
        return self.calls > 0 and not any(f.kind in FORMAT_KINDS for f in self.failures)


def turn_reports(
    records: Sequence[ToolCallRecord],
    messages: Sequence[dict[str, Any]],
    tool_names: set[str],
    *,
    episode_over: bool,
    last_turn_ended: bool,
    tool_call_marker: str = "<tool_call>",
) -> list[TurnReport] | None:
    """Per assistant turn, its calls and the failures it is blamed for (decision 063); None when the
    environment's records and the turns' calls do not line up.

    Args:
        records: The environment's calls in order.
        messages: The rollout's completion messages (assistant and tool), as TRL parsed them.
        tool_names: Names of the environment's tools.
        episode_over: The policy's calls ended the episode (submit or the step limit).
        last_turn_ended: The last turn ended with an end-of-turn token (not cut by the length budget).
        tool_call_marker: The text that opens a tool call in the chat template (Qwen2.5/Hermes: `<tool_call>`).
    """
    turns = [m for m in messages if m.get("role") == "assistant"]
    reports, cursor = [], 0
    for index, turn in enumerate(turns):
        last = index == len(turns) - 1
        calls = turn.get("tool_calls") or []
        environment_calls = sum(1 for call in calls if environment_call(call, tool_names) is not None)
        remaining = len(records) - cursor
        if last and remaining == 0:
            environment_calls = 0  # the tool-iteration limit: TRL stopped before running this turn's calls
        elif remaining < environment_calls or (last and remaining != environment_calls):
            return None
        turn_records = iter(records[cursor : cursor + environment_calls])
        cursor += environment_calls
        failures = []
        for call in calls:
            name = call.get("function", {}).get("name") if call.get("type") == "function" else None
            if name is None:
                error = f"unsupported tool call type {call.get('type')!r}"
                failures.append(TurnFailure(ErrorKind.TYPE_ERROR, _trainer_hint(ErrorKind.TYPE_ERROR, tool_names, error)))
            elif name not in tool_names:
                error = f"Tool {name!r} not found."
                failures.append(TurnFailure(ErrorKind.TOOL_NOT_FOUND, _trainer_hint(ErrorKind.TOOL_NOT_FOUND, tool_names, error)))
            elif environment_call(call, tool_names) is None:
                arguments = call["function"].get("arguments")
                error = f"{name} got arguments of type {type(arguments).__name__}: {json.dumps(arguments, default=str)}"
                failures.append(TurnFailure(ErrorKind.TYPE_ERROR, _trainer_hint(ErrorKind.TYPE_ERROR, tool_names, error)))
            elif environment_calls:
                record = next(turn_records)
                if record.error_kind is not None and record.error_kind not in INFRASTRUCTURE_KINDS and record.hint:
                    failures.append(TurnFailure(record.error_kind, record.hint))
                elif record.tool_name == "submit" and record.error_kind is None and (failed := _hidden_tests_failed(record)):
                    error = f"{failed} of {record.tests_total} hidden tests failed"
                    failures.append(
                        TurnFailure(ErrorKind.SUBMISSION_FAILED, _trainer_hint(ErrorKind.SUBMISSION_FAILED, tool_names, error))
                    )
        content = turn.get("content")
        if not calls and isinstance(content, str):
            # A last turn cut by the length budget is blamed only when it had the whole budget (the first
            # turn) and never opened a call; a cut call, or a late turn with little budget left, is not.
            cut = last and not last_turn_ended
            if tool_call_marker in content and not cut:
                error = _json_error(content, tool_call_marker)
                failures.append(TurnFailure(ErrorKind.JSON_DECODE, _trainer_hint(ErrorKind.JSON_DECODE, tool_names, error)))
            elif tool_call_marker not in content and not episode_over and (not cut or index == 0):
                failures.append(TurnFailure(ErrorKind.NO_TOOL_CALL, _trainer_hint(ErrorKind.NO_TOOL_CALL, tool_names)))
        reports.append(TurnReport(calls=len(calls), failures=tuple(failures)))
    return reports if cursor == len(records) else None


def locate_hint_sites(
    reports: Sequence[TurnReport],
    model_token_mask: Sequence[int],
    template: HintTemplate,
    *,
    sources: Collection[HintSource] = ("template",),
    answers: Sequence[str] = (),
    privileged: str | None = None,
) -> list[HintSite]:
    """Hint sites of one rollout, located in the completion's tokens: its failed turns, with what the
    feedback sources say of each, and, where the rollout has a `privileged` context, every turn
    (`teacher_contexts`, decision 129).

    Args:
        reports: The rollout's `turn_reports` (none: the rollout gets no sites).
        model_token_mask: Per completion token, 1 where the policy produced it (completion mask x tool mask).
        template: Renders the teacher's hint message.
        sources: The feedback sources read at a failed turn (`template`, `raw_error`); others are ignored here.
        answers: Per turn, the tool answers it got (`teacher_contexts.turn_answers`), for `raw_error`.
        privileged: The sibling's or reference solution, for a rollout that did not earn reward 1: every turn that
            acted (called a tool, or failed) becomes a site.
    """
    spans = assistant_turn_spans(model_token_mask)
    if len(spans) < len(reports):
        return []  # a malformed rollout: better no teacher signal than a misplaced one
    sites = []
    for turn, report in enumerate(reports):
        hints: list[str] = []
        if report.failures and "template" in sources:
            hints += [f.hint for f in report.failures]
        if report.failures and "raw_error" in sources and turn < len(answers) and answers[turn].strip():
            hints.append("The tool answered: " + clamp(answers[turn].strip(), RAW_ERROR_CHARS))
        # A privileged context teaches every turn that acted: one that called a tool or failed (a turn
        # of prose after the episode ended changes nothing).
        taught = privileged if report.calls or report.failures else None
        if not hints and taught is None:
            continue
        start, end = spans[turn]
        sites.append(
            HintSite(
                turn=turn,
                start=start,
                end=end,
                hints=tuple(hints),
                hint_ids=template.message_ids(hints, taught),
                error_kinds=tuple(f.kind.value for f in report.failures),
            )
        )
    return sites


def teacher_row(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    sites: Sequence[HintSite],
    header_ids: Sequence[int],
    placement: HintPlacement = "before_turn",
) -> PackedRow:
    """The teacher's input for a rollout's sites, one continuation per site (in order) that ends with the
    site's turn, token for token the student's.

    `before_turn`: the rollout's tokens cut before turn k's assistant header, then the hint message, the
    header and turn k. `after_prompt`: cut before the first turn's header, at the end of the task prompt,
    then the message, the header and the rollout up to the end of turn k. Sites that read the same message
    there share one chain of branches (the message, then the rollout up to each site), so a rollout's turns
    are run once per message, not once per site; each site's continuation is its turn after its branch."""
    context = [*prompt_ids, *completion_ids]
    header = list(header_ids)
    first_header = len(prompt_ids) - len(header)
    for site in sites:
        cut = len(prompt_ids) + site.start - len(header) if placement == "before_turn" else first_header
        if context[cut : cut + len(header)] != header:
            raise ValueError(f"turn {site.turn} is not preceded by the assistant header the chat template renders")
    if placement == "before_turn":
        continuations = [
            Continuation(len(prompt_ids) + site.start - len(header), [*site.hint_ids, *header, *completion_ids[site.start : site.end]])
            for site in sites
        ]
        return PackedRow(context, continuations)
    branches: list[Continuation] = []
    lengths: list[int] = []  # each branch's whole sequence
    chains: dict[tuple[int, ...], tuple[int, int]] = {}  # per message: its last branch, and where in the completion it ends
    continuations = []
    for site in sites:
        if site.hint_ids not in chains:
            branches.append(Continuation(first_header, [*site.hint_ids, *header, *completion_ids[: site.start]]))
            lengths.append(first_header + len(branches[-1].token_ids))
        else:
            branch, reached = chains[site.hint_ids]
            branches.append(Continuation(lengths[branch], list(completion_ids[reached : site.start]), branch=branch))
            lengths.append(lengths[branch] + site.start - reached)
        chains[site.hint_ids] = (len(branches) - 1, site.start)
        continuations.append(Continuation(lengths[-1], list(completion_ids[site.start : site.end]), branch=len(branches) - 1))
    return PackedRow(context, continuations, branches)
