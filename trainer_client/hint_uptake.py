"""`coding-train hint-uptake`: how far each hint source moves the SDPO teacher from the student, and which way.

A policy's episodes are sampled through the service as `coding-train eval` plays them (`evaluation.Evaluator`),
`n` per task: a task's episodes are one group, as a GRPO group is. Then, for each hint source and placement
(`teacher_contexts`), the sites the trainer would make (`hint_sites.locate_hint_sites`) are scored twice on
the tokens the policy sampled there: by the student (the policy on the episode as it was) and by the teacher
(the same weights reading the site's message, `hint_sites.teacher_row`). Per source and placement:

- **JSD per token**: the generalized JSD the SDPO loss minimises (beta 0.5): how much signal there is;
- **change in log-probability per token** of the sampled turn, teacher minus student: which way it points.

Both split by the episode's outcome, and each also over the turn's schema tokens and its content tokens
apart (`call_tokens`: which call, against what it says; decision 132). A teacher that knows better lowers
the log-probability of turns of episodes that failed, and leaves that of episodes that passed alone. To measure that second half, the
privileged sources are also read at the passing episodes' turns here (the trainer does not make those
sites): their sibling is another passing episode of the task, where there is one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from env_server.models import ErrorKind, TaskReference
from trainer_client.call_tokens import TurnTokenClasses
from trainer_client.evaluation import Episode, bootstrap_interval
from trainer_client.hint_sites import HintSite, HintTemplate, TurnFailure, TurnReport, locate_hint_sites, teacher_row
from trainer_client.losses import generalized_jsd
from trainer_client.teacher_contexts import (
    FEEDBACK_SOURCES,
    HintPlacement,
    HintSource,
    privileged_context,
    reference_text,
    solution_calls,
    turn_answers,
)


class SampledEpisode(BaseModel):
    """What uptake needs of one sampled episode (a line of `episodes.jsonl`: scored again without sampling)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    sample: int
    reward: float
    context: list[int]
    prompt_length: int
    policy_mask: list[int]
    completion: list[dict[str, Any]]
    reports: list[tuple[int, list[tuple[str, str]]]]
    """Per turn: its call count and failures as `(error kind, hint)`."""
    reference: TaskReference | None = None

    @classmethod
    def of(cls, episode: Episode, reference: TaskReference | None = None) -> SampledEpisode:
        """What uptake keeps of an evaluated episode, with its task's reference where the `reference` source is measured."""
        return cls(
            task_id=episode.task_id,
            sample=episode.sample,
            reward=episode.reward or 0.0,
            context=episode.context,
            prompt_length=episode.prompt_length,
            policy_mask=episode.policy_mask,
            completion=episode.completion,
            reports=[(r.calls, [(f.kind.value, f.hint) for f in r.failures]) for r in episode.reports],
            reference=reference,
        )

    @property
    def passed(self) -> bool:
        """Every hidden check passed (reward 1), as `coding-train eval` counts a pass."""
        return self.reward >= 1.0

    def turn_reports(self) -> list[TurnReport]:
        """The episode's `TurnReport`s, as the trainer judged its turns."""
        return [TurnReport(calls, tuple(TurnFailure(ErrorKind(kind), hint) for kind, hint in failures)) for calls, failures in self.reports]


@dataclass(frozen=True)
class SiteScore:
    """One site's teacher against student, summed over its tokens."""

    source: str
    placement: str
    passed: bool
    """The site's episode passed (reward 1)."""
    task_id: str
    sample: int
    turn: int
    message: str
    """What the teacher read before the turn (decoded), and the student never did."""
    tokens: int
    jsd: float
    logp_change: float
    """Sum over the turn's tokens of the teacher's log-probability minus the student's."""
    content_tokens: int
    """Of `tokens`, those of the turn's content (`call_tokens`); the rest are its schema."""
    content_jsd: float
    content_logp_change: float

    def figure(self, name: str, tokens: TokenClass) -> float:
        """`tokens`, `jsd` or `logp_change` summed over the turn's tokens of one class."""
        whole, content = getattr(self, name), getattr(self, f"content_{name}")
        return {"all": whole, "content": content, "schema": whole - content}[tokens]


TokenClass = Literal["all", "schema", "content"]


def privileged_message(source: HintSource, episode: SampledEpisode, group: Sequence[SampledEpisode]) -> str | None:
    """What a privileged source tells the teacher at `episode`'s turns (None: nothing to tell)."""
    if source == "reference":
        return privileged_context(None, reference_text(episode.reference)) if episode.reference is not None else None
    sibling = next((other for other in group if other.passed and other.sample != episode.sample), None)
    return privileged_context(solution_calls(sibling.completion), None) if sibling is not None else None


def episode_sites(
    episode: SampledEpisode, group: Sequence[SampledEpisode], source: HintSource, template: HintTemplate
) -> list[HintSite]:
    """The sites `source` makes in an episode (privileged ones whatever its outcome: see the module docstring)."""
    completion_mask = episode.policy_mask
    reports = episode.turn_reports()
    if source in FEEDBACK_SOURCES:
        return locate_hint_sites(reports, completion_mask, template, sources=(source,), answers=turn_answers(episode.completion))
    message = privileged_message(source, episode, group)
    return locate_hint_sites(reports, completion_mask, template, sources=(), privileged=message) if message else []


@torch.no_grad()
def score_episode(
    model: torch.nn.Module,
    episode: SampledEpisode,
    group: Sequence[SampledEpisode],
    sources: Sequence[HintSource],
    placements: Sequence[HintPlacement],
    template: HintTemplate,
    classes: TurnTokenClasses,
) -> list[SiteScore]:
    """Every site of the episode, for each source and placement, scored by teacher and student.

    The student's forward over the episode runs once, and its keys and values are every teacher's
    context: a teacher's sequence (`teacher_row`'s, whole) runs after them from where it leaves the
    episode's tokens (the cache cropped there, cuts taken from the last to the first). Sequences with the
    same cut and message (a source read after the prompt) are prefixes of the longest, which runs alone for all."""
    device = next(model.parameters()).device
    context = episode.context
    prompt, completion = context[: episode.prompt_length], context[episode.prompt_length :]
    groups: dict[tuple[int, tuple[int, ...]], list[tuple[HintSite, list[int], str, str]]] = {}
    for source in sources:
        sites = episode_sites(episode, group, source, template)
        for placement in placements if sites else ():
            row = teacher_row(prompt, completion, sites, template.header_ids, placement)
            for site, continuation in zip(sites, row.continuations):
                sequence = [*row.sequence(continuation.branch)[: continuation.cut], *continuation.token_ids]
                cut = next(index for index, (mine, theirs) in enumerate(zip(sequence, context)) if mine != theirs)
                groups.setdefault((cut, site.hint_ids), []).append((site, sequence[cut:], source, placement))
    if not groups:
        return []
    forward = model(input_ids=torch.tensor([context], device=device), use_cache=True)
    student_logits, cache = forward.logits[0].float(), forward.past_key_values
    scores = []
    for (cut, _), members in sorted(groups.items(), key=lambda item: -item[0][0]):
        longest = max((tokens for _, tokens, _, _ in members), key=len)
        cache.crop(cut - cache.get_seq_length())  # a negative count: the tokens to drop
        teacher_logits = model(input_ids=torch.tensor([longest], device=device), past_key_values=cache, use_cache=True).logits[0].float()
        for site, tokens, source, placement in members:
            if longest[: len(tokens)] != tokens:
                raise ValueError("continuations with one cut and one message must extend one another")
            turn = site.end - site.start
            teacher = teacher_logits[len(tokens) - turn - 1 : len(tokens) - 1]  # the logits at t predict token t + 1
            first = episode.prompt_length + site.start
            student = student_logits[first - 1 : first - 1 + turn]
            sampled = torch.tensor(completion[site.start : site.end], device=device)[:, None]
            change = (teacher.log_softmax(-1).gather(1, sampled) - student.log_softmax(-1).gather(1, sampled))[:, 0]
            jsd = generalized_jsd(student, teacher, beta=0.5, reduction="none")
            content = torch.tensor(classes.content_mask(completion[site.start : site.end]), device=device)
            scores.append(
                SiteScore(source, placement, episode.passed, episode.task_id, episode.sample, site.turn,
                          template.decode(site.hint_ids), turn, float(jsd.sum()), float(change.sum()),
                          int(content.sum()), float(jsd[content].sum()), float(change[content].sum()))
            )
    return scores


def _figures(chosen: Sequence[SiteScore], tokens: TokenClass, seed: int) -> dict[str, Any]:
    """Tokens, and JSD and log-probability change per token with 95% bootstrap intervals over tasks, of `chosen`
    sites' tokens of one class."""
    tasks = sorted({s.task_id for s in chosen})
    counts = [sum(s.figure("tokens", tokens) for s in chosen if s.task_id == task) for task in tasks]
    figures: dict[str, Any] = {"tokens": sum(counts)}
    for name in ("jsd", "logp_change"):
        per_task = [sum(s.figure(name, tokens) for s in chosen if s.task_id == task) / count if count else 0.0 for task, count in zip(tasks, counts)]
        total = sum(s.figure(name, tokens) for s in chosen)
        measured = sum(counts) > 0
        figures[name] = {
            "per_token": total / sum(counts) if measured else None,
            "ci95": bootstrap_interval(per_task, counts, seed=seed) if measured else None,
        }
    return figures


def uptake_table(scores: Sequence[SiteScore], *, seed: int = 0) -> list[dict[str, Any]]:
    """Per source and placement, and per outcome: sites, tokens, JSD and log-probability change per token, each
    with a 95% bootstrap interval over tasks (the unit sampled); the same over the turns' schema and content
    tokens apart under `by_tokens`."""
    rows = []
    keys = dict.fromkeys((score.source, score.placement) for score in scores)
    for source, placement in keys:
        row: dict[str, Any] = {"source": source, "placement": placement}
        for outcome, passed in (("failing", False), ("passing", True)):
            chosen = [s for s in scores if (s.source, s.placement, s.passed) == (source, placement, passed)]
            row[outcome] = {"sites": len(chosen), **_figures(chosen, "all", seed)}
            row[outcome]["by_tokens"] = {tokens: _figures(chosen, tokens, seed) for tokens in ("schema", "content")}
        rows.append(row)
    return rows


def _cell(figures: dict[str, Any], name: str) -> str:
    value = figures[name]["per_token"]
    if value is None:
        return "-"
    low, high = figures[name]["ci95"]
    return f"{value:+.4f} [{low:+.4f}, {high:+.4f}]" if name == "logp_change" else f"{value:.4f} [{low:.4f}, {high:.4f}]"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The uptake tables as docs/benchmarks.md shows them: over whole turns, then over schema and content tokens."""
    lines = [
        "| source | placement | sites (tokens), failing / passing | JSD per token, failing | JSD per token, passing "
        "| log-prob change per token, failing | log-prob change per token, passing |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        failing, passing = row["failing"], row["passing"]
        lines.append(
            f"| {row['source']} | {row['placement']} | {failing['sites']} ({failing['tokens']}) / {passing['sites']} ({passing['tokens']}) "
            f"| {_cell(failing, 'jsd')} | {_cell(passing, 'jsd')} | {_cell(failing, 'logp_change')} | {_cell(passing, 'logp_change')} |"
        )
    lines += [
        "",
        "| source | placement | tokens | tokens, failing / passing | JSD per token, failing | JSD per token, passing "
        "| log-prob change per token, failing | log-prob change per token, passing |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for tokens in ("schema", "content"):
            failing, passing = row["failing"]["by_tokens"][tokens], row["passing"]["by_tokens"][tokens]
            lines.append(
                f"| {row['source']} | {row['placement']} | {tokens} | {failing['tokens']} / {passing['tokens']} "
                f"| {_cell(failing, 'jsd')} | {_cell(passing, 'jsd')} | {_cell(failing, 'logp_change')} | {_cell(passing, 'logp_change')} |"
            )
    return "\n".join(lines) + "\n"


def read_episodes(path: Path) -> list[SampledEpisode]:
    """The episodes of an `episodes.jsonl` (`write_episodes`)."""
    with open(path, encoding="utf-8") as handle:
        return [SampledEpisode.model_validate_json(line) for line in handle if line.strip()]


def write_episodes(episodes: Sequence[SampledEpisode], path: Path) -> None:
    """One JSON line per episode, read back by `read_episodes` (`--episodes`: scored again without sampling)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for episode in episodes:
            handle.write(episode.model_dump_json() + "\n")


def measure(
    model: torch.nn.Module,
    tokenizer: Any,
    episodes: Sequence[SampledEpisode],
    sources: Sequence[HintSource],
    placements: Sequence[HintPlacement],
) -> list[SiteScore]:
    """Every episode's sites scored; a task's episodes are one group (for the sibling source)."""
    template = HintTemplate(tokenizer)
    classes = TurnTokenClasses(tokenizer)
    groups: dict[str, list[SampledEpisode]] = {}
    for episode in episodes:
        groups.setdefault(episode.task_id, []).append(episode)
    return [
        score
        for episode in episodes
        for score in score_episode(model, episode, groups[episode.task_id], sources, placements, template, classes)
    ]


def write_report(rows: Sequence[dict[str, Any]], scores: Sequence[SiteScore], out: Path, meta: dict[str, Any]) -> str:
    """`uptake.json`, `uptake.md` and `sites.jsonl` (every scored site, with what its teacher read) in `out`;
    returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sites.jsonl", "w", encoding="utf-8") as handle:
        for score in scores:
            handle.write(json.dumps(asdict(score), ensure_ascii=False) + "\n")
    (out / "uptake.json").write_text(json.dumps({"meta": meta, "rows": list(rows)}, indent=2) + "\n", encoding="utf-8")
    table = markdown_table(rows)
    (out / "uptake.md").write_text(table, encoding="utf-8")
    return table
