"""`coding-train eval`: K sampled episodes per task through the service, scored with pass@k.

Episodes run the way TRL's tool loop runs them in training (same prompt, tool schemas, tool
dispatch and token layout, see `trl_rollout`), many at once: generation is batched over the open
episodes and their tool calls go to the service concurrently. Three choices differ from a training
rollout and are on purpose: an episode stops at `submit` (nothing after it changes the reward), an
unsubmitted episode scores 0 (a pass needs a submission), and a pass is a reward of 1.0 (every
hidden test passed).

Statistics: pass@k by the unbiased estimator of Chen et al. (2021) per task, averaged over tasks;
95% intervals by a percentile bootstrap over tasks (the unit that was sampled).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from trainer_client.hint_sites import TurnReport, turn_reports
from trainer_client.task_rows import prompt_after_reset, task_row
from trainer_client.transcript_markdown import transcript_markdown


# ----------------------------------------------------------------------------------- statistics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples passes) from n samples with c passes."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def bootstrap_interval(
    values: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the (weighted) mean over units resampled with replacement.

    With `weights` the statistic is `sum(w * v) / sum(w)`: a pooled rate over units of unequal size
    (e.g. valid turns / turns, resampling tasks)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return (math.nan, math.nan)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    picks = np.random.default_rng(seed).integers(0, v.size, size=(resamples, v.size))
    totals = w[picks].sum(axis=1)
    means = np.divide((v * w)[picks].sum(axis=1), totals, out=np.full(resamples, np.nan), where=totals > 0)
    tail = (1.0 - level) / 2 * 100
    low, high = np.nanpercentile(means, [tail, 100 - tail])
    return (float(low), float(high))


# ------------------------------------------------------------------------------------- episodes


@dataclass
class Episode:
    """One sampled episode and what was seen in it."""

    task_id: str
    sample: int
    environment: Any = None
    context: list[int] = field(default_factory=list)
    """Token ids of the whole episode: the prompt, then the completion (turns and tool answers)."""
    prompt_length: int = 0
    """Tokens of `context` that are the prompt."""
    policy_mask: list[int] = field(default_factory=list)
    """Per completion token, 1 where the policy sampled it, 0 for a tool answer (TRL's `tool_mask`)."""
    prompt: list[dict[str, Any]] = field(default_factory=list)
    """The messages the episode started from (the task after reset)."""
    completion: list[dict[str, Any]] = field(default_factory=list)
    """Assistant and tool messages after the prompt, as TRL's tool loop appends them."""
    completion_tokens: int = 0
    turns: int = 0
    valid_turns: int = 0
    """Turns with at least one tool call and none malformed (the trainer's `policy/valid_call_rate`)."""
    error_kinds: list[str] = field(default_factory=list)
    """Failures the policy caused, per turn (the trainer's `policy/failures/<kind>`)."""
    reports: list[TurnReport] = field(default_factory=list)
    """Per turn, its calls and the failures it is blamed for (`turn_reports`)."""
    submitted: bool = False
    last_turn_ended: bool = True
    open: bool = True
    pending: list[int] = field(default_factory=list)
    """The turn just generated, not yet acted on."""
    cache: Any = None
    """The model's KV cache of `context` (reused by the next turn)."""
    reward: float | None = None
    """The service's grade; None when grading failed for infrastructure reasons (left out of the figures)."""
    started: float = 0.0
    seconds: float = 0.0


class EvalSettings(BaseModel):
    """How episodes are sampled."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=4, ge=1)
    """Samples per task (pass@k is reported for k = 1 and k = n)."""

    temperature: float = Field(default=0.7, ge=0)
    """Sampling temperature (0: greedy, then all samples of a task are the same)."""

    max_turns: int = Field(default=10, ge=1)
    """Assistant turns per episode (TRL's `max_tool_calling_iterations` + 1)."""

    max_new_tokens: int = Field(default=256, ge=1)
    """Tokens one assistant turn may generate."""

    max_completion_length: int = Field(default=2048, ge=1)
    """Budget of the whole completion (turns and tool results), as TRL's `max_completion_length`."""

    concurrency: int = Field(default=8, ge=1)
    """Episodes open at once (service sessions; generation is batched over them)."""

    seed: int = 0
    """Sampling seed."""


class Evaluator:
    """Runs episodes of one policy against the service."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        new_environment: Callable[[], Any],
        settings: EvalSettings,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        from trl.chat_template_utils import add_response_schema

        self._model = model
        self._tokenizer = add_response_schema(tokenizer)
        self._new_environment = new_environment
        self._settings = settings
        self._progress = progress or (lambda _n: None)

    def run(self, task_ids: Sequence[str]) -> list[Episode]:
        """All `n` episodes of every task, `concurrency` at a time, in task order."""
        import torch

        torch.manual_seed(self._settings.seed)
        queue = [Episode(task_id, sample) for task_id in task_ids for sample in range(self._settings.n)]
        finished: list[Episode] = []
        active: list[Episode] = []
        idle: list[Any] = []  # environments whose episode ended, reused by the next one (one session each)
        with ThreadPoolExecutor(max_workers=self._settings.concurrency) as pool:
            try:
                while queue or active:
                    starting = [queue.pop(0) for _ in range(min(len(queue), self._settings.concurrency - len(active)))]
                    for episode in starting:
                        episode.environment = idle.pop() if idle else self._new_environment()
                    list(pool.map(self._start, starting))
                    active += starting
                    self._generate_turns(active)
                    list(pool.map(self._act, active))
                    for episode in [e for e in active if not e.open]:
                        active.remove(episode)
                        self._finish(episode)
                        episode.seconds = time.perf_counter() - episode.started
                        idle.append(episode.environment)
                        episode.environment = episode.cache = None
                        finished.append(episode)
                        self._progress(1)
            finally:
                for environment in idle + [e.environment for e in active if e.environment is not None]:
                    environment._close()
        position = {task_id: i for i, task_id in enumerate(task_ids)}
        return sorted(finished, key=lambda e: (position[e.task_id], e.sample))

    def _start(self, episode: Episode) -> None:
        from trainer_client.trl_rollout import environment_methods

        episode.started = time.perf_counter()
        row = task_row(episode.task_id)
        prompt = episode.prompt = prompt_after_reset(row, episode.environment.reset(**row))
        tools = environment_methods(episode.environment)
        episode.context = list(
            self._tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        episode.prompt_length = len(episode.context)

    def _generate_turns(self, episodes: list[Episode]) -> None:
        """One assistant turn for every open episode, in one batch.

        Each episode keeps its KV cache across turns, so a turn computes only the tokens added since
        the last one (the tool suffix and the new turn) instead of re-reading a prompt of hundreds of
        tokens every turn; the open episodes decode together (`batched_turns`)."""
        from trainer_client.batched_turns import generate_turns

        tokenizer, settings = self._tokenizer, self._settings
        sampling = {"do_sample": True, "temperature": settings.temperature} if settings.temperature > 0 else {"do_sample": False}
        budgets = [settings.max_completion_length - episode.completion_tokens for episode in episodes]
        turns = generate_turns(
            self._model,
            [episode.context for episode in episodes],
            [episode.cache for episode in episodes],
            [max(1, min(settings.max_new_tokens, budget)) for budget in budgets],
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
        # An open episode has budget left (`_act` closes it at the cap), so each turn is already cut to its limit.
        for episode, turn in zip(episodes, turns):
            episode.cache, episode.pending = turn.cache, turn.tokens

    def _act(self, episode: Episode) -> None:
        """Parse the pending turn, run its calls as TRL would, and extend the context."""
        from trl.chat_template_utils import parse_response

        from trainer_client.trl_rollout import dispatch, environment_methods, tool_message, tool_suffix_ids

        turn = episode.pending
        tools = {method.__name__: method for method in environment_methods(episode.environment)}
        parsed = parse_response(self._tokenizer, turn, prefix=episode.context, tools=list(tools.values()))
        calls = parsed.get("tool_calls") or []
        episode.completion.append(parsed)
        episode.context += turn
        episode.policy_mask += [1] * len(turn)
        episode.completion_tokens += len(turn)
        episode.last_turn_ended = bool(turn) and turn[-1] == self._tokenizer.eos_token_id
        results = [tool_message(name, result) for name, result, _ in (dispatch(tools, call) for call in calls)]
        episode.submitted = episode.environment.episode_over  # submitted, or the service's step limit
        episode.completion += results
        if results:
            suffix = tool_suffix_ids(self._tokenizer, results)
            episode.context += suffix
            episode.policy_mask += [0] * len(suffix)
            episode.completion_tokens += len(suffix)
        turns = sum(message["role"] == "assistant" for message in episode.completion)
        episode.open = (
            bool(calls)
            and not episode.submitted
            and turns < self._settings.max_turns
            and episode.completion_tokens < self._settings.max_completion_length
        )

    def _finish(self, episode: Episode) -> None:
        """Grade the episode and judge its turns as the trainer does (`turn_reports`)."""
        from trainer_client.trl_rollout import environment_methods

        environment = episode.environment
        reward = environment.get_reward()
        # A submitted episode without a reward was not graded (a sandbox fault), and a lost one (its
        # replica died) was cut short: neither says anything about the policy.
        episode.reward = None if environment.lost or (environment.episode_over and environment.reward is None) else reward
        names = {method.__name__ for method in environment_methods(environment)}
        reports = turn_reports(
            environment.tool_calls,
            episode.completion,
            names,
            episode_over=environment.episode_over,
            last_turn_ended=episode.last_turn_ended,
        )
        if reports is None:
            raise RuntimeError(f"{episode.task_id}: the environment's call records do not match the turns' calls")
        episode.reports = reports
        episode.turns = len(reports)
        episode.valid_turns = sum(report.valid_call for report in reports)
        episode.error_kinds = [failure.kind.value for report in reports for failure in report.failures]


# -------------------------------------------------------------------------------------- summary


def summarize(episodes: Sequence[Episode], *, k: int, seed: int = 0) -> dict[str, Any]:
    """The figures of `eval.json` from finished episodes (n per task)."""
    tasks: dict[str, list[Episode]] = {}
    graded = [episode for episode in episodes if episode.reward is not None]
    for episode in graded:
        tasks.setdefault(episode.task_id, []).append(episode)
    per_task = []
    for task_id, runs in tasks.items():
        passes = sum(e.reward >= 1.0 for e in runs)
        per_task.append(
            {
                "task_id": task_id,
                "n": len(runs),
                "passes": passes,
                "pass@1": pass_at_k(len(runs), passes, 1),
                f"pass@{k}": pass_at_k(len(runs), passes, min(k, len(runs))),
                "mean_reward": float(np.mean([e.reward for e in runs])),
                "turns": sum(e.turns for e in runs),
                "valid_turns": sum(e.valid_turns for e in runs),
            }
        )

    def estimate(values: list[float], weights: list[float] | None = None) -> dict[str, Any]:
        w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
        value = float(np.dot(values, w) / w.sum()) if w.sum() > 0 else math.nan
        low, high = bootstrap_interval(values, weights, seed=seed)
        return {"value": value, "ci95": [low, high]}

    turns = [e.turns for e in graded]
    valid_rates = [t["valid_turns"] / t["turns"] if t["turns"] else 0.0 for t in per_task]
    return {
        "tasks": len(per_task),
        "episodes": len(graded),
        "ungraded_episodes": len(episodes) - len(graded),
        "pass@1": estimate([t["pass@1"] for t in per_task]),
        f"pass@{k}": estimate([t[f"pass@{k}"] for t in per_task]),
        "mean_reward": estimate([t["mean_reward"] for t in per_task]),
        "valid_tool_call_rate": estimate(valid_rates, [t["turns"] for t in per_task]),
        "submitted_rate": float(np.mean([e.submitted for e in graded])) if graded else math.nan,
        "error_kinds": dict(Counter(kind for e in graded for kind in e.error_kinds).most_common()),
        "turns_per_episode": {
            "mean": float(np.mean(turns)) if turns else math.nan,
            "histogram": dict(sorted(Counter(turns).items())),
        },
        "per_task": per_task,
    }


def plot(summary: dict[str, Any], path: Path, *, k: int, title: str) -> list[str]:
    """Three panels: rates with 95% intervals, the error-kind histogram, turns per episode; returns their titles."""
    from matplotlib.ticker import MaxNLocator

    from trainer_client.plotting import count_axis, no_data, pyplot

    plt = pyplot()
    figure, (rates, kinds, turns) = plt.subplots(1, 3, figsize=(15, 4.5))
    names = list(dict.fromkeys(["pass@1", f"pass@{k}", "mean_reward", "valid_tool_call_rate"]))  # pass@k is pass@1 when k = 1
    labels = {"mean_reward": "reward", "valid_tool_call_rate": "valid call"}
    values = [summary[name]["value"] for name in names]
    errors = np.array([[v - summary[n]["ci95"][0], summary[n]["ci95"][1] - v] for n, v in zip(names, values)]).T
    bars = rates.bar(range(len(names)), values, yerr=np.nan_to_num(errors), capsize=4, color="#4477aa")
    rates.bar_label(bars, labels=[f"{value:.2f}" for value in values], padding=3, fontsize=8)
    rates.set_xticks(range(len(names)), [labels.get(name, name) for name in names])
    rates.set_ylim(0, 1.1)
    rates.set_ylabel("share of episodes (reward: mean)")
    rates.set_title("rates (95% bootstrap CI over tasks)")
    kinds.set_title("error kinds (count)")
    histogram = summary["error_kinds"]
    if histogram:
        bars = kinds.barh(list(histogram), list(histogram.values()), color="#cc6677")
        kinds.bar_label(bars, padding=3, fontsize=8)
        kinds.invert_yaxis()
        kinds.set_xlabel("failures the policy caused")
        kinds.xaxis.set_major_locator(MaxNLocator(integer=True))
        kinds.margins(x=0.1)
    else:
        no_data(kinds, "no failure in any episode")
    turns.set_title("turns per episode")
    counts = summary["turns_per_episode"]["histogram"]
    if counts:
        bars = turns.bar([int(t) for t in counts], list(counts.values()), color="#117733")
        turns.bar_label(bars, padding=3, fontsize=8)
        turns.set_xlabel("assistant turns")
        turns.xaxis.set_major_locator(MaxNLocator(integer=True))
        count_axis(turns, "episodes")
        turns.margins(y=0.15)  # room for the value above the tallest bar
    else:
        no_data(turns, "no episode")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return [rates.get_title(), kinds.get_title(), turns.get_title()]


TRANSCRIPTS_FILE = "transcripts.jsonl"
TRANSCRIPTS_DIR = "transcripts"
"""One Markdown file per episode, to read (`transcripts.jsonl` holds the same, to load)."""


def transcript_file_name(episode: Episode) -> str:
    """`<task id, slashes as double underscores>__s<sample>.md`: one per episode, sorted by task."""
    return f"{episode.task_id.replace('/', '__')}__s{episode.sample}.md"


def transcript(episode: Episode) -> dict[str, Any]:
    """One episode as it was played: the conversation (the task, each turn as parsed, each tool's answer
    as the model read it) and what came of it."""
    return {
        "task_id": episode.task_id,
        "sample": episode.sample,
        "reward": episode.reward,
        "submitted": episode.submitted,
        "turns": episode.turns,
        "valid_turns": episode.valid_turns,
        "error_kinds": episode.error_kinds,
        "completion_tokens": episode.completion_tokens,
        "seconds": round(episode.seconds, 3),
        "messages": episode.prompt + episode.completion,
    }


def write_report(episodes: Sequence[Episode], out: Path, *, k: int, meta: dict[str, Any]) -> dict[str, Any]:
    """`out/eval.json`, `out/eval.png`, `out/transcripts.jsonl` (one line per episode) and `out/transcripts/`
    (one Markdown file per episode); returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = {**meta, **summarize(episodes, k=k, seed=meta.get("seed", 0))}
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    readable = out / TRANSCRIPTS_DIR
    readable.mkdir(exist_ok=True)
    with open(out / TRANSCRIPTS_FILE, "w", encoding="utf-8") as lines:
        for episode in episodes:
            played = transcript(episode)
            lines.write(json.dumps(played, ensure_ascii=False, default=str) + "\n")
            facts = {key: played[key] for key in ("reward", "submitted", "turns", "valid_turns", "error_kinds", "seconds")}
            (readable / transcript_file_name(episode)).write_text(
                transcript_markdown(f"{episode.task_id}, sample {episode.sample}", facts, played["messages"]), encoding="utf-8")
    plot(report, out / "eval.png", k=k, title=f"{meta.get('model')} on {meta.get('suite')} ({report['tasks']} tasks x {k})")
    return report
