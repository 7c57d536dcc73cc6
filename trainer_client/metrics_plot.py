"""`coding-train plot RUN_DIR`: what a training run logged at each optimizer step, as one figure.

A run directory (a `trainer.output_dir`) holds its per-step logs in up to three places, read in this order:
- `trainer_state.json`: `log_history`, every logged step, written when `coding-train train` ends;
- TensorBoard event files (`runs/*/events.out.tfevents.*`, with `tensorboard` in `report_to`): written at
  every logged step, so they also show a run still going or one that stopped early;
- `checkpoint-*/trainer_state.json`: the latest checkpoint's `log_history`, up to that checkpoint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_client.plotting import count_axis, label_points, no_data, pyplot, step_axis

TRAIN_TAG_PREFIX = "train/"
"""transformers' TensorBoard callback writes a training log's `key` as the tag `train/key`."""

FAILURE_PREFIX = "policy/failures/"


@dataclass(frozen=True)
class LinePanel:
    """One logged number over steps."""

    title: str
    key: str
    ylabel: str
    share: bool
    """A share in [0, 1]: drawn on a fixed [0, 1] scale, so that runs compare at a glance."""


REWARD = LinePanel("reward (batch mean)", "reward", "reward", share=True)
PASS_RATE = LinePanel("pass rate (episodes with reward 1)", "reward/pass_rate", "share of episodes", share=True)
VALID_CALLS = LinePanel("valid tool-call rate", "policy/valid_call_rate", "share of assistant turns", share=True)
FAILURES_TITLE = "policy failures by error kind"
LOSSES = (
    LinePanel("total loss", "loss", "loss", share=False),
    LinePanel("GRPO loss", "grpo/loss", "loss", share=False),
    LinePanel("SDPO loss (before sdpo_weight)", "sdpo/loss", "generalized JSD", share=False),
    LinePanel("DPO loss (before dpo_weight)", "dpo/loss", "loss", share=False),
)
"""Each loss channel on its own scale: the total is GRPO + sdpo_weight * SDPO + dpo_weight * DPO, and the
channels differ by orders of magnitude (a DPO loss starts at log 2, a GRPO loss near 0)."""


@dataclass(frozen=True)
class RunLog:
    """The numbers a run logged, by optimizer step."""

    source: Path
    """The file or directory they were read from."""

    steps: dict[int, dict[str, float]]

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The steps that logged `key`, and its values there."""
        steps = [step for step in sorted(self.steps) if key in self.steps[step]]
        return steps, [self.steps[step][key] for step in steps]

    def names(self) -> set[str]:
        """Every metric logged at some step."""
        return {key for metrics in self.steps.values() for key in metrics}


def read_run_log(run_dir: Path) -> RunLog:
    """The per-step logs of the run in `run_dir` (see the module's docstring for where they are looked for)."""
    final = run_dir / "trainer_state.json"
    if final.is_file():
        return _trainer_state_log(final)
    event_dirs = sorted({path.parent for path in run_dir.rglob("events.out.tfevents.*")})
    if event_dirs:
        return _event_file_log(run_dir, event_dirs)
    checkpoints = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=_checkpoint_step)
    if checkpoints:
        return _trainer_state_log(checkpoints[-1])
    raise FileNotFoundError(
        f"{run_dir}: no trainer_state.json, TensorBoard event file (trainer.report_to: tensorboard) or "
        "checkpoint-*/trainer_state.json: is it a run's output_dir?"
    )


def _checkpoint_step(path: Path) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", path.parent.name)
    return int(match.group(1)) if match else -1


def _trainer_state_log(path: Path) -> RunLog:
    history = json.loads(path.read_text(encoding="utf-8")).get("log_history", [])
    steps: dict[int, dict[str, float]] = {}
    for entry in history:
        numbers = {
            key: float(value)
            for key, value in entry.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        steps.setdefault(int(entry["step"]), {}).update(numbers)
    return RunLog(path, steps)


def _event_file_log(run_dir: Path, event_dirs: list[Path]) -> RunLog:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    steps: dict[int, dict[str, float]] = {}
    # A resumed run writes a second `runs/<time>_<host>` directory: later directories override earlier ones.
    for directory in event_dirs:
        events = EventAccumulator(str(directory), size_guidance={SCALARS: 0})  # 0: every event, not a sample
        events.Reload()
        for tag in events.Tags()[SCALARS]:
            key = tag.removeprefix(TRAIN_TAG_PREFIX)
            for event in events.Scalars(tag):
                steps.setdefault(event.step, {})[key] = event.value
    return RunLog(run_dir, steps)


def plot_run(log: RunLog, path: Path, title: str) -> list[str]:
    """Writes the run's figure to `path`; returns its panels' titles, in reading order."""
    plt = pyplot()
    figure, axes = plt.subplots(2, 4, figsize=(22, 9))
    top, bottom = axes
    for axis, panel in zip(top, (REWARD, PASS_RATE, VALID_CALLS)):
        _line(axis, log, panel)
    _failures(top[3], log)
    for axis, panel in zip(bottom, LOSSES):
        _line(axis, log, panel)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return [axis.get_title() for axis in axes.flat]


def _line(axis: Any, log: RunLog, panel: LinePanel) -> None:
    axis.set_title(panel.title)
    steps, values = log.series(panel.key)
    if not steps:
        no_data(axis, f"no data ({panel.key} not logged)")
        return
    line, = axis.plot(steps, values, marker="o")
    # Four significant digits: a loss that moves in its fourth digit over a short run still reads as moving.
    label_points(axis, steps, values, fmt="{:.2f}" if panel.share else "{:.4g}", color=line.get_color())
    step_axis(axis, steps)
    axis.set_ylabel(panel.ylabel)
    if panel.share:
        axis.set_ylim(-0.05, 1.1)
    else:
        axis.margins(y=0.15)  # room for the labels above the highest point


def _failures(axis: Any, log: RunLog) -> None:
    """The policy's failures of each step as one bar, stacked by error kind (the kinds that occurred)."""
    axis.set_title(FAILURES_TITLE)
    kinds = sorted(key.removeprefix(FAILURE_PREFIX) for key in log.names() if key.startswith(FAILURE_PREFIX))
    if not kinds:
        no_data(axis, f"no data ({FAILURE_PREFIX}* not logged)")
        return
    steps = sorted(step for step, metrics in log.steps.items() if any(FAILURE_PREFIX + kind in metrics for kind in kinds))
    counts = {kind: [log.steps[step].get(FAILURE_PREFIX + kind, 0.0) for step in steps] for kind in kinds}
    occurred = sorted((kind for kind in kinds if any(counts[kind])), key=lambda kind: -sum(counts[kind]))
    if not occurred:
        no_data(axis, f"no failure in any of {len(steps)} logged steps")
        return
    bottoms = [0.0] * len(steps)
    colors = pyplot().get_cmap("tab20")
    for index, kind in enumerate(occurred):  # one bar series, so one legend entry, per kind
        axis.bar(steps, counts[kind], bottom=bottoms, label=kind, color=colors(index % 20), width=0.8)
        bottoms = [below + count for below, count in zip(bottoms, counts[kind])]
    # Counts averaged over a logging window of several steps are not whole numbers.
    label_points(axis, steps, bottoms, fmt="{:g}" if all(float(t).is_integer() for t in bottoms) else "{:.1f}")
    step_axis(axis, steps)
    count_axis(axis, "failures per step")
    axis.set_ylim(0, max(bottoms) * 1.4 + 0.5)  # room for the totals and the legend above the bars
    axis.legend(fontsize=8, title="error kind", title_fontsize=8)

