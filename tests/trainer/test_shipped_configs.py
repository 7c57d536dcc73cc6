"""The shipped run configs against the real service: the CPU smoke config run as a user runs it
(`coding-train train --config ...`, then `coding-train plot`), and every config under trainer_client/configs/
built into its trainer."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from tests.trainer.conftest import SERVICE_TOKEN
from trainer_client.cli import build_trainer, gpu_requirement, load_run_config, main
from trainer_client.policy import PolicySpec

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "trainer_client" / "configs"
CPU_SMOKE = CONFIGS / "cpu_smoke.yaml"
CPU_SMOKE_PAIRS = CONFIGS / "data" / "cpu_smoke_pairs.jsonl"


def logged_steps(stdout: str) -> list[dict]:
    """The per-step dicts the trainer prints (`{'loss': ..., ...}`), numbers only."""
    lines = [line for line in stdout.splitlines() if line.startswith("{'loss'")]
    return [{key: float(value) for key, value in ast.literal_eval(line).items()} for line in lines]  # values print as str


def test_cpu_smoke_runs_all_three_channels_with_a_nonzero_loss(service_url, tmp_path, monkeypatch, capsys) -> None:
    run = yaml.safe_load(CPU_SMOKE.read_text())
    run["environment"].update(base_url=service_url, api_token=SERVICE_TOKEN)
    # The copy is not beside the shipped pairs: it names them by their full path.
    run["trainer"].update(output_dir=str(tmp_path / "out"), max_steps=1, dpo_pairs_path=str(CPU_SMOKE_PAIRS))
    config = tmp_path / "cpu_smoke.yaml"
    config.write_text(yaml.safe_dump(run))
    monkeypatch.chdir(tmp_path)  # any directory

    assert main(["train", "--config", str(config)]) == 0

    (step,) = logged_steps(capsys.readouterr().out)
    assert step["sdpo/hint_sites"] >= 1 and step["sdpo/loss"] > 0  # a random policy calls no tool: sites every turn
    assert step["dpo/loss"] > 0
    assert step["loss"] != 0
    assert step["policy/failures/no_tool_call"] + step["policy/failures/json_decode"] >= 1
    assert step["reward/pass_rate"] == 0 and "grpo/loss" in step  # a random policy submits nothing

    # What the policy did: a sample of the step's rollouts as conversations.
    samples = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and {sample["step"] for sample in samples} == {0}
    for sample in samples:
        assert sample["task_id"] and sample["messages"][0]["role"] in ("system", "user")
        assert sample["messages"][-1]["role"] in ("assistant", "tool") and sample["reward"] in (None, 0.0)

    # The run's logs as a figure (what the run directory holds: trainer_state.json, written at the end).
    assert main(["plot", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "metrics.png").stat().st_size > 0


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_run_config_builds_its_trainer(path: Path, service_url, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # any directory: a config's data is found beside it
    run = load_run_config(path)
    run.environment.base_url, run.environment.api_token = service_url, SERVICE_TOKEN
    run.trainer["output_dir"] = str(tmp_path / "out")
    # The model is not under test: a hub model cannot be fetched here and a warm start may not exist yet.
    run.policy = PolicySpec(name="tiny-random")
    if gpu_requirement(run.trainer, generation=run.generation, bf16_default=True):
        # On a machine without a GPU the command stops with what needs one, before it loads anything...
        with pytest.raises(SystemExit, match=r"needs a CUDA GPU \((trainer\.bf16|generation: vllm)"):
            main(["train", "--config", str(path), "--env-url", service_url])
        # ... and everything else of the config still builds, on the CPU.
        run.trainer.update(use_cpu=True, bf16=False)
        run.generation = "transformers"
    if not Path(run.trainer.get("dpo_pairs_path") or CPU_SMOKE_PAIRS).exists():
        run.trainer["dpo_pairs_path"] = str(CPU_SMOKE_PAIRS)  # a user's own, from `coding-train replay`

    trainer = build_trainer(run)
    try:
        callbacks = {type(callback).__name__ for callback in trainer.callback_handler.callbacks}
        assert ("TensorBoardCallback" in callbacks) == ("tensorboard" in trainer.args.report_to)
        assert trainer.args.max_steps == run.trainer["max_steps"]
    finally:
        trainer.close_environments()
