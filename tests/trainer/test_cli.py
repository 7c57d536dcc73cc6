"""`coding-train`: shipped configs parse; the CPU smoke config trains one step against the real service."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from tests.trainer.conftest import SERVICE_TOKEN
from trainer_client.cli import build_parser, load_run_config, main

CONFIGS = sorted((Path(__file__).parents[2] / "trainer_client" / "configs").glob("*.yaml"))
SMOKE_PAIRS = Path(__file__).parents[2] / "trainer_client" / "configs" / "data" / "cpu_smoke_pairs.jsonl"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_parse(path: Path) -> None:
    run = load_run_config(path)
    assert run.tasks and run.trainer["output_dir"]


def test_train_command_takes_the_documented_options() -> None:
    args = build_parser().parse_args(["train", "--config", "x.yaml", "--env-url", "http://h:1", "--max-steps", "3"])
    assert (args.config, args.env_url, args.max_steps) == (Path("x.yaml"), "http://h:1", 3)


def test_every_subcommand_help_shows_its_defaults() -> None:
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    shown = 0
    for name, parser in commands.choices.items():
        text = " ".join(parser.format_help().split())  # argparse wraps long help lines
        assert "(default: None)" not in text, name  # required options and unset overrides say nothing
        for action in parser._actions:
            if not action.required and action.default not in (None, argparse.SUPPRESS):
                assert f"(default: {action.default})" in text, (name, action.dest)
                shown += 1
    assert shown >= 10  # demos' --mistake-rate, eval's --n, ...


def test_unknown_config_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tasks: [builtin/fizzbuzz]\nalpha: 1\n")
    with pytest.raises(ValueError, match="alpha"):
        load_run_config(path)


@pytest.mark.docker
@pytest.mark.parametrize("save_final_model", [True, False])
def test_cpu_smoke_config_trains_one_step(service_url: str, tmp_path: Path, save_final_model: bool) -> None:
    smoke = yaml.safe_load(next(p for p in CONFIGS if p.name == "cpu_smoke.yaml").read_text())
    smoke["save_final_model"] = save_final_model
    smoke["environment"]["api_token"] = SERVICE_TOKEN
    smoke["trainer"]["output_dir"] = str(tmp_path / "run")
    smoke["trainer"]["max_completion_length"] = 32
    smoke["trainer"]["dpo_pairs_path"] = str(SMOKE_PAIRS)  # the copy is not beside the shipped pairs
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(smoke))
    assert main(["train", "--config", str(path), "--env-url", service_url, "--max-steps", "1"]) == 0
    assert (tmp_path / "run" / "config.json").exists() is save_final_model
