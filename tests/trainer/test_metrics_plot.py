"""`coding-train plot RUN_DIR` on the logs of a real (tiny) ComposerTrainer run, as transformers wrote them:
`trainer_state.json`, TensorBoard event files and checkpoints, each read alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.trainer.conftest import make_config, make_trainer, preference_pairs
from trainer_client.cli import main
from trainer_client.metrics_plot import plot_run, read_run_log

SDPO_WEIGHT, DPO_WEIGHT = 0.5, 0.1
STEPS = 3

PANELS = [
    "reward (batch mean)",
    "pass rate (episodes with reward 1)",
    "valid tool-call rate",
    "policy failures by error kind",
    "total loss",
    "GRPO loss",
    "SDPO loss (before sdpo_weight)",
    "DPO loss (before dpo_weight)",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer, base_model) -> Path:
    """Three optimizer steps of all three channels (a reward function, no service: the plot is under test),
    logged to TensorBoard, checkpointed every 2 steps, and saved at the end as `coding-train train` does.
    Two micro-steps per optimizer step; a generation batch serves two optimizer steps, so that GRPO's loss is
    nonzero in the second (at a probability ratio of 1 a group's advantages, which sum to 0, cancel out)."""
    root = tmp_path_factory.mktemp("plot")
    config = make_config(
        root,
        max_steps=STEPS,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        sdpo_weight=SDPO_WEIGHT,
        dpo_weight=DPO_WEIGHT,
        dpo_batch_size=2,
        report_to=["tensorboard"],
        save_strategy="steps",
        save_steps=2,
    )
    trainer = make_trainer(base_model, tokenizer, config, preference_pairs=preference_pairs())
    trainer.train()
    trainer.save_state()
    return Path(config.output_dir)


def only(run_dir: Path, tmp_path: Path, keep: str) -> Path:
    """A copy of the run directory with one kind of log left in it."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    if keep != "trainer_state":
        (copy / "trainer_state.json").unlink()
    if keep != "event files":
        shutil.rmtree(copy / "runs")
    if keep != "checkpoint":
        for checkpoint in copy.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
    return copy


@pytest.mark.parametrize(
    ("keep", "source"),
    [("trainer_state", "trainer_state.json"), ("event files", "."), ("checkpoint", f"checkpoint-{STEPS}/trainer_state.json")],
)
def test_plot_reads_each_kind_of_log(run_dir: Path, tmp_path: Path, keep: str, source: str) -> None:
    copy = only(run_dir, tmp_path, keep)
    log = read_run_log(copy)
    assert log.source == (copy / source if source != "." else copy)
    assert sorted(log.steps) == list(range(1, STEPS + 1))
    steps, dpo = log.series("dpo/loss")
    assert steps == [1, 2, 3] and all(0 < value < 1 for value in dpo)  # near log 2 for a fresh policy

    assert main(["plot", str(copy)]) == 0
    with Image.open(copy / "metrics.png") as image:
        image.verify()  # a whole, valid PNG
        assert image.format == "PNG" and image.size[0] > 1000 and image.size[1] > 500


def test_plot_names_every_panel_and_takes_out(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures" / "run.png"
    out.parent.mkdir()
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert out.stat().st_size > 0 and not (run_dir / "metrics.png").exists()
    assert plot_run(read_run_log(run_dir), tmp_path / "again.png", title="run") == PANELS


def test_the_grpo_channel_is_the_total_less_the_weighted_others(run_dir: Path) -> None:
    """`grpo/loss` is logged per optimizer step like `loss`, so the channels add up to the total."""
    log = read_run_log(run_dir)
    assert any(log.steps[step]["grpo/loss"] != 0 for step in log.steps)
    for metrics in log.steps.values():
        if "loss" in metrics:
            channels = metrics["grpo/loss"] + SDPO_WEIGHT * metrics["sdpo/loss"] + DPO_WEIGHT * metrics["dpo/loss"]
            assert channels == pytest.approx(metrics["loss"], rel=1e-4, abs=1e-6)


def test_a_directory_without_logs_is_refused_with_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no trainer_state.json, TensorBoard event file"):
        main(["plot", str(tmp_path)])
