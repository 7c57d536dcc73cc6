"""Step time and peak memory of the real `ComposerTrainer` optimizer step: GRPO, + SDPO, + SDPO + DPO.

What runs is the trainer's own step, not a re-implementation: `trainer.training_step` (TRL's
`_prepare_inputs`, `ComposerTrainer._compute_loss`: TRL's GRPO loss, the SDPO hook, teacher forward
and JSD, the DPO mini-batch; `accelerator.backward`), then gradient clipping and the optimizer step,
as transformers' training loop does them. Only generation is replaced: `ScriptedBatchTrainer` answers
`_generate_and_score_completions` with one fixed batch of rollouts (multi-turn completions with tool
output masked out, hint sites on the first turns, rewards' advantages), the same for every arm.

Arms: three trainers of one config but for `sdpo_weight` / `dpo_weight`, each on its own copy of one
random-initialised Qwen2 model (SmolLM2's tokenizer and its 49,152-token vocabulary).
Pairing: each repetition runs one step of every arm, in a rotating order, so load that comes and
goes hits the arms alike; the script prints medians, p99, the ratio of medians, the median of
per-repetition ratios, the process CPU time per step (less sensitive to other jobs than wall time)
and the load average. Peak memory: each arm alone in its own subprocess (CUDA max allocated, or the
CPU process's max RSS and its growth over the RSS before the first step).
Usage:
    python benchmarks/trainer_step.py --preset cpu [--jsd-top-k 100] [--site-turns last] [--teacher-runs-contexts] [--activation-checkpointing on]
    python benchmarks/trainer_step.py --preset smollm2 --jsd-top-k 100 [--dpo-pairs 1] [--dpo-contexts states] [--service-tools] [--dpo-runs-head]   # SmolLM2-135M's shape, ~20 min on 2 cores
    python benchmarks/trainer_step.py --preset gpu      # 0.52B params, vocab 49152, 2,048-token completions, bf16
    python benchmarks/trainer_step.py --tiny            # the tiny preset: the gpu preset's code path, as small as it goes (CI)
A step whose loss or gradient norm is not finite fails the run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from samples import checked_loss, percentile  # noqa: E402
from env_server.tools import TOOL_SCHEMAS  # noqa: E402
from trainer_client.demos import prompt_tool_schemas  # noqa: E402
from trainer_client.hint_sites import HintSite, HintTemplate  # noqa: E402
from trainer_client.policy import load_tool_tokenizer  # noqa: E402
from trainer_client.records import PreferencePair  # noqa: E402
from trainer_client.trainer import ComposerConfig, ComposerTrainer  # noqa: E402

PRESETS: dict[str, dict[str, Any]] = {
    # 2 shared CPU cores: small model, real vocabulary.
    "cpu": dict(hidden=256, layers=4, heads=4, kv_heads=2, batch=4, prompt=64, turns=4, turn_tokens=48,
                tool_tokens=16, sites_per_sample=1, site_turns="first", dpo_pairs=2, dpo_length=128, repetitions=10,
                dtype="float32", activation_checkpointing=False),
    # `--tiny` (CI, and the GPU check's dry run): the gpu preset's code path (bf16 weights, activation
    # checkpointing), as small as it goes.
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, batch=2, prompt=32, turns=2, turn_tokens=16, tool_tokens=8,
                 sites_per_sample=1, site_turns="first", dpo_pairs=1, dpo_length=64, repetitions=1, dtype="bfloat16",
                 activation_checkpointing=True),
    # SmolLM2-135M's shape (the learning curves' model: 30 layers of 576, 9 heads, 3 KV heads), random init;
    # a tool-schema-sized prompt; 4 turns, the hint site on the last (a failed submission, decision 074).
    "smollm2": dict(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, batch=4, prompt=512, turns=4,
                    turn_tokens=48, tool_tokens=64, sites_per_sample=1, site_turns="last", dpo_pairs=2, dpo_length=512, repetitions=5,
                    dtype="float32", activation_checkpointing=False),
    # Realistic shape: 0.52B parameters (Qwen2-style, SmolLM2 vocabulary), completions of 2,048 tokens, bf16.
    "gpu": dict(hidden=1024, layers=24, heads=16, kv_heads=4, batch=4, prompt=512, turns=8, turn_tokens=200,
                tool_tokens=64, sites_per_sample=2, site_turns="first", dpo_pairs=2, dpo_length=512, repetitions=20,
                dtype="bfloat16", activation_checkpointing=True),
}
ARMS = {"grpo": (0.0, 0.0), "grpo+sdpo": (0.5, 0.0), "grpo+sdpo+dpo": (0.5, 0.1)}
"""Arm -> (sdpo_weight, dpo_weight)."""


def completion_length(p: dict[str, Any]) -> int:
    return p["turns"] * p["turn_tokens"] + (p["turns"] - 1) * p["tool_tokens"]


def random_model(p: dict[str, Any], vocab_size: int) -> PreTrainedModel:
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=p["hidden"], intermediate_size=p.get("intermediate", int(p["hidden"] * 5.4)),
        num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
        max_position_embeddings=8192, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, p["dtype"]))


class ScriptedBatchTrainer(ComposerTrainer):
    """`ComposerTrainer` whose generation answers one fixed batch of rollouts; the step itself is the trainer's."""

    scripted_batch: dict[str, Any]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # TRL shuffles and splits a copy; the tensors are not changed in place. On the trainer's device, as
        # the generation they stand in for leaves them.
        device = self.accelerator.device
        return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in self.scripted_batch.items()}


def task_messages(p: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """A system prompt and a long task message (about `dpo_length` tokens)."""
    task = f"Task {label}: " + " ".join(["check"] * (p["dpo_length"] - 48))
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": task}]


def scripted_batch(p: dict[str, Any], tokenizer: Any, template: HintTemplate, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Rollouts as TRL lays them out: prompt ending in the assistant header; turns of policy tokens ending in
    `<|im_end|>`, each but the last followed by tool output (masked out) ending in the next assistant header;
    a hint site on each of the first (`site_turns` "first") or last ("last") `sites_per_sample` turns.
    The prompt is `prompt` random tokens, or with `tools` the task message rendered with them."""
    hinted_turns = range(p["sites_per_sample"]) if p["site_turns"] == "first" else range(p["turns"] - p["sites_per_sample"], p["turns"])
    g = torch.Generator().manual_seed(1)
    header = list(template.header_ids)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    filler = lambda n: torch.randint(1000, len(tokenizer) - 1000, (n,), generator=g).tolist()  # noqa: E731
    hint_ids = template.message_ids(("`pytset` is not a command; did you mean `pytest`?",))
    prompts, completions, tool_masks, sites = [], [], [], []
    rendered = tokenizer.apply_chat_template(task_messages(p, "0"), tools=tools, add_generation_prompt=True, return_dict=False) if tools else None
    for _ in range(p["batch"]):
        prompts.append(list(rendered) if rendered else filler(p["prompt"] - len(header)) + header)
        completion, tool_mask, rollout_sites = [], [], []
        for turn in range(p["turns"]):
            start = len(completion)
            completion += filler(p["turn_tokens"] - 1) + [end_of_turn]
            tool_mask += [1] * p["turn_tokens"]
            if turn in hinted_turns:
                rollout_sites.append(HintSite(turn=turn, start=start, end=len(completion), hints=("hint",),
                                              hint_ids=hint_ids, error_kinds=("command_not_found",)))
            if turn < p["turns"] - 1:
                completion += filler(p["tool_tokens"] - len(header)) + header
                tool_mask += [0] * p["tool_tokens"]
        completions.append(completion)
        tool_masks.append(tool_mask)
        sites.append(rollout_sites)
    completion_mask = torch.ones(p["batch"], completion_length(p), dtype=torch.long)
    tool_mask = torch.tensor(tool_masks)
    return {
        "prompt_ids": torch.tensor(prompts),
        "prompt_mask": torch.ones(p["batch"], len(prompts[0]), dtype=torch.long),
        "completion_ids": torch.tensor(completions),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.randn(p["batch"], generator=g),
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
        "hint_sites": sites,
        "hint_tokens": torch.tensor(sum(site.end - site.start for rollout in sites for site in rollout)),
    }


def preference_pairs(p: dict[str, Any], contexts: str, tools: list[dict[str, Any]] | None) -> list[PreferencePair]:
    """Two mini-batches of `dpo_pairs` pairs: pair k of a mini-batch at a history of a task message and
    k exchanges (a call and `tool_tokens` of output), answered by a tool call; rendered with `tools`.
    `contexts` "traces": every pair from a trace of its own (no context extends another); "states": a
    mini-batch's pairs at consecutive states of one trace (each context extends the one before, decision 078)."""
    def call(command: str) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}

    def history(trace: int, exchanges: int) -> list[dict[str, Any]]:
        messages = task_messages(p, str(trace))
        for exchange in range(exchanges):
            messages += [call(f"cat part{exchange}.py"), {"role": "tool", "content": " ".join(["line"] * p["tool_tokens"])}]
        return messages

    pairs = []
    for batch in range(2):
        for state in range(p["dpo_pairs"]):
            trace = batch if contexts == "states" else batch * p["dpo_pairs"] + state
            pairs.append(PreferencePair(state_id=f"t{trace}/s{state}", messages=history(trace, state), tools=tools,
                                        chosen=call("python3 -m pytest -q tests"), rejected=call(f"pytset -q {state}")))
    return pairs


class Arm:
    """One trainer with its optimizer, ready to take real optimizer steps on the scripted batch."""

    def __init__(
        self, name: str, p: dict[str, Any], model: PreTrainedModel, tokenizer: Any, device: torch.device, args: argparse.Namespace
    ) -> None:
        sdpo_weight, dpo_weight = ARMS[name]
        tools = prompt_tool_schemas(list(TOOL_SCHEMAS.values())) if args.service_tools else None
        head = len(tokenizer.apply_chat_template([{"role": "system", "content": ""}], tools=tools, return_dict=False)) if tools else 0
        config = ComposerConfig(
            output_dir=f"/tmp/trainer_step/{name}", use_cpu=device.type == "cpu", bf16=p["dtype"] == "bfloat16",
            fp16=False, activation_checkpointing=p["activation_checkpointing"], per_device_train_batch_size=p["batch"],
            num_generations=2, max_completion_length=completion_length(p), report_to=[], save_strategy="no",
            learning_rate=1e-6, seed=0, sdpo_weight=sdpo_weight, dpo_weight=dpo_weight,
            dpo_batch_size=p["dpo_pairs"], dpo_max_length=head + p["dpo_length"] + p["dpo_pairs"] * (p["tool_tokens"] + 64) + 64,
            jsd_top_k=args.jsd_top_k,
            sdpo_reuse_policy_cache=not args.teacher_runs_contexts,
            dpo_reuse_policy_cache=not args.dpo_runs_head,
        )
        self.trainer = ScriptedBatchTrainer(
            model=model.to(device),
            reward_funcs=lambda completions, **_: [0.0] * len(completions),  # never called: generation is scripted
            args=config,
            # the rollouts' system prompt, which the DPO pairs are rendered with (`dpo_system_prompt`)
            train_dataset=Dataset.from_list([{"prompt": task_messages(p, "0")}] * p["batch"]),
            processing_class=tokenizer,
            preference_pairs=preference_pairs(p, args.dpo_contexts, tools) if dpo_weight > 0 else None,
        )
        template = HintTemplate(tokenizer, chat_template=self.trainer.chat_template,
                                chat_template_kwargs=self.trainer.chat_template_kwargs, role=config.hint_role)
        self.trainer.scripted_batch = scripted_batch(p, tokenizer, template, tools)
        self.trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
        if config.activation_checkpointing:  # as transformers' `train()` turns it on
            self.trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs=config.activation_checkpointing_kwargs)
        self.trainer.create_optimizer()
        # As transformers' training loop prepares them (mixed-precision autocast, device placement).
        self.model, self.optimizer = self.trainer.accelerator.prepare(self.trainer.model, self.trainer.optimizer)
        self.device = device
        self.name = name

    def step(self) -> tuple[float, float]:
        """One optimizer step: (wall seconds, process CPU seconds). A loss or gradient norm that is not
        finite fails the run (after the step: reading them synchronises, so the timing excludes it)."""
        trainer = self.trainer
        wall, cpu = time.perf_counter(), time.process_time()
        loss = trainer.training_step(self.model, [{}] * trainer.args.per_device_train_batch_size, None)
        norm = trainer.accelerator.clip_grad_norm_(self.model.parameters(), trainer.args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        timed = time.perf_counter() - wall, time.process_time() - cpu
        checked_loss(loss.item(), f"{self.name}: a step")
        checked_loss(norm.item(), f"{self.name}: a step's gradient norm")
        return timed


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_peak(name: str, p: dict[str, Any], device: torch.device, args: argparse.Namespace) -> dict[str, int]:
    """Peak memory of one arm alone: a warm-up step, then two measured ones."""
    tokenizer = load_tool_tokenizer()
    arm = Arm(name, p, random_model(p, len(tokenizer)), tokenizer, device, args)
    if device.type == "cuda":
        arm.step()
        torch.cuda.reset_peak_memory_stats()
        arm.step(), arm.step()
        return {"peak_bytes": torch.cuda.max_memory_allocated()}
    before = current_rss_bytes()
    for _ in range(3):
        arm.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_bytes": peak, "growth_bytes": peak - before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny preset (--preset tiny): every path and check, as small as it goes")
    parser.add_argument("--repetitions", type=int, help="measured steps per arm, interleaved (after one warm-up each)")
    parser.add_argument("--jsd-top-k", type=int, help="the trainer's `jsd_top_k` (default: its own, the full vocabulary)")
    parser.add_argument("--site-turns", choices=["first", "last"],
                        help="which turns hold the hint sites (default: the preset's): the first (a short teacher context) "
                        "or the last, where a failed submission's site is (decision 074; the context is nearly the rollout)")
    parser.add_argument("--dpo-pairs", type=int, help="DPO pairs per step, the trainer's dpo_batch_size (default: the preset's)")
    parser.add_argument("--dpo-contexts", choices=["traces", "states"], default="traces",
                        help="each DPO pair from a trace of its own (default), or a mini-batch's pairs at consecutive "
                        "states of one trace, whose shared context runs once (decision 078)")
    parser.add_argument("--service-tools", action="store_true",
                        help="every rollout's prompt and every pair's context renders the service's tool schemas and a "
                        "task message, as real ones do (about 1,000 tokens they all share; decision 079)")
    parser.add_argument("--teacher-runs-contexts", action="store_true",
                        help="sdpo_reuse_policy_cache off: the teacher runs the contexts again (decision 076's baseline)")
    parser.add_argument("--dpo-runs-head", action="store_true",
                        help="dpo_reuse_policy_cache off: the DPO rows run the head they share with the rollouts' prompt "
                        "instead of reading it from GRPO's forward (decision 079's baseline)")
    parser.add_argument("--activation-checkpointing", choices=["on", "off"],
                        help="recompute each layer's activations in the backward (default: the preset's; the gpu preset's is on)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file (benchmarks/gpu_check.py reads it)")
    parser.add_argument("--peak-of", choices=ARMS, help=argparse.SUPPRESS)  # internal: one arm's peak memory
    args = parser.parse_args()
    if args.tiny:
        args.preset = "tiny"
    preset = dict(PRESETS[args.preset])
    if args.repetitions:
        preset["repetitions"] = args.repetitions
    if args.site_turns:
        preset["site_turns"] = args.site_turns
    if args.dpo_pairs:
        preset["dpo_pairs"] = args.dpo_pairs
    if args.activation_checkpointing:
        preset["activation_checkpointing"] = args.activation_checkpointing == "on"
    device = torch.device("cuda" if args.preset == "gpu" else "cpu")
    if args.peak_of:
        print(json.dumps(measure_peak(args.peak_of, preset, device, args)))
        return 0

    peaks = {}
    for name in ARMS:
        command = [sys.executable, __file__, "--preset", args.preset, "--peak-of", name]
        command += ["--jsd-top-k", str(args.jsd_top_k)] if args.jsd_top_k else []
        command += ["--site-turns", preset["site_turns"], "--dpo-pairs", str(preset["dpo_pairs"]),
                    "--activation-checkpointing", "on" if preset["activation_checkpointing"] else "off"]
        command += ["--teacher-runs-contexts"] if args.teacher_runs_contexts else []
        command += ["--dpo-runs-head"] if args.dpo_runs_head else []
        command += ["--dpo-contexts", args.dpo_contexts] + (["--service-tools"] if args.service_tools else [])
        output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout  # stderr: the caller's log
        peaks[name] = json.loads(output.strip().splitlines()[-1])

    tokenizer = load_tool_tokenizer()
    model = random_model(preset, len(tokenizer))
    arms = {name: Arm(name, preset, copy.deepcopy(model), tokenizer, device, args) for name in ARMS}
    for arm in arms.values():  # warm-up: allocator, kernels, optimizer state
        arm.step()
    load_before = os.getloadavg()[0]
    wall: dict[str, list[float]] = {name: [] for name in ARMS}
    cpu: dict[str, list[float]] = {name: [] for name in ARMS}
    order = list(ARMS)
    for repetition in range(preset["repetitions"]):
        shift = repetition % len(order)
        for name in order[shift:] + order[:shift]:
            seconds, cpu_seconds = arms[name].step()
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    load_after = os.getloadavg()[0]

    parameters = sum(x.numel() for x in model.parameters())
    print(f"preset={args.preset} params={parameters / 1e6:.1f}M vocab={len(tokenizer)} device={device} "
          f"torch={torch.__version__} threads={torch.get_num_threads()} jsd_top_k={args.jsd_top_k} "
          f"site_turns={preset['site_turns']} teacher_reads_policy_cache={not args.teacher_runs_contexts} "
          f"dpo_contexts={args.dpo_contexts} service_tools={args.service_tools} dpo_reads_policy_head={not args.dpo_runs_head} "
          f"load average (1 min) {load_before:.1f} before, {load_after:.1f} after")
    prompt = arms["grpo"].trainer.scripted_batch["prompt_ids"].size(1)
    print(f"shapes={json.dumps(preset)} prompt={prompt} completion={completion_length(preset)}")
    memory = "peak GiB" if device.type == "cuda" else "RSS GiB"
    print(f"{'arm':<15}{'median s':>9}{'p99 s':>8}{'x grpo':>7}{'paired x':>9}{'cpu s':>7}{'x grpo':>7}"
          f"{memory:>9}{'x grpo':>7}" + ("" if device.type == "cuda" else f"{'growth GiB':>11}{'x grpo':>7}"))
    base_wall, base_cpu = statistics.median(wall["grpo"]), statistics.median(cpu["grpo"])
    figures: dict[str, dict[str, float]] = {}
    for name in ARMS:
        figures[name] = {
            "median_s": statistics.median(wall[name]),
            "p99_s": percentile(wall[name], 0.99),
            "x_grpo": statistics.median(wall[name]) / base_wall,
            "paired_x_grpo": statistics.median(t / g for t, g in zip(wall[name], wall["grpo"])),
            "cpu_s": statistics.median(cpu[name]),
            "peak_bytes": peaks[name]["peak_bytes"],
            "peak_x_grpo": peaks[name]["peak_bytes"] / peaks["grpo"]["peak_bytes"],
        }
        f = figures[name]
        line = (f"{name:<15}{f['median_s']:>9.3f}{f['p99_s']:>8.3f}{f['x_grpo']:>7.2f}{f['paired_x_grpo']:>9.2f}"
                f"{f['cpu_s']:>7.2f}{f['cpu_s'] / base_cpu:>7.2f}{f['peak_bytes'] / 2**30:>9.2f}{f['peak_x_grpo']:>7.2f}")
        if device.type != "cuda":
            growth = peaks[name]["growth_bytes"]
            line += f"{growth / 2**30:>11.2f}{growth / peaks['grpo']['growth_bytes']:>7.2f}"
        print(line)
    print("x grpo: ratio of medians; paired x: median over repetitions of (arm step / grpo step of that repetition); "
          "cpu s: process CPU time per step (all threads)")
    token_share = statistics.median(arms["grpo+sdpo+dpo"].trainer._metrics["train"]["dpo/token_share"])
    print(f"dpo/token_share={token_share:.3f} (median over the steps): the DPO mini-batch's tokens over GRPO's (decision 077)")
    if args.json:
        args.json.write_text(json.dumps({
            "preset": args.preset, "shapes": preset, "params": parameters, "device": str(device),
            "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "repetitions": preset["repetitions"], "prompt_tokens": prompt,
            "completion_tokens": completion_length(preset), "arms": figures, "dpo_token_share": token_share,
        }, indent=1))
    print("targets (issue 14): all three channels <= 1.2x the GRPO step time and <= 1.1x its peak memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
