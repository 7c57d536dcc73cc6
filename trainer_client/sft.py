"""`coding-train sft`: the warm start, TRL's `SFTTrainer` on expert demos (`coding-train demos`).

Each demo is tokenized the way TRL's tool loop lays out a rollout (`rollout_token_ids`), and the
loss covers exactly the tokens the policy would generate there (its assistant turns, EOS included,
the assistant header and tool results excluded). The dataset reaches `SFTTrainer` already
tokenized (`input_ids` + `assistant_masks`), because Arrow would merge the tool calls' argument
dicts into one struct and render `null` for every argument a call did not use. The output directory
holds the model and the tokenizer with the tool-calling template, ready for `coding-train eval
--model DIR` and `policy.name: DIR` in a training config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from trainer_client.demos import Demo, read_demos
from trainer_client.policy import PolicySpec


class SFTRunConfig(BaseModel):
    """One warm-start run, as written in a `--config` YAML file."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicySpec = Field(default_factory=PolicySpec)
    """The model to fine-tune (the same names `train` accepts)."""

    demos: Path
    """JSONL written by `coding-train demos`."""

    output_dir: Path
    """Where the fine-tuned model and its tokenizer are saved."""

    max_length: int = Field(default=2048, ge=64)
    """Demos longer than this many tokens are left out (not truncated: a cut demo teaches a cut episode)."""

    trainer: dict[str, Any] = Field(default_factory=dict)
    """TRL `SFTConfig` fields (learning_rate, max_steps, per_device_train_batch_size, ...)."""


def load_sft_config(path: Path) -> SFTRunConfig:
    with open(path, encoding="utf-8") as handle:
        return SFTRunConfig.model_validate(yaml.safe_load(handle) or {})


def tokenize_demo(tokenizer: Any, demo: Demo) -> dict[str, list[int]]:
    """`input_ids` as a TRL rollout of the demo holds them; `assistant_masks` on the policy's tokens."""
    from trainer_client.trl_rollout import rollout_token_ids

    ids, mask = rollout_token_ids(tokenizer, demo.messages, json.loads(demo.tools))
    return {"input_ids": ids, "assistant_masks": mask}


def sft_trainer(run: SFTRunConfig) -> Any:
    """TRL's `SFTTrainer` on the run's demos, ready to `train()`."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trainer_client.policy import load_policy

    model, tokenizer = load_policy(run.policy)
    rows = [tokenize_demo(tokenizer, demo) for demo in read_demos(run.demos)]
    rows = [row for row in rows if len(row["input_ids"]) <= run.max_length]
    if not rows:
        raise ValueError(f"no demo in {run.demos} fits in {run.max_length} tokens")
    options = {
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "fp16": False,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        **run.trainer,
        "output_dir": str(run.output_dir),
        "max_length": run.max_length,
        # The masks are already in the data; TRL applies an `assistant_masks` column whatever this says,
        # and only accepts `True` for datasets it tokenizes itself.
        "assistant_only_loss": False,
    }
    return SFTTrainer(model=model, args=SFTConfig(**options), train_dataset=Dataset.from_list(rows), processing_class=tokenizer)


def run_sft(run: SFTRunConfig) -> Path:
    """Fine-tune and save; returns the output directory."""
    trainer = sft_trainer(run)
    trainer.train()
    trainer.save_model(str(run.output_dir))
    trainer.processing_class.save_pretrained(run.output_dir)  # carries the tool-calling template eval and train need
    return run.output_dir
