"""Step time and peak memory of the trainer's loss path: GRPO, + SDPO, + SDPO + DPO, same batch.

Runs without TRL's trainer or datasets (torch, transformers, TRL's fused LM head and
`trainer_client.losses`), so it needs only `.[train]` on a GPU box. It reproduces what
`ComposerTrainer` computes per optimizer step on a random-initialised Qwen2 model:

- grpo:      policy forward on prompt + completion through TRL's fused LM head (per-token log-probs
             and entropy, as `GRPOTrainer` asks for them), the clipped GRPO surrogate, backward,
             AdamW step.
- +sdpo:     the student's hidden states at the hint-site positions of that same forward (a hook
             on the backbone), the vocab projection only there, a no-grad teacher forward over the
             hinted contexts (cut at the end of the hinted turn), the generalized JSD; one backward.
- +sdpo+dpo: plus one DPO mini-batch: chosen and rejected in one forward with grad, the vocab
             projection only at the action tokens, cached reference log-probs.

Noise: the variants' steps are interleaved (each repetition runs one step of every variant, in a
rotating order, on one model), so load that comes and goes hits them alike; the script prints
medians, p99, the ratio of medians and the median of per-repetition ratios, and the load average.
Peak memory is measured per variant in its own subprocess (CUDA max allocated, or CPU max RSS).
Usage:
    python benchmarks/trainer_step.py --preset cpu
    python benchmarks/trainer_step.py --preset gpu      # ~0.5B params, vocab 49152, 2k completions, bf16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config
from trl.trainer.utils import add_fused_lm_head

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_client.losses import dpo_loss, generalized_jsd  # noqa: E402
from samples import percentile  # noqa: E402

PRESETS = {
    # 2 shared CPU cores: small shapes, real vocabulary.
    "cpu": dict(hidden=256, layers=4, heads=4, kv_heads=2, vocab=49152, batch=4, prompt=64, completion=256,
                sites_per_sample=1, site_tokens=32, hint_tokens=24, dpo_pairs=1, dpo_length=128, dpo_action=32,
                repetitions=12, dtype="float32"),
    # Realistic shape: ~0.5B parameters (Qwen2.5-0.5B-like), completions of 2k tokens, bf16.
    "gpu": dict(hidden=896, layers=24, heads=14, kv_heads=2, vocab=49152, batch=4, prompt=512, completion=2048,
                sites_per_sample=2, site_tokens=64, hint_tokens=48, dpo_pairs=1, dpo_length=512, dpo_action=128,
                repetitions=20, dtype="bfloat16"),
}
VARIANTS = ("grpo", "grpo+sdpo", "grpo+sdpo+dpo")


def build_model(p: dict, device: torch.device) -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=p["vocab"], hidden_size=p["hidden"], intermediate_size=int(p["hidden"] * 5.4), num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"], max_position_embeddings=8192, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, p["dtype"])).to(device)
    model.activation_checkpointing_enable()
    model.config.use_cache = False
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # as GRPOTrainer does
    return model.train()


@dataclass(frozen=True)
class Workload:
    """One optimizer step's inputs, identical for every variant."""

    ids: torch.Tensor
    labels: torch.Tensor
    """`ids` with the prompt masked (-100): only completion tokens are scored, as in GRPOTrainer."""
    advantages: torch.Tensor
    site_rows: torch.Tensor
    site_positions: torch.Tensor
    """Student positions whose hidden state predicts a hint-site token."""
    teacher_ids: torch.Tensor
    """Hinted contexts, each cut at the end of its hint-site turn."""
    dpo_ids: torch.Tensor
    """Chosen sequences, then rejected ones: one forward."""
    dpo_rows: torch.Tensor
    dpo_positions: torch.Tensor
    dpo_reference: torch.Tensor


def build_workload(p: dict, device: torch.device) -> Workload:
    g = torch.Generator().manual_seed(1)
    b, prompt, completion = p["batch"], p["prompt"], p["completion"]
    ids = torch.randint(0, p["vocab"], (b, prompt + completion), generator=g)
    labels = ids.clone()
    labels[:, :prompt] = -100
    # Hint sites spread over the completion; the teacher reads the hint before each site's turn.
    sites = [(row, prompt + (k + 1) * completion // (p["sites_per_sample"] + 1))
             for row in range(b) for k in range(p["sites_per_sample"])]
    n = p["site_tokens"]
    hint = torch.randint(0, p["vocab"], (p["hint_tokens"],), generator=g)
    teacher_ids = torch.stack([torch.cat([ids[r, :s], hint, ids[r, s : s + n]]) for r, s in sites])
    dpo_ids = torch.randint(0, p["vocab"], (2 * p["dpo_pairs"], p["dpo_length"]), generator=g)
    action_start = p["dpo_length"] - p["dpo_action"]  # the scored action ends each sequence
    dpo_rows = torch.arange(dpo_ids.size(0)).repeat_interleave(p["dpo_action"])
    dpo_positions = torch.arange(action_start - 1, p["dpo_length"] - 1).repeat(dpo_ids.size(0))
    return Workload(
        ids=ids.to(device),
        labels=labels.to(device),
        advantages=torch.randn(b, generator=g).to(device),
        site_rows=torch.tensor([r for r, _ in sites for _ in range(n)], device=device),
        site_positions=torch.tensor([s - 1 + t for _, s in sites for t in range(n)], device=device),
        teacher_ids=teacher_ids.to(device),
        dpo_ids=dpo_ids.to(device),
        dpo_rows=dpo_rows.to(device),
        dpo_positions=dpo_positions.to(device),
        dpo_reference=(torch.randn(2 * p["dpo_pairs"], generator=g) - 50.0).to(device),
    )


def grpo_loss(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2) -> torch.Tensor:
    ratio = torch.exp(logps - logps.detach())
    surrogate = torch.min(ratio * advantages[:, None], ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
    return (-(surrogate * mask).sum(-1) / mask.sum(-1)).mean()


def train_step(variant: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, w: Workload, p: dict) -> None:
    captured: list[torch.Tensor] = []
    hook = model.model.register_forward_hook(lambda _m, _a, out: captured.append(out.last_hidden_state))
    try:
        out = model(input_ids=w.ids, labels=w.labels, fused_lm_head=True)
    finally:
        hook.remove()
    mask = out.label_mask[:, p["prompt"] - 1 :].float()
    loss = grpo_loss(out.log_probs[:, p["prompt"] - 1 :], w.advantages, mask)
    if variant != "grpo":
        student = model.lm_head(captured[0][w.site_rows, w.site_positions])
        with torch.no_grad():
            teacher_hidden = model.model(input_ids=w.teacher_ids).last_hidden_state
            width = w.teacher_ids.size(1)
            teacher = model.lm_head(teacher_hidden[:, width - p["site_tokens"] - 1 : width - 1]).flatten(0, 1)
        loss = loss + 0.5 * generalized_jsd(student, teacher, beta=0.5, top_k=256)
    if variant == "grpo+sdpo+dpo":
        dpo_hidden = model.model(input_ids=w.dpo_ids).last_hidden_state
        logits = model.lm_head(dpo_hidden[w.dpo_rows, w.dpo_positions]).float()
        targets = w.dpo_ids[w.dpo_rows, w.dpo_positions + 1]
        token_logps = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        seq_logps = torch.zeros(w.dpo_ids.size(0), device=logits.device).index_add(0, w.dpo_rows, token_logps)
        half = p["dpo_pairs"]
        result = dpo_loss(seq_logps[:half], seq_logps[half:], w.dpo_reference[:half], w.dpo_reference[half:])
        loss = loss + 0.1 * result.losses.mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(device: torch.device, step: Callable[[], None]) -> float:
    started = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def measure_times(p: dict, device: torch.device) -> tuple[dict[str, list[float]], int]:
    """Step times per variant (one step of each per repetition, the order rotating), and the parameter count."""
    model = build_model(p, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    work = build_workload(p, device)
    for variant in VARIANTS:  # warm-up: allocator, kernels, optimizer state
        timed(device, lambda v=variant: train_step(v, model, optimizer, work, p))
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for repetition in range(p["repetitions"]):
        shift = repetition % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            times[variant].append(timed(device, lambda v=variant: train_step(v, model, optimizer, work, p)))
    return times, sum(x.numel() for x in model.parameters())


def measure_peak(variant: str, p: dict, device: torch.device) -> int:
    """Peak memory of one variant alone: a warm-up step, then two measured ones."""
    model = build_model(p, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    work = build_workload(p, device)
    timed(device, lambda: train_step(variant, model, optimizer, work, p))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        timed(device, lambda: train_step(variant, model, optimizer, work, p))
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repetitions", type=int, help="measured steps per variant, interleaved (after one warm-up each)")
    parser.add_argument("--peak-of", choices=VARIANTS, help=argparse.SUPPRESS)  # internal: one variant's peak memory
    args = parser.parse_args()
    preset = dict(PRESETS[args.preset])
    if args.repetitions:
        preset["repetitions"] = args.repetitions
    device = torch.device("cuda" if args.preset == "gpu" else "cpu")
    if args.peak_of:
        print(json.dumps({"peak_bytes": measure_peak(args.peak_of, preset, device)}))
        return 0

    peaks = {}
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--preset", args.preset, "--peak-of", variant]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        peaks[variant] = json.loads(output.strip().splitlines()[-1])["peak_bytes"]
    load_before = os.getloadavg()[0]
    times, parameters = measure_times(preset, device)
    load_after = os.getloadavg()[0]

    print(f"preset={args.preset} params={parameters / 1e6:.1f}M device={device} torch={torch.__version__} "
          f"threads={torch.get_num_threads()} load average (1 min) {load_before:.1f} before, {load_after:.1f} after")
    print(f"shapes={json.dumps(preset)}")
    base = statistics.median(times["grpo"])
    print(f"{'variant':<16}{'median s':>10}{'p99 s':>10}{'x grpo':>8}{'paired x':>10}{'peak GiB':>10}{'x grpo':>8}")
    for variant in VARIANTS:
        paired = statistics.median(t / g for t, g in zip(times[variant], times["grpo"]))
        print(f"{variant:<16}{statistics.median(times[variant]):>10.3f}{percentile(times[variant], 0.99):>10.3f}"
              f"{statistics.median(times[variant]) / base:>8.2f}{paired:>10.2f}"
              f"{peaks[variant] / 2**30:>10.2f}{peaks[variant] / peaks['grpo']:>8.2f}")
    print("x grpo: ratio of medians; paired x: median over repetitions of (variant step / grpo step of that repetition)")
    print("targets: all three channels <= 1.30x step time and <= 1.15x peak memory of grpo")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
