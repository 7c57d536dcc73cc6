"""Tokens the DPO channel runs per mini-batch for a pairs file: one row per pair (decision 075) against
the prefix-tree rows (decision 079), drawn by a plain shuffle and by context chains (decision 078, the
`dpo_group_by_context` default), with no model and no step.

It tokenizes the pairs as the trainer does: SmolLM2's tool template (or `--tokenizer`), and for a pair
without its own tools, the service's tools as a rollout's prompt carries them, and the system prompt
of `coding-train train`'s rollouts (none: the template's default). Then it
draws `--passes` passes of mini-batches each way and counts the tokens the rows hold
(`PackedBatch.token_count`, padding left out). It prints the chains found, the median and mean
tokens per mini-batch, and the mean's ratio to one row per pair. "head read": less the head each row
shares with a rollout's prompt, which the trainer reads from GRPO's forward (decision 079).
Usage:
    python benchmarks/dpo_batch_tokens.py trainer_client/configs/data/cpu_smoke_pairs.jsonl [--batch-size 2] [--max-length 2048]
    python benchmarks/dpo_batch_tokens.py --tiny       # that file, one pass each way (CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from env_server.tools import TOOL_SCHEMAS  # noqa: E402
from trainer_client.demos import prompt_tool_schemas  # noqa: E402
from trainer_client.packing import common_prefix_length  # noqa: E402
from trainer_client.policy import load_tool_tokenizer  # noqa: E402
from trainer_client.preferences import PreferenceBatches, load_preference_pairs  # noqa: E402

SMOKE_PAIRS = Path(__file__).resolve().parents[1] / "trainer_client" / "configs" / "data" / "cpu_smoke_pairs.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pairs", type=Path, nargs="?", help="preference pairs JSONL (`coding-train replay`'s output); --tiny: the CPU smoke pairs")
    parser.add_argument("--batch-size", type=int, default=2, help="the trainer's dpo_batch_size")
    parser.add_argument("--max-length", type=int, default=2048, help="the trainer's dpo_max_length")
    parser.add_argument("--tokenizer", help="a tokenizer path or name (default: SmolLM2's, with the tool template)")
    parser.add_argument("--passes", type=int, default=20, help="passes over the pairs drawn each way")
    parser.add_argument("--tiny", action="store_true", help="one pass each way, of the CPU smoke pairs unless a file is given")
    args = parser.parse_args()
    if args.tiny:
        args.passes = 1
        args.pairs = args.pairs or SMOKE_PAIRS
    if args.pairs is None:
        parser.error("give a pairs file (or --tiny)")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else load_tool_tokenizer()
    pairs = load_preference_pairs(args.pairs)
    if not pairs:
        raise SystemExit(f"{args.pairs} holds no preference pairs: there is nothing to count")
    tools = prompt_tool_schemas(list(TOOL_SCHEMAS.values()))
    samplers = {
        grouped: PreferenceBatches(
            pairs, tokenizer, batch_size=args.batch_size, max_length=args.max_length, tools=tools,
            system_messages=[], group_by_context=grouped,  # `task_row` prompts: no system message (decision 083)
        )
        for grouped in (False, True)
    }
    draws = {
        grouped: [preferences.next_indices() for _ in range(args.passes * -(-len(preferences.pairs) // preferences.batch_size))]
        for grouped, preferences in samplers.items()
    }
    shuffle = samplers[False]
    # what a rollout of any task opens with: `task_row`'s empty user message before reset fills it in
    rollout_prompt = tokenizer.apply_chat_template([{"role": "user", "content": ""}], tools=tools, return_dict=False)

    def tree_tokens(preferences: PreferenceBatches, batch: list[int], *, head_read: bool) -> int:
        packed = preferences.collate(batch, tokenizer.pad_token_id, shared_prefix=True)
        if not head_read:
            return packed.token_count()
        contexts = [preferences.pairs[index].context_ids for index in batch]
        head = min(min(map(len, contexts)) - 1, *(common_prefix_length(rollout_prompt, context) for context in contexts))
        return packed.token_count() - head * packed.input_ids.size(0)

    tokens = {  # one row per pair, a context run once for its two actions (decision 075): the baseline
        "a row per pair, plain shuffle": [
            sum(len(shuffle.pairs[i].context_ids) + len(shuffle.pairs[i].chosen_ids) + len(shuffle.pairs[i].rejected_ids) for i in batch)
            for batch in draws[False]
        ],
        **{
            f"prefix tree, {'context chains' if grouped else 'plain shuffle'}{', head read' if head_read else ''}": [
                tree_tokens(samplers[grouped], batch, head_read=head_read) for batch in draws[grouped]
            ]
            for head_read in (False, True)
            for grouped in (False, True)
        },
    }
    chains = samplers[True].chains
    print(f"{len(pairs)} pairs in {len(chains)} context chains (lengths {sorted(map(len, chains), reverse=True)}); "
          f"dpo_batch_size={args.batch_size} dpo_max_length={args.max_length}")
    print(f"{'layout, sampler':<46}{'median tokens':>14}{'mean tokens':>12}{'x baseline':>11}")
    baseline = statistics.mean(tokens["a row per pair, plain shuffle"])
    for name, counts in tokens.items():
        print(f"{name:<46}{statistics.median(counts):>14.0f}{statistics.mean(counts):>12.1f}{statistics.mean(counts) / baseline:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
