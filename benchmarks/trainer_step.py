"""Step time and peak memory of the trainer's loss path: GRPO, + SDPO, + SDPO + DPO, same batch.

Self-contained on purpose (torch + transformers + `trainer_client.losses`, no TRL, no datasets) so
it runs on a bare GPU box. It reproduces what `ComposerTrainer` computes per optimizer step on a
random-initialised Qwen2 model:

- grpo:      policy forward on prompt + completion, per-token log-probs of the completion, the
             clipped GRPO surrogate (TRL's "grpo" loss), backward, AdamW step.
- +sdpo:     the student's hidden states at the hint-site positions of that same forward, the vocab
             projection only there, a no-grad teacher forward over the hinted contexts (cut at the
             end of the hinted turn), the generalized JSD, one backward for both terms.
- +sdpo+dpo: plus one DPO mini-batch (chosen + rejected forward with grad; cached reference).

Each variant runs in its own subprocess so peak memory (CUDA max allocated, or CPU max RSS) is its
own. Usage:
    python benchmarks/trainer_step.py --preset cpu
    python benchmarks/trainer_step.py --preset gpu      # ~0.5B params, vocab 49152, 2k completions, bf16
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_client.losses import dpo_loss, generalized_jsd  # noqa: E402

PRESETS = {
    # 2 shared CPU cores: small shapes, real vocabulary.
    "cpu": dict(hidden=256, layers=4, heads=4, kv_heads=2, vocab=49152, batch=4, prompt=64, completion=256,
                sites_per_sample=1, site_tokens=32, hint_tokens=24, dpo_pairs=1, dpo_length=128, steps=5, dtype="float32"),
    # Realistic shape: ~0.5B parameters (Qwen2.5-0.5B-like), completions of 2k tokens, bf16.
    "gpu": dict(hidden=896, layers=24, heads=14, kv_heads=2, vocab=49152, batch=4, prompt=512, completion=2048,
                sites_per_sample=2, site_tokens=64, hint_tokens=48, dpo_pairs=1, dpo_length=512, steps=10, dtype="bfloat16"),
}
VARIANTS = ("grpo", "grpo+sdpo", "grpo+sdpo+dpo")


def build_model(p: dict, device: torch.device) -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=p["vocab"], hidden_size=p["hidden"], intermediate_size=int(p["hidden"] * 5.4), num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"], max_position_embeddings=8192, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, p["dtype"])).to(device)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    return model.train()


def grpo_loss(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2) -> torch.Tensor:
    ratio = torch.exp(logps - logps.detach())
    surrogate = torch.min(ratio * advantages[:, None], ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
    return (-(surrogate * mask).sum(-1) / mask.sum(-1)).mean()


def completion_logps(model, hidden: torch.Tensor, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    logits = model.lm_head(hidden[:, prompt - 1 : -1]).float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, prompt:, None]).squeeze(-1)


def run_variant(variant: str, p: dict, device: torch.device) -> dict:
    model = build_model(p, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(1)
    b, prompt, completion = p["batch"], p["prompt"], p["completion"]
    ids = torch.randint(0, p["vocab"], (b, prompt + completion), generator=g).to(device)
    mask = torch.ones(b, completion, device=device)
    advantages = torch.randn(b, generator=g).to(device)
    # Hint sites spread over the completion; the teacher reads the hint before each site's turn.
    sites = [(row, start) for row in range(b) for start in
             [prompt + (k + 1) * completion // (p["sites_per_sample"] + 1) for k in range(p["sites_per_sample"])]]
    hint = torch.randint(0, p["vocab"], (p["hint_tokens"],), generator=g).to(device)
    dpo_ids = torch.randint(0, p["vocab"], (2 * p["dpo_pairs"], p["dpo_length"]), generator=g).to(device)
    dpo_action = p["dpo_length"] // 4  # scored tokens at the end of each sequence
    dpo_reference = torch.randn(2 * p["dpo_pairs"], generator=g).to(device) - 50.0

    def step() -> None:
        hidden = model.model(input_ids=ids).last_hidden_state
        loss = grpo_loss(completion_logps(model, hidden, ids, prompt), advantages, mask)
        if variant != "grpo":
            rows = torch.tensor([r for r, s in sites for _ in range(p["site_tokens"])], device=device)
            cols = torch.tensor([s - 1 + t for _, s in sites for t in range(p["site_tokens"])], device=device)
            student = model.lm_head(hidden[rows, cols])
            with torch.no_grad():
                teacher_ids = torch.stack([torch.cat([ids[r, :s], hint, ids[r, s : s + p["site_tokens"]]]) for r, s in sites])
                teacher_hidden = model.model(input_ids=teacher_ids).last_hidden_state
                width = teacher_ids.size(1)
                teacher = model.lm_head(teacher_hidden[:, width - p["site_tokens"] - 1 : width - 1]).flatten(0, 1)
            loss = loss + 0.5 * generalized_jsd(student, teacher, beta=0.5, top_k=256)
        if variant == "grpo+sdpo+dpo":
            dpo_hidden = model.model(input_ids=dpo_ids).last_hidden_state
            logits = model.lm_head(dpo_hidden[:, -dpo_action - 1 : -1]).float()
            seq_logps = torch.log_softmax(logits, -1).gather(-1, dpo_ids[:, -dpo_action:, None]).squeeze(-1).sum(-1)
            half = p["dpo_pairs"]
            out = dpo_loss(seq_logps[:half], seq_logps[half:], dpo_reference[:half], dpo_reference[half:])
            loss = loss + 0.1 * out.losses.mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: allocator, kernels, optimizer state
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(p["steps"]):
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"variant": variant, "times": times, "peak_bytes": peak, "parameters": sum(x.numel() for x in model.parameters())}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, help="measured steps per variant (after one warm-up)")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # internal: one variant, JSON out
    args = parser.parse_args()
    preset = dict(PRESETS[args.preset])
    if args.steps:
        preset["steps"] = args.steps
    device = torch.device("cuda" if args.preset == "gpu" else "cpu")
    if args.variant:
        print(json.dumps(run_variant(args.variant, preset, device)))
        return 0

    results = {}
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--preset", args.preset, "--variant", variant]
        if args.steps:
            command += ["--steps", str(args.steps)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(output.strip().splitlines()[-1])
    base = results["grpo"]
    print(f"preset={args.preset} params={base['parameters'] / 1e6:.1f}M device={device} shapes={json.dumps(preset)}")
    print(f"{'variant':<16}{'median s':>10}{'p99 s':>10}{'x grpo':>8}{'peak GiB':>10}{'x grpo':>8}")
    for variant, result in results.items():
        median = statistics.median(result["times"])
        ratio_time = median / statistics.median(base["times"])
        ratio_memory = result["peak_bytes"] / base["peak_bytes"]
        print(f"{variant:<16}{median:>10.3f}{percentile(result['times'], 0.99):>10.3f}{ratio_time:>8.2f}"
              f"{result['peak_bytes'] / 2**30:>10.2f}{ratio_memory:>8.2f}")
    print("targets: all three channels <= 1.30x step time and <= 1.15x peak memory of grpo")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
