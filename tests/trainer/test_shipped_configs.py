"""The shipped CPU smoke config, run as a user runs it (`coding-train train --config ...`) against the real service."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.trainer.conftest import SERVICE_TOKEN
from trainer_client.cli import main

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
CPU_SMOKE = REPO / "trainer_client" / "configs" / "cpu_smoke.yaml"


def logged_steps(stdout: str) -> list[dict]:
    """The per-step dicts the trainer prints (`{'loss': ..., ...}`), numbers only."""
    lines = [line for line in stdout.splitlines() if line.startswith("{'loss'")]
    return [{key: float(value) for key, value in ast.literal_eval(line).items()} for line in lines]  # values print as str


def test_cpu_smoke_runs_all_three_channels_with_a_nonzero_loss(service_url, tmp_path, monkeypatch, capsys) -> None:
    run = yaml.safe_load(CPU_SMOKE.read_text())
    run["environment"].update(base_url=service_url, api_token=SERVICE_TOKEN)
    run["trainer"].update(output_dir=str(tmp_path / "out"), max_steps=1)
    config = tmp_path / "cpu_smoke.yaml"
    config.write_text(yaml.safe_dump(run))
    monkeypatch.chdir(REPO)  # the config's pairs path is relative to the repository root

    assert main(["train", "--config", str(config)]) == 0

    (step,) = logged_steps(capsys.readouterr().out)
    assert step["sdpo/hint_sites"] >= 1 and step["sdpo/loss"] > 0  # a random policy calls no tool: sites every turn
    assert step["dpo/loss"] > 0
    assert step["loss"] != 0
    assert step["policy/failures/no_tool_call"] + step["policy/failures/json_decode"] >= 1
