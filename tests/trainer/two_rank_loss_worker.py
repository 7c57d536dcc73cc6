"""One rank of `test_distributed_parts.test_two_ranks_*` (run by torchrun, gloo on CPU): rank 0's
micro-batch has a hint site, rank 1's none; both compute the loss and write what they logged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.trainer.conftest import build_batch, make_config, make_trainer, preference_pairs
from trainer_client.policy import load_tool_tokenizer, tiny_random_model


def main(out: Path) -> None:
    tokenizer = load_tool_tokenizer()
    model = tiny_random_model(len(tokenizer), hidden_size=32, layers=2, seed=0, init_std=0.5)
    config = make_config(out, sdpo_weight=1.0, dpo_weight=1.0, dpo_batch_size=2)
    trainer = make_trainer(model, tokenizer, config, preference_pairs=preference_pairs())
    rank = trainer.accelerator.process_index
    inputs = build_batch(trainer, tokenizer, hinted=[True, False] if rank == 0 else [False, False])
    local_tokens = int(inputs["hint_tokens"])
    inputs["hint_tokens"] = trainer._global_count(local_tokens)  # as `_generate_and_score_completions` sets it
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    report = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "local_hint_tokens": local_tokens,
        "pair_ids": trainer.dpo.preferences.pair_ids,
        "metrics": {name: values[-1] for name, values in trainer._metrics["train"].items()},
        "finite_grads": all(torch.isfinite(p.grad).all().item() for p in trainer.model.parameters() if p.grad is not None),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
