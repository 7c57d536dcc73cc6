"""`coding-train`: train a policy against the service (`train`), plus the trace tools (`ingest`, `replay`)."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from trainer_client.client import ClientSettings
from trainer_client.policy import PolicySpec


class TrainRunConfig(BaseModel):
    """One training run, as written in a `--config` YAML file."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicySpec = Field(default_factory=PolicySpec)
    """The model to train."""

    environment: ClientSettings = Field(default_factory=ClientSettings)
    """Where the service is (`--env-url` overrides `base_url`)."""

    tasks: list[str] = Field(min_length=1)
    """Task ids to train on; each becomes one dataset row."""

    task_repeats: int = Field(default=1, ge=1)
    """How many times the task list is repeated in the dataset."""

    generation: Literal["auto", "transformers", "vllm"] = "auto"
    """Rollout backend: `auto` takes vLLM when it is installed, else transformers `generate`."""

    trainer: dict[str, Any] = Field(default_factory=dict)
    """`ComposerConfig` fields (TRL GRPOConfig + `sdpo_weight` (alpha), `dpo_weight` (beta), ...)."""


def load_run_config(path: Path) -> TrainRunConfig:
    with open(path, encoding="utf-8") as handle:
        return TrainRunConfig.model_validate(yaml.safe_load(handle) or {})


def train(args: argparse.Namespace) -> int:
    # Heavy imports (torch, TRL) only for the command that needs them.
    from datasets import Dataset

    from trainer_client.environment import environment_factory
    from trainer_client.policy import load_policy
    from trainer_client.trainer import ComposerConfig, ComposerTrainer

    run = load_run_config(args.config)
    if args.env_url:
        run.environment.base_url = args.env_url
    options = dict(run.trainer)
    if args.max_steps is not None:
        options["max_steps"] = args.max_steps
    use_vllm = run.generation == "vllm" or (run.generation == "auto" and importlib.util.find_spec("vllm") is not None)
    options.setdefault("use_vllm", use_vllm)
    config = ComposerConfig(**options)

    model, tokenizer = load_policy(run.policy)
    rows = [{"prompt": [{"role": "user", "content": ""}], "task_id": task} for task in run.tasks] * run.task_repeats
    trainer = ComposerTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=environment_factory(run.environment),
    )
    try:
        trainer.train()
        trainer.save_model(config.output_dir)
    finally:
        trainer.close_environments()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coding-train", description="Train a policy on the coding environment service.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="GRPO + SDPO + DPO against the service")
    run.add_argument("--config", required=True, type=Path, help="run YAML (see trainer_client/configs/)")
    run.add_argument("--env-url", help="service URL (overrides environment.base_url)")
    run.add_argument("--max-steps", type=int, help="optimizer steps (overrides trainer.max_steps)")
    run.set_defaults(func=train)
    try:
        from trainer_client.traces.cli import register as register_traces
    except ImportError:
        pass  # trace tools not installed in this checkout
    else:
        register_traces(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
