"""The powered ablation (benchmarks/learning_curve.py) outlives a session only through results.json: these
tests hold that a rerun never mixes cells of another setup into it, and that its analyses read what it holds."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import learning_curve  # noqa: E402


def _setup(**changes: object) -> dict[str, object]:
    setup: dict[str, object] = {
        "warm_start_sha256": "a" * 64,
        "demos_sha256": "b" * 64,
        "mode": {"seeds": [0, 1, 2], "steps": 20},
        "tasks": {"train": ["warmup/l1/x"], "eval": ["warmup/l1/y"]},
        "episode": {"learning_rate": 1e-5, "max_turns": 7},
        "versions": {"torch": "2.13.0", "transformers": "5.23.0", "trl": "1.16.0"},
    }
    setup.update(changes)
    return setup


def test_a_setup_differs_in_exactly_what_changed() -> None:
    assert learning_curve.setup_differences(_setup(), _setup()) == []
    changed = _setup(warm_start_sha256="c" * 64, episode={"learning_rate": 2e-5, "max_turns": 7})
    assert learning_curve.setup_differences(_setup(), changed) == ["episode.learning_rate", "warm_start_sha256"]
    assert learning_curve.setup_differences(None, _setup()) == ["setup"]


def test_steps_to_reach_grpos_final_reward() -> None:
    def curve(rewards: list[float]) -> dict[str, object]:
        return {"train": {"reward": {step: {"mean": reward} for step, reward in enumerate(rewards, start=1)}}}

    grpo = [0.0] * 10 + [0.5] * 10  # final trailing mean 0.5, over steps 16-20
    faster = [0.0] * 3 + [1.0] * 17  # trailing means 0.25, 0.4, 0.6 at steps 4-6
    never = [0.1] * 20
    reached = learning_curve.steps_to_reach({"grpo": curve(grpo), "fast": curve(faster), "never": curve(never)})
    assert reached["grpo"]["step"] == 15 and reached["grpo"]["target"] == pytest.approx(0.5)
    assert reached["fast"] == {"target": pytest.approx(0.5), "step": 6, "share": pytest.approx(0.3)}
    assert reached["never"]["step"] is None and reached["never"]["share"] is None


def test_steps_to_reach_is_undefined_when_grpo_did_not_learn() -> None:
    """GRPO ending where it started (the 135M ablation's first cell: training reward 0 at the end) sets no level
    worth reaching: every arm would "reach" it at step 1."""
    def curve(rewards: list[float]) -> dict[str, object]:
        return {"train": {"reward": {str(step): {"mean": reward} for step, reward in enumerate(rewards, start=1)}}}

    reached = learning_curve.steps_to_reach({"grpo": curve([0.25, 0.0] * 10), "sdpo": curve([0.5] * 20)})
    assert reached["sdpo"]["step"] is None and reached["sdpo"]["share"] is None
    assert "did not rise" in reached["sdpo"]["undefined"] and "did not rise" in reached["grpo"]["undefined"]


def test_steps_to_reach_compares_the_seeds_both_arms_have_from_a_full_window_on() -> None:
    """While cells are missing, an arm's seed GRPO has no cell of must not count, nor one lucky first step: the
    2-seed privileged arm once "reached" 3-seed GRPO's final reward at step 1 that way."""
    def cell(rewards: list[float]) -> dict[str, object]:
        return {"evals": [], "train": [{"step": step, "reward": reward} for step, reward in enumerate(rewards, start=1)]}

    grpo = [0.0] * 10 + [0.5] * 10
    lucky_start = [1.0] + [0.0] * 19
    results = {"baseline": {}, "arms": {
        "grpo": {"0": cell(grpo)},
        "grpo+sdpo": {"0": cell(lucky_start), "1": cell([1.0] * 20)},  # seed 1 would reach at once
    }}
    reached = learning_curve.steps_to_reach_by_seeds(results, [0, 1, 2])
    assert reached["grpo"]["step"] == 15
    assert reached["grpo+sdpo"]["step"] is None and reached["grpo+sdpo"]["target"] == pytest.approx(0.5)
    results["arms"]["grpo+sdpo+dpo"] = {"2": cell(grpo)}
    assert learning_curve.steps_to_reach_by_seeds(results, [0, 1, 2])["grpo+sdpo+dpo"]["undefined"] == "no seed in common with grpo"


def test_a_rerun_refuses_results_of_another_warm_start(tmp_path: Path) -> None:
    """A later session that rebuilt a different warm start (or changed a size) must not add its cells to the
    stored ones: the run stops before it starts a cell, naming what differs, and the file is left as it was."""
    warm = tmp_path / "sft_l1"
    warm.mkdir()
    (warm / "model.safetensors").write_bytes(b"weights of another SFT run")
    demos = tmp_path / "demos.jsonl"
    demos.write_text("")
    results = tmp_path / "kept" / "results.json"
    results.parent.mkdir()
    stored = {"setup": _setup(), "baseline": {"0": {"step": 0, "pass@1": 0.3}}, "arms": {}}
    results.write_text(json.dumps(stored))
    run = subprocess.run(
        [sys.executable, "benchmarks/learning_curve.py", "--powered", "--warm-start", str(warm), "--demos", str(demos),
         "--env-url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), "--results", str(results), "--arms", "grpo"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 2, run.stderr
    assert "holds cells of another setup" in run.stderr
    for key in ("warm_start_sha256", "demos_sha256", "episode.eval_concurrency"):
        assert key in run.stderr
    assert json.loads(results.read_text()) == stored


def _finished_cell(train_seconds: float, eval_seconds: list[float]) -> dict[str, object]:
    return {"train_seconds": train_seconds, "evals": [{"step": 10 * (i + 1), "seconds": s} for i, s in enumerate(eval_seconds)]}


def test_expected_seconds_come_from_what_was_measured() -> None:
    results = {"baseline": {"0": {"seconds": 700.0}, "1": {"seconds": 900.0}},
               "arms": {"grpo": {"0": _finished_cell(2000.0, [800.0, 800.0])}}}
    assert learning_curve.expected_seconds(results, None) == 800.0
    assert learning_curve.expected_seconds(results, "grpo") == 3600.0
    assert learning_curve.expected_seconds(results, "grpo+sdpo") == 3600.0  # no cell of its own yet: another arm's
    assert learning_curve.expected_seconds({"baseline": {}, "arms": {}}, "grpo") is None


@pytest.mark.parametrize(
    ("baselines", "cells", "stops_before"),
    [
        (["0"], {"grpo": ["0"]}, "seed 1's baseline"),
        (["0", "1"], {"grpo": ["0"]}, "grpo seed 1"),
        # arm by arm: GRPO's last seed comes before the next arm's second, as --arms orders what answers most
        (["0", "1", "2"], {"grpo": ["0", "1"], "grpo+sdpo": ["0"]}, "grpo seed 2"),
    ],
)
def test_within_starts_nothing_that_would_not_end_in_time(
    baselines: list[str], cells: dict[str, list[str]], stops_before: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 10 s left, no baseline (about 800 s) or cell (3,600 s) is started, and the run ends at the first that
    does not fit: cells fill in --arms order, each arm's seeds in turn, so a rerun continues where it stopped."""
    results = {
        "baseline": {seed: {"seconds": 800.0} for seed in baselines},
        "arms": {arm: {seed: _finished_cell(2000.0, [800.0, 800.0]) for seed in seeds} for arm, seeds in cells.items()},
    }
    before = json.dumps(results)
    args = argparse.Namespace(within=10.0, arms=["grpo", "grpo+sdpo"], time_budget=None)
    mode = {"seeds": [0, 1, 2], "steps": 20}
    learning_curve.run_cells(results, tmp_path / "results.json", args, mode, {"train": [], "eval": []}, tmp_path / "pairs.jsonl", None, None)
    stops = [line.split(":")[0].removeprefix("stopping before ") for line in capsys.readouterr().out.splitlines()]
    assert stops == [stops_before]
    assert json.dumps(results) == before and not (tmp_path / "results.json").exists()


def test_an_arms_start_averages_the_seeds_it_has_cells_of() -> None:
    """A baseline measured for a seed no cell of the arm has run yet is not in that arm's step 0."""
    def point(value: float) -> dict[str, float]:
        return {"pass@1": value, "valid_call_rate": 1.0, "mean_reward": value}

    results = {
        "baseline": {"0": point(0.3), "1": point(0.1)},
        "arms": {"grpo": {"0": {"evals": [{"step": 10, **point(0.4)}], "train": []}}},
    }
    curve = learning_curve.aggregate(results, [0, 1, 2], [0, 10])["grpo"]["evals"]
    assert curve[0]["pass@1"] == {"mean": 0.3, "ci95": None, "seeds": 1}
    assert curve[10]["pass@1"]["mean"] == 0.4


def test_report_only_reports_the_finished_cells_without_a_service_or_token(tmp_path: Path) -> None:
    """A stopped ablation's report: the table and plot of what results.json holds, nothing run (the env URL is
    unreachable), no privileged token needed although the default arms include the privileged one."""
    warm, demos = tmp_path / "sft_l1", tmp_path / "demos.jsonl"
    warm.mkdir()
    demos.write_text("")
    point = {"pass@1": 0.25, "valid_call_rate": 1.0, "mean_reward": 0.25, "per_task": {"warmup/l1/y": 0.25}, "seconds": 1.0}
    cell = {
        "evals": [{"step": 2, **point}], "steps": 2, "rollouts_per_step": 4, "train_seconds": 10.0,
        "train": [{"step": 1, "reward": 0.0, "num_tokens": 100}, {"step": 2, "reward": 0.5, "num_tokens": 200}],
    }
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"baseline": {"0": {"step": 0, **point}}, "arms": {"grpo": {"0": cell}}}))
    run = subprocess.run(
        [sys.executable, "benchmarks/learning_curve.py", "--powered", "--report-only", "--warm-start", str(warm),
         "--demos", str(demos), "--env-url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "CODING_ENV_PRIVILEGED_TOKEN"},
    )
    assert run.returncode == 0, run.stderr
    assert "| grpo | 2 | 0.250 |" in (tmp_path / "out" / "table.md").read_text()
    assert (tmp_path / "out" / "learning_curve.png").stat().st_size > 0
    # two steps: not one full window of GRPO's training reward, so no level to reach
    assert "fewer than 5 steps" in json.loads(results.read_text())["steps_to_reach"]["grpo"]["undefined"]
