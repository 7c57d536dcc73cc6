"""Tokens the DPO channel runs per mini-batch for a pairs file, with context chains (decision 078) and
with a plain shuffle: what `dpo_group_by_context` saves on that file, with no model and no step.

It tokenizes the pairs as the trainer does: SmolLM2's tool template (or `--tokenizer`), and for a pair
without its own tools, the service's tools as a rollout's prompt carries them. Then it
draws `--passes` passes of mini-batches each way and counts the tokens the packed rows hold
(`PackedBatch.token_count`, padding left out). It prints the chains found, the median and mean
tokens per mini-batch, and their ratio.
Usage:
    python benchmarks/dpo_batch_tokens.py trainer_client/configs/data/cpu_smoke_pairs.jsonl [--batch-size 2] [--max-length 2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from env_server.environment import TOOL_SCHEMAS  # noqa: E402
from trainer_client.client import ClientSettings  # noqa: E402
from trainer_client.demos import tool_schemas  # noqa: E402
from trainer_client.environment import environment_class  # noqa: E402
from trainer_client.policy import load_tool_tokenizer  # noqa: E402
from trainer_client.preferences import PreferenceBatches, load_preference_pairs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pairs", type=Path, help="preference pairs JSONL (`coding-train replay`'s output)")
    parser.add_argument("--batch-size", type=int, default=2, help="the trainer's dpo_batch_size")
    parser.add_argument("--max-length", type=int, default=2048, help="the trainer's dpo_max_length")
    parser.add_argument("--tokenizer", help="a tokenizer path or name (default: SmolLM2's, with the tool template)")
    parser.add_argument("--passes", type=int, default=20, help="passes over the pairs drawn each way")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else load_tool_tokenizer()
    pairs = load_preference_pairs(args.pairs)
    # the schemas TRL renders a rollout's prompt with (the environment's tool methods); nothing is called
    tools = tool_schemas(environment_class(list(TOOL_SCHEMAS.values()))(ClientSettings(base_url="http://127.0.0.1:9")))
    samplers = {
        grouped: PreferenceBatches(
            pairs, tokenizer, batch_size=args.batch_size, max_length=args.max_length, tools=tools, group_by_context=grouped
        )
        for grouped in (False, True)
    }
    tokens = {
        grouped: [
            preferences.collate(preferences.next_indices(), tokenizer.pad_token_id, shared_prefix=True).token_count()
            for _ in range(args.passes * -(-len(preferences.pairs) // preferences.batch_size))
        ]
        for grouped, preferences in samplers.items()
    }
    chains = samplers[True].chains
    print(f"{len(pairs)} pairs in {len(chains)} context chains (lengths {sorted(map(len, chains), reverse=True)}); "
          f"dpo_batch_size={args.batch_size} dpo_max_length={args.max_length}")
    print(f"{'sampler':<22}{'median tokens':>14}{'mean tokens':>12}")
    for grouped, name in ((False, "plain shuffle"), (True, "context chains")):
        print(f"{name:<22}{statistics.median(tokens[grouped]):>14.0f}{statistics.mean(tokens[grouped]):>12.1f}")
    print(f"context chains / plain shuffle: {statistics.mean(tokens[True]) / statistics.mean(tokens[False]):.2f} (mean tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
