"""Learning curves: GRPO vs GRPO+SDPO (a privileged teacher: sibling + reference; or the template hints)
vs GRPO+SDPO+DPO from one warm start, at equal steps and rollouts.

Every arm starts from the same SFT checkpoint (`coding-train sft`), trains `ComposerTrainer` on
warmup train-split tasks through the service with the same seeds, batch, rollouts and steps; only
`sdpo_weight` (alpha), `dpo_weight` (beta) and the teacher's `hint_sources` differ (`ARMS`). The policy is evaluated on held-out warmup
tasks before training (once per seed: every arm starts there) and every `eval_every` steps, with
`trainer_client.evaluation` (pass@1, valid-call rate, reward, bootstrap intervals over tasks).
Training logs give the reward and the hint sites per batch. Curves are means over seeds with a
t-interval (95%) when there are >= 2 seeds.

The DPO arm's pairs come from the demos that made a mistake: at the state before the mistake the
clean expert action is preferred over the mistaken one (`trainer_client.demos.mistake_pair`).

Usage (the warm start and the benchmark use the same tasks and tool set, decision 073):
    coding-train demos --suite warmup --split train --id-prefix warmup/l1/ --tools write_file bash \\
        --shuffle --limit 160 --env-url http://127.0.0.1:8000 --out data/demos_l1.jsonl
    coding-train sft --config trainer_client/configs/sft/smollm2_l1_cpu.yaml      # -> out/sft_l1
    python benchmarks/learning_curve.py --warm-start out/sft_l1 --demos data/demos_l1.jsonl \\
        --env-url http://127.0.0.1:8000 --out out/learning_curve [--quick | --tiny]

Level-1 warmup tasks, tools `write_file, bash, submit`, one task per step. Full mode:
3 seeds x 3 arms x 4 steps of 4 rollouts, evaluation at steps 0 and 4 on 8 held-out tasks x 1 sample
at the training temperature; `--quick`: 1 seed, 2 steps of 2 rollouts, 4 tasks; `--tiny` (the GPU check's
dry run, CI): 1 seed, 1 step of 2 rollouts, 2 short turns, 2 tasks. `--frontier-samples K`
(default 0: off) first samples each train task K times with the warm start and trains first on the
tasks where a group of rollouts is likely to earn different rewards (the others after them), so that
groups have reward variance. Measured times on the 2-core box are in docs/benchmarks.md. Every size is a flag, and a rerun skips the (arm, seed) runs already in results.json.
Writes results.json, learning_curve.png and table.md (the curves, pass@1 differences against GRPO paired by seed
and task, seconds and tokens per step, failures per rollout by kind and step) under --out. Resumable: a cell (an
arm and a seed) checkpoints after every step and keeps its evaluations in results.json, so a rerun with the same
arguments continues each cell from its last step; it prints the cells still to run, and runs them in that order
(arm by arm in --arms order, each arm's seeds in turn: list the arms that answer most first). An evaluation episode the service did
not grade (a sandbox fault) or a training loss that is not finite fails the run.

Across machines (decision 130): `--results FILE` keeps results.json in a file that outlives the machine (a tracked
one); a later session rebuilds the warm start with the same seeded commands and continues the cells not finished.
results.json records the setup its cells share (the warm start's and demos' sha256, sizes, tasks, settings, library
versions), and a rerun of another setup stops before it starts a cell. `--within SECONDS` starts no baseline or cell
expected (from those measured) to end later, so a session stops with its cells whole; `--report-only` reports the
cells finished so far.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from samples import checked_loss  # noqa: E402

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"sdpo_weight": 0.0, "dpo_weight": 0.0},
    "grpo+sdpo(sibling+reference)": {
        "sdpo_weight": 0.5, "dpo_weight": 0.0, "hint_sources": ["sibling", "reference"], "hint_placement": "after_prompt",
        "sdpo_tokens": "all",
    },
    "grpo+sdpo": {"sdpo_weight": 0.5, "dpo_weight": 0.0, "sdpo_tokens": "all"},
    "grpo+sdpo+dpo": {"sdpo_weight": 0.5, "dpo_weight": 0.1, "sdpo_tokens": "all"},
    "grpo+sdpo(sibling+reference,content)": {
        "sdpo_weight": 0.5, "dpo_weight": 0.0, "hint_sources": ["sibling", "reference"], "hint_placement": "after_prompt",
        "sdpo_tokens": "content",
    },
}
"""In the order their cells are filled (issue 32): GRPO and the privileged teacher first. `grpo+sdpo` reads
the template hints (the default source) before the turn; the privileged arm reads the sibling and reference after
the prompt, the placement where the reference lowered failing turns and left passing ones alone (docs/benchmarks.md,
"What a hint tells the teacher"), and needs `--privileged-token` (decision 129). The last arm is the privileged
one distilled at its sites' content tokens only (decisions 132, 133): whether the teacher helps once it cannot move
which call a turn makes. `grpo+sdpo+dpo` adds DPO on the demos' mistake pairs, scored where a pair's two actions
differ (the trainer's default, decision 134). The first four arms distil whole turns (`sdpo_tokens: all`), the
trainer's default when their cells ran; it is `content` since decision 135."""
MODES = {
    # Issue 32's ablation: 3 seeds x 20 steps of 4 rollouts, held-out evaluation of 32 tasks x 2 samples (64
    # episodes) at the start, the middle and the end. Hours on a GPU; on 2 CPU cores a step alone takes minutes.
    "powered": dict(seeds=[0, 1, 2], steps=20, eval_every=10, eval_tasks=32, eval_n=2, train_tasks=80, generations=4,
                    tasks_per_step=1, frontier_samples=0),
    "full": dict(seeds=[0, 1, 2], steps=4, eval_every=4, eval_tasks=8, eval_n=1, train_tasks=64, generations=4, tasks_per_step=1,
                 frontier_samples=0),
    "quick": dict(seeds=[0], steps=2, eval_every=2, eval_tasks=4, eval_n=1, train_tasks=16, generations=2, tasks_per_step=1,
                  frontier_samples=0),
    "tiny": dict(seeds=[0], steps=1, eval_every=1, eval_tasks=2, eval_n=1, train_tasks=2, generations=2, tasks_per_step=1,
                 frontier_samples=0),
}
TINY_EPISODES = dict(max_completion_length=96, max_new_tokens=24, max_turns=2, backward_batch=2, eval_concurrency=2, checkpoint_every=0)
"""`--tiny`'s episode sizes (two short turns), and no checkpoint."""
FRONTIER_CHANCE = 0.75
"""A frontier task's least estimated chance that a group has reward variance: with 8 tries and groups of 4,
at least 2 tries earn a reward the others do not (1 of 8 estimates 0.5; with 4 tries, any difference is 1.0)."""
# Two-sided 95% Student t quantiles by degrees of freedom (seeds - 1).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
TRAIN_KEYS = (
    "reward",
    "reward/group_std",
    "reward/groups_with_variance",
    "sdpo/hint_sites",
    "sdpo/loss",
    "dpo/loss",
    "policy/tool_calls",
    "policy/valid_call_rate",
    "loss",
    "grad_norm",
    "entropy",
    "sdpo/jsd",
    "step_time",
    "num_tokens",
)
FAILURE_PREFIX = "policy/failures/"
"""Per-kind failure counts of a batch (every kind, every step): which errors each arm removes, and how fast."""


def mean_interval(values: list[float]) -> dict[str, Any]:
    """Mean over seeds with a 95% t-interval (none for a single seed)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return {"mean": math.nan, "ci95": None, "seeds": 0}
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": None, "seeds": 1}
    half = _T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "ci95": [mean - half, mean + half], "seeds": len(values)}


def warm_start(args: argparse.Namespace) -> tuple[Any, Any]:
    """The warm start's model and tokenizer, the model on the GPU when there is one (evaluations generate there)."""
    import torch

    from trainer_client.policy import PolicySpec, load_policy

    model, tokenizer = load_policy(PolicySpec(name=str(args.warm_start)))
    return model.to("cuda" if torch.cuda.is_available() else "cpu"), tokenizer


def _episodes(model: Any, tokenizer: Any, factory: Any, task_ids: list[str], n: int, seed: int, args: argparse.Namespace) -> list[Any]:
    from trainer_client.evaluation import EvalSettings, Evaluator

    training = model.training
    model.eval()
    settings = EvalSettings(
        n=n,
        temperature=args.eval_temperature,
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_completion_length=args.max_completion_length,
        concurrency=args.eval_concurrency,
        seed=seed,
    )
    episodes = Evaluator(model, tokenizer, factory, settings).run(task_ids)
    model.train(training)
    return episodes


def _evaluate(model: Any, tokenizer: Any, factory: Any, task_ids: list[str], n: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from trainer_client.evaluation import summarize

    started = time.perf_counter()
    report = summarize(_episodes(model, tokenizer, factory, task_ids, n, seed, args), k=n, seed=seed)
    report["seconds"] = time.perf_counter() - started
    if report["ungraded_episodes"]:
        raise RuntimeError(f"{report['ungraded_episodes']} evaluation episodes were not graded (a sandbox fault): the figures would leave them out")
    return report


def group_variance_chance(rewards: list[float], group: int) -> float:
    """The chance that `group` tries of a task, drawn like these `rewards`, do not all earn the same reward:
    1 - sum over reward values of C(tries with it, group) / C(tries, group), the unbiased estimate from
    the subsets of the tries (needs at least `group` tries)."""
    if len(rewards) < group:
        raise ValueError(f"{len(rewards)} tries cannot estimate a group of {group}: sample at least as many as the group")
    counts = Counter(round(reward, 6) for reward in rewards)
    return 1.0 - sum(math.comb(count, group) for count in counts.values()) / math.comb(len(rewards), group)


def frontier(candidates: list[str], samples: int, group: int, factory: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The candidates at the warm start's frontier: tasks on which a GRPO group of `group` rollouts has
    reward variance with a chance of at least FRONTIER_CHANCE, estimated from `samples` tries each at the
    evaluation temperature. A task the warm start always solves, or never, gives groups with none, and
    with few tries a task it solves once in a while looks like one at the frontier (decision 073)."""
    model, tokenizer = warm_start(args)
    started = time.perf_counter()
    rewards: dict[str, list[float]] = {task: [] for task in candidates}
    for episode in _episodes(model, tokenizer, factory, candidates, samples, 0, args):
        rewards[episode.task_id].append(episode.reward or 0.0)
    chances = {task: group_variance_chance(tries, group) for task, tries in rewards.items()}
    return {
        "tasks": [task for task in candidates if chances[task] >= FRONTIER_CHANCE],
        "rewards": rewards,
        "group_variance_chance": chances,
        "seconds": time.perf_counter() - started,
    }


def run_arm(
    arm: str, seed: int, args: argparse.Namespace, mode: dict[str, Any], tasks: dict[str, list[str]], pairs: Path,
    max_steps: int, seconds: float | None, partial: dict[str, Any], save: Callable[[], None],
) -> dict[str, Any]:
    """One arm of one seed: `max_steps` optimizer steps, or fewer when `seconds` (of training) run out first;
    evaluated every `eval_every` steps and after the last. Resumable: a checkpoint after every step (the
    latest kept), and `partial` (this cell's entry in results.json, saved by `save`) keeps the evaluations
    made, so a rerun continues from the last step instead of starting the cell again."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from trainer_client.environment import environment_factory
    from trainer_client.task_rows import task_row
    from trainer_client.trainer import ComposerConfig, ComposerTrainer

    # Only the training rollouts of an arm whose teacher reads references hold the privileged token.
    train_factory = environment_factory(_client_settings(args, privileged="reference" in ARMS[arm].get("hint_sources", ())))
    eval_factory = environment_factory(_client_settings(args))
    model, tokenizer = warm_start(args)
    output_dir = args.out / "runs" / f"{arm}-seed{seed}"
    checkpoint = latest_checkpoint(output_dir)
    if checkpoint is None:
        partial.clear()  # nothing to continue: what an earlier try measured is not this run's
        resumed_step = 0
    else:
        resumed_step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
        # an evaluation saved after the checkpoint was of a step that is trained again
        partial["evals"] = [point for point in partial.get("evals", []) if point["step"] <= resumed_step]
    evals: list[dict[str, Any]] = partial.setdefault("evals", [])
    seconds_by_step: dict[str, float] = partial.setdefault("train_seconds_by_step", {})
    trained = float(seconds_by_step.get(str(resumed_step), 0.0))  # seconds of training, evaluations excluded

    class EvaluateEvery(TrainerCallback):
        def on_step_begin(self, _args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            nonlocal trained
            trained += time.perf_counter() - self.began
            out_of_time = seconds is not None and trained >= seconds
            due = state.global_step % mode["eval_every"] == 0 or state.global_step == max_steps or out_of_time
            if due and all(point["step"] != state.global_step for point in evals):
                report = _evaluate(kwargs["model"], tokenizer, eval_factory, tasks["eval"], mode["eval_n"], seed, args)
                evals.append({"step": state.global_step, **_eval_point(report)})
                print(f"  {arm} seed {seed} step {state.global_step}: {_brief(evals[-1])}", flush=True)
            seconds_by_step[str(state.global_step)] = trained
            save()  # before the step's checkpoint: a run stopped between the two trains and evaluates the step again
            if out_of_time:
                control.should_training_stop = True

    # Frontier tasks first (when selected), each part in the seed's order.
    at_frontier = [task for task in tasks["train"] if task in tasks.get("frontier", [])]
    rest = [task for task in tasks["train"] if task not in at_frontier]
    shuffle = random.Random(seed)
    order = shuffle.sample(at_frontier, len(at_frontier)) + shuffle.sample(rest, len(rest))
    on_gpu = torch.cuda.is_available()
    bf16 = on_gpu if args.bf16 is None else args.bf16
    rollouts = mode["tasks_per_step"] * mode["generations"]
    config = ComposerConfig(
        output_dir=str(output_dir),
        use_cpu=not on_gpu,
        bf16=bf16,
        fp16=False,
        activation_checkpointing=False,
        max_steps=max_steps,
        # `tasks_per_step` tasks x `generations` rollouts per optimizer step, all generated together (a group
        # of 4 has reward variance more often than two groups of 2), in backward passes of `backward_batch`
        # rollouts (on CPU 2, to bound the activations held).
        per_device_train_batch_size=min(args.backward_batch, rollouts),
        gradient_accumulation_steps=max(1, rollouts // args.backward_batch),
        num_generations=mode["generations"],
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns - 1,
        learning_rate=args.learning_rate,
        logging_steps=1,
        # every `checkpoint_every` steps, the latest kept: a stopped cell resumes from it
        save_strategy="steps" if args.checkpoint_every else "no",
        save_steps=max(1, args.checkpoint_every),
        save_total_limit=1,
        report_to=[],
        seed=seed,
        shuffle_dataset=False,  # the tasks come in `order`: the seed's, frontier first
        dpo_pairs_path=str(pairs) if ARMS[arm]["dpo_weight"] > 0 else None,
        **ARMS[arm],
    )
    trainer = ComposerTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list([task_row(task_id) for task_id in order]),
        processing_class=tokenizer,
        environment_factory=train_factory,
        callbacks=[EvaluateEvery()],
    )
    started = time.perf_counter()
    if checkpoint is not None:
        print(f"  {arm} seed {seed}: resuming from {checkpoint.name}", flush=True)
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    finally:
        trainer.close_environments()
    train_log = [
        {key: value for key, value in row.items() if key == "step" or key in TRAIN_KEYS or key.startswith(FAILURE_PREFIX)}
        for row in trainer.state.log_history
        if "loss" in row
    ]
    for row in train_log:
        checked_loss(row["loss"], f"{arm} seed {seed} step {row['step']}")
    for checkpoint in output_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)  # the cell is done: its result is in results.json (a checkpoint is 1.6 GB for SmolLM2)
    return {"evals": evals, "train": train_log, "steps": trainer.state.global_step, "rollouts_per_step": rollouts,
            "train_seconds": trained, "seconds": time.perf_counter() - started}


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The cell's checkpoint of the highest step (`checkpoint-N`), if any."""
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.rsplit("-", 1)[1]))
    return checkpoints[-1] if checkpoints else None


def files_sha256(paths: list[Path]) -> str:
    """One digest of the files' bytes, in the order given."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


EPISODE_SETTINGS = (
    "id_prefix", "tools", "learning_rate", "eval_temperature", "max_completion_length", "max_new_tokens", "max_turns",
    "backward_batch", "eval_concurrency",
)
"""The arguments a cell's figures depend on (besides its arm and seed)."""


def run_setup(args: argparse.Namespace, mode: dict[str, Any], tasks: dict[str, list[str]]) -> dict[str, Any]:
    """Everything the cells of one ablation share: the warm start's and the demos' bytes, the sizes, the tasks,
    the episode settings and the learning libraries. Cells are compared (paired by seed and task) only within
    one setup, so a run that continues results.json on another machine or in another session must rebuild
    the same warm start (`demos` and `sft` are seeded) with the same libraries."""
    weights = sorted(args.warm_start.glob("*.safetensors"))
    if not weights:
        raise SystemExit(f"{args.warm_start} holds no *.safetensors weights (make it with `coding-train sft`)")
    return {
        "warm_start_sha256": files_sha256(weights),
        "demos_sha256": files_sha256([args.demos]),
        "mode": mode,
        "tasks": tasks,
        "episode": {name: getattr(args, name) for name in EPISODE_SETTINGS},
        "versions": {package: version(package) for package in ("torch", "transformers", "trl")},
    }


def setup_differences(stored: dict[str, Any] | None, setup: dict[str, Any]) -> list[str]:
    """The keys of `setup` (one level into dicts) whose values differ from the stored setup's (["setup"] when
    none was stored: cells of an unknown setup)."""
    if stored is None:
        return ["setup"]
    differ = []
    for key in sorted(set(stored) | set(setup)):
        old, new = stored.get(key), setup.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differ += [f"{key}.{name}" for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
        elif old != new:
            differ.append(key)
    return differ


def measured(results: dict[str, Any]) -> bool:
    """Whether results.json holds any figure: a baseline, a finished cell or a partial one."""
    return any(results.get(key) for key in ("baseline", "arms", "partial"))


def expected_seconds(results: dict[str, Any], arm: str | None) -> float | None:
    """What the next baseline (`arm` None) or cell of `arm` is expected to take: the mean of those already
    measured (a cell's training and evaluations, resumed parts included; another arm's when `arm` has none)."""
    if arm is None:
        values = [point["seconds"] for point in results["baseline"].values()]
    else:
        def cost(run: dict[str, Any]) -> float:
            return run["train_seconds"] + sum(point["seconds"] for point in run["evals"])

        values = [cost(run) for run in results["arms"].get(arm, {}).values()]
        values = values or [cost(run) for runs in results["arms"].values() for run in runs.values()]
    return statistics.fmean(values) if values else None


def write_results(path: Path, results: dict[str, Any]) -> None:
    """results.json, replaced whole: a run killed while writing keeps the previous one."""
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(results, indent=2, default=str))
    os.replace(partial, path)


def _brief(point: dict[str, Any]) -> dict[str, Any]:
    """An evaluation point as printed: without its per-task passes."""
    return {key: value for key, value in point.items() if key != "per_task"}


def _client_settings(args: argparse.Namespace, *, privileged: bool = False) -> Any:
    """The sessions' settings; with `privileged`, holding the service's privileged token (the reference source)."""
    from trainer_client.client import ClientSettings

    token = args.privileged_token or None if privileged else None
    return ClientSettings(base_url=args.env_url, api_token=args.api_token, tools=args.tools, privileged_token=token)


def _eval_point(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "pass@1": report["pass@1"]["value"],
        "pass@1_ci95": report["pass@1"]["ci95"],
        "valid_call_rate": report["valid_tool_call_rate"]["value"],
        "mean_reward": report["mean_reward"]["value"],
        "episodes": report["episodes"],
        "per_task": {task["task_id"]: task["pass@1"] for task in report["per_task"]},
        "ungraded": report["ungraded_episodes"],
        "seconds": report["seconds"],
    }


def aggregate(results: dict[str, Any], seeds: list[int], steps: list[int]) -> dict[str, Any]:
    """Per arm and evaluated step, each metric's mean and interval over seeds; train metrics per step."""
    curves: dict[str, Any] = {}
    for arm in (arm for arm in ARMS if results["arms"].get(arm)):
        runs = [results["arms"][arm][str(seed)] for seed in seeds if str(seed) in results["arms"][arm]]
        evals = {}
        for step in steps:
            # step 0: the baselines of the seeds this arm has cells of, so that every point averages the same seeds
            points = [results["baseline"][str(s)] for s in seeds if str(s) in results["arms"][arm]] if step == 0 else [
                point for run in runs for point in run["evals"] if point["step"] == step
            ]
            if not points:
                continue  # this arm stopped before `step` (a time budget) or was not evaluated there
            evals[step] = {key: mean_interval([p[key] for p in points]) for key in ("pass@1", "valid_call_rate", "mean_reward")}
        train: dict[str, Any] = {}
        for key in TRAIN_KEYS:
            by_step: dict[int, list[float]] = {}
            for run in runs:
                for row in run["train"]:
                    if key in row:
                        by_step.setdefault(row["step"], []).append(float(row[key]))
            train[key] = {step: mean_interval(values) for step, values in sorted(by_step.items())}
        curves[arm] = {"evals": evals, "train": train}
    return curves


def paired_differences(results: dict[str, Any], seeds: list[int], steps: list[int], against: str = "grpo") -> dict[str, Any]:
    """Per arm and evaluated step after 0, its held-out pass@1 minus `against`'s, paired by seed and task (both
    arms evaluated the same tasks with the same sampling seed), with a 95% bootstrap interval over the pairs."""
    from trainer_client.evaluation import bootstrap_interval

    def points(arm: str, seed: int, step: int) -> dict[str, float] | None:
        run = results["arms"].get(arm, {}).get(str(seed))
        return next((point.get("per_task") for point in run["evals"] if point["step"] == step), None) if run else None

    differences: dict[str, Any] = {}
    for arm in (arm for arm in ARMS if arm != against and results["arms"].get(arm)):
        for step in (step for step in steps if step > 0):
            pairs = []
            for seed in seeds:
                mine, theirs = points(arm, seed, step), points(against, seed, step)
                if mine and theirs:
                    pairs += [mine[task] - theirs[task] for task in mine if task in theirs]
            if pairs:
                differences.setdefault(arm, {})[step] = {
                    "mean": statistics.fmean(pairs), "ci95": list(bootstrap_interval(pairs)), "pairs": len(pairs)
                }
    return differences


REACH_WINDOW = 5
"""Steps in the trailing mean of the training reward that `steps_to_reach` compares (one step's batch is 4 rollouts)."""


def steps_to_reach(curves: dict[str, Any], against: str = "grpo") -> dict[str, Any]:
    """Per arm, the first step at which its training reward (mean over seeds, trailing mean of `REACH_WINDOW`
    steps, from the first full window on: one noisy step is not a level reached) reaches `against`'s final one
    (its last `REACH_WINDOW` steps), and that step as a share of `against`'s steps (issue 32's goal for SDPO:
    half); None where it never does. Undefined (step None, with the reason) when `against`'s final reward is
    not above its first `REACH_WINDOW` steps': reaching a level GRPO started at says nothing about learning
    faster. `curves` must average the same seeds for every arm (`steps_to_reach_by_seeds`)."""
    def rewards(arm: str) -> list[tuple[int, float]]:
        return sorted((int(step), point["mean"]) for step, point in curves[arm]["train"]["reward"].items())

    def trailing(arm: str) -> list[tuple[int, float]]:
        series = rewards(arm)
        return [
            (step, statistics.fmean(mean for _, mean in series[i + 1 - REACH_WINDOW : i + 1]))
            for i, (step, _) in enumerate(series)
            if i + 1 >= REACH_WINDOW
        ]

    if against not in curves or not curves[against]["train"]["reward"]:
        return {}
    baseline = trailing(against)
    if not baseline:
        why = f"{against} has fewer than {REACH_WINDOW} steps"
        return {arm: {"target": None, "step": None, "share": None, "undefined": why} for arm in curves}
    last_step, target = baseline[-1]
    start = statistics.fmean(mean for _, mean in rewards(against)[:REACH_WINDOW])
    if target <= start:
        why = f"{against}'s training reward did not rise (first {REACH_WINDOW} steps {start:.3f}, last {REACH_WINDOW} {target:.3f})"
        return {arm: {"target": target, "step": None, "share": None, "undefined": why} for arm in curves}
    reached = {}
    for arm in curves:
        step = next((step for step, mean in trailing(arm) if mean >= target), None)
        reached[arm] = {"target": target, "step": step, "share": step / last_step if step is not None else None}
    return reached


def steps_to_reach_by_seeds(results: dict[str, Any], seeds: list[int], against: str = "grpo") -> dict[str, Any]:
    """`steps_to_reach` for each arm over the seeds it shares with `against`: while cells are missing, arms have
    different seeds, and one seed's lucky first steps would pass for learning faster."""
    reached = {}
    for arm in (arm for arm in ARMS if results["arms"].get(arm)):
        common = [seed for seed in seeds if str(seed) in results["arms"][arm] and str(seed) in results["arms"].get(against, {})]
        curves = aggregate(results, common, [])  # training rewards only
        reached[arm] = steps_to_reach(curves, against).get(arm) or {
            "target": None, "step": None, "share": None, "undefined": f"no seed in common with {against}"
        }
    return reached


def failure_rates(results: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    """Per arm and training step, the policy's failures per rollout of each kind (mean over seeds): does an
    arm remove the errors SDPO targets faster?"""
    rates: dict[str, Any] = {}
    for arm, runs in results["arms"].items():
        by_step: dict[int, Counter[str]] = {}
        counted: Counter[int] = Counter()
        for seed in seeds:
            run = runs.get(str(seed))
            for row in run["train"] if run else ():
                counted[row["step"]] += 1
                for key, value in row.items():
                    if key.startswith(FAILURE_PREFIX):
                        by_step.setdefault(row["step"], Counter())[key[len(FAILURE_PREFIX) :]] += value / run["rollouts_per_step"]
        rates[arm] = {step: {kind: total / counted[step] for kind, total in kinds.items()} for step, kinds in sorted(by_step.items())}
    return rates


def step_costs(results: dict[str, Any]) -> dict[str, Any]:
    """Per arm, the mean over its runs of training seconds and tokens per optimizer step (evaluations excluded)."""
    costs = {}
    for arm, runs in results["arms"].items():
        finished = [run for run in runs.values() if run["steps"]]
        if finished:
            tokens = [run["train"][-1].get("num_tokens", math.nan) / run["steps"] for run in finished if run["train"]]
            costs[arm] = {
                "seconds_per_step": statistics.fmean(run["train_seconds"] / run["steps"] for run in finished),
                "tokens_per_step": statistics.fmean(tokens) if tokens else math.nan,
                "runs": len(finished),
            }
    return costs


def plot(curves: dict[str, Any], path: Path, title: str) -> None:
    from trainer_client.plotting import count_axis, label_points, pyplot, step_axis

    plt = pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = [  # (axis, part, key, title, whether it is a share in [0, 1])
        (axes[0][0], "evals", "pass@1", "held-out pass@1", True),
        (axes[0][1], "evals", "valid_call_rate", "held-out valid tool-call rate", True),
        (axes[1][0], "train", "reward", "training reward (batch mean)", True),
        (axes[1][1], "train", "sdpo/hint_sites", "hint sites per batch", False),
    ]
    for axis, part, key, name, share in panels:
        plotted: list[tuple[int, float]] = []
        for arm, curve in curves.items():
            series = curve[part][key] if part == "train" else {step: point[key] for step, point in curve[part].items()}
            steps = sorted(int(s) for s in series)
            means = [series[s]["mean"] for s in steps]
            line, = axis.plot(steps, means, marker="o", label=arm)
            plotted += zip(steps, means)
            bands = [series[s]["ci95"] for s in steps]
            if all(band is not None for band in bands) and bands:
                axis.fill_between(steps, [b[0] for b in bands], [b[1] for b in bands], alpha=0.15)
            label_points(axis, steps, means, fmt="{:.2f}" if share else "{:.1f}", color=line.get_color())
        axis.set_title(name)
        step_axis(axis, [step for step, _ in plotted])
        if share:
            axis.set_ylim(-0.05, 1.1)
        else:
            axis.set_ylim(0, 1.2 * max((mean for _, mean in plotted), default=1.0) + 0.5)
            count_axis(axis, "count")
        axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def analysis_tables(differences: dict[str, Any], reached: dict[str, Any], rates: dict[str, Any], costs: dict[str, Any]) -> str:
    """The paired differences against GRPO, the steps to reach GRPO's final training reward, each arm's cost per
    step, and its failures per rollout by kind."""
    lines = ["| arm | step | pass@1 minus GRPO's (paired by seed and task) | pairs |", "|---|---|---|---|"]
    for arm, by_step in differences.items():
        for step, point in by_step.items():
            low, high = point["ci95"]
            lines.append(f"| {arm} | {step} | {point['mean']:+.3f} [{low:+.3f}, {high:+.3f}] | {point['pairs']} |")
    lines += ["", f"| arm | first step its training reward (trailing {REACH_WINDOW}) reaches GRPO's final | share of GRPO's steps |",
              "|---|---|---|"]
    lines += [
        f"| {arm} | {r.get('undefined') or ('never' if r['step'] is None else r['step'])} " + ("" if r["target"] is None else f"(target {r['target']:.3f})") + " | "
        + ("-" if r["share"] is None else f"{r['share']:.2f}") + " |"
        for arm, r in reached.items()
    ]
    lines += ["", "| arm | runs | seconds per step | tokens per step |", "|---|---|---|---|"]
    lines += [f"| {arm} | {c['runs']} | {c['seconds_per_step']:.0f} | {c['tokens_per_step']:.0f} |" for arm, c in costs.items()]
    kinds = sorted({kind for by_step in rates.values() for step in by_step.values() for kind, rate in step.items() if rate > 0})
    if kinds:
        lines += ["", "| arm | step | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
        for arm, by_step in rates.items():
            for step, row in by_step.items():
                lines.append(f"| {arm} | {step} | " + " | ".join(f"{row.get(kind, 0.0):.2f}" for kind in kinds) + " |")
    return "\n".join(lines)


def table(curves: dict[str, Any], steps: list[int]) -> str:
    def cell(point: dict[str, Any]) -> str:
        if point["ci95"] is None:
            return f"{point['mean']:.3f}"
        return f"{point['mean']:.3f} [{point['ci95'][0]:.3f}, {point['ci95'][1]:.3f}]"

    train_keys = ("reward", "reward/groups_with_variance", "sdpo/hint_sites", "entropy")
    lines = [
        "| arm | step | pass@1 | valid-call rate | eval reward | train reward | groups with reward variance | hint sites / batch "
        "| policy entropy (nats/token) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, curve in curves.items():
        for step in (step for step in steps if step in curve["evals"]):
            point = curve["evals"][step]
            train = {key: curve["train"][key].get(step) for key in train_keys}
            lines.append(
                f"| {arm} | {step} | {cell(point['pass@1'])} | {cell(point['valid_call_rate'])} | {cell(point['mean_reward'])} | "
                + " | ".join(cell(train[key]) if train[key] else "-" for key in train_keys)
                + " |"
            )
    return "\n".join(lines)


def run_cells(
    results: dict[str, Any], results_path: Path, args: argparse.Namespace, mode: dict[str, Any], tasks: dict[str, list[str]],
    pairs: Path, factory: Any, commit: str | None,
) -> None:
    """The cells results.json lacks, arm by arm in --arms order (the arms that answer most first), each arm's seeds
    in order, each saved as it ends; a seed's baseline is evaluated before its first cell. Nothing is started that
    is not expected to end within --within: the first baseline or cell that does not fit ends the run, so cells fill
    in order and a rerun continues with the cell it stopped in."""
    started = time.perf_counter()

    def fits(what: str, arm: str | None) -> bool:
        """Whether `what` is expected to end within --within (an unknown cost is taken to fit)."""
        expected = expected_seconds(results, arm)
        left = None if args.within is None else args.within - (time.perf_counter() - started)
        if left is None or expected is None or expected <= left:
            return True
        print(f"stopping before {what}: it takes about {expected:.0f} s, {max(left, 0):.0f} s are left (--within)", flush=True)
        return False

    def save() -> None:
        write_results(results_path, results)

    for arm in args.arms:
        for seed in mode["seeds"]:
            if str(seed) in results["arms"].get(arm, {}):
                continue  # resumable: a finished run is kept
            if str(seed) not in results["baseline"]:  # every arm starts from the same checkpoint: evaluate it once per seed
                if not fits(f"seed {seed}'s baseline", None):
                    return
                model, tokenizer = warm_start(args)
                point = _eval_point(_evaluate(model, tokenizer, factory, tasks["eval"], mode["eval_n"], seed, args))
                results["baseline"][str(seed)] = {"step": 0, **point, "commit": commit}
                print(f"baseline seed {seed}: {results['baseline'][str(seed)]}", flush=True)
                save()
            if not fits(f"{arm} seed {seed}", arm):
                return
            done = [run.get("steps", mode["steps"]) for run in (results["arms"].get(a, {}).get(str(seed)) for a in args.arms) if run]
            seconds = None
            if args.time_budget is not None and not done:
                # This cell's share of what is left, less its evaluation (timed by the baseline's).
                cells_left = sum(str(s) not in results["arms"].get(a, {}) for a in args.arms for s in mode["seeds"])
                evaluation = results["baseline"][str(seed)]["seconds"]
                share = (args.time_budget - (time.perf_counter() - started)) / cells_left
                seconds = max(0.0, share - 1.25 * evaluation)
            print(f"{arm} seed {seed}" + (f": {seconds:.0f} s of training" if seconds is not None else ""), flush=True)
            max_steps = done[0] if done else mode["steps"]
            partial = results.setdefault("partial", {}).setdefault(arm, {}).setdefault(str(seed), {})
            cell = run_arm(arm, seed, args, mode, tasks, pairs, max_steps, seconds, partial, save)
            results["arms"].setdefault(arm, {})[str(seed)] = {**cell, "commit": commit}
            del results["partial"][arm][str(seed)]
            if not results["partial"][arm]:
                del results["partial"][arm]
            save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-start", required=True, type=Path, help="SFT checkpoint directory (coding-train sft)")
    parser.add_argument("--demos", required=True, type=Path, help="the demos the warm start was trained on (DPO pairs)")
    parser.add_argument("--env-url", required=True)
    parser.add_argument("--api-token")
    parser.add_argument(
        "--privileged-token", default=os.environ.get("CODING_ENV_PRIVILEGED_TOKEN"),
        help="the service's privileged_token: the reference source of the privileged arm (default: $CODING_ENV_PRIVILEGED_TOKEN)",
    )
    parser.add_argument("--out", required=True, type=Path, help="the cells' checkpoints, pairs.jsonl, the plot and table.md")
    parser.add_argument(
        "--results", type=Path,
        help="results.json (default: under --out): keep it where it outlives the machine (a tracked file) to continue"
        " an ablation in a later session; it refuses to mix cells of another setup (warm start, sizes, settings)",
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps, 4 eval tasks")
    parser.add_argument(
        "--powered", action="store_true",
        help="issue 32's ablation: 3 seeds x 20 steps of 4 rollouts, 64 held-out episodes at steps 0, 10 and 20",
    )
    parser.add_argument("--tiny", action="store_true", help="1 seed, 1 step of 2 rollouts, 2 short turns, 2 eval tasks: every path and check")
    parser.add_argument(
        "--within", type=float, metavar="SECONDS",
        help="start no baseline or cell expected (from those measured) to end later than this many seconds from now;"
        " then report the finished ones: a session's share of a long ablation, leaving the machine free after it",
    )
    parser.add_argument(
        "--report-only", action="store_true",
        help="run no cell: the curves, tables and plot of the cells results.json holds so far (a stopped ablation)",
    )
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--id-prefix", default="warmup/l1/", help="train and evaluate on warmup tasks whose id starts with this")
    parser.add_argument("--tools", nargs="+", default=["write_file", "bash"], help="the episodes' tools (submit is added); the demos' set")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument(
        "--eval-temperature", type=float, default=1.0,
        help="sampling temperature of the evaluation: TRL's training temperature (1.0) by default, so that the"
        " evaluation measures the policy GRPO optimises (at 0.7 the level-1 warm start already passes 4 of 4)",
    )
    parser.add_argument("--max-completion-length", type=int, default=512, help="tokens of a rollout / eval episode")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens of one assistant turn in evaluation")
    parser.add_argument("--max-turns", type=int, default=7, help="assistant turns per rollout / eval episode")
    parser.add_argument("--backward-batch", type=int, default=2, help="rollouts per backward pass (the step's rollouts are accumulated)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction,
                        help="train with bf16 autocast (default: on a GPU, not on CPU)")
    parser.add_argument("--eval-concurrency", type=int, default=8, help="evaluation episodes (service sessions) at once")
    parser.add_argument(
        "--checkpoint-every", type=int, default=1,
        help="optimizer steps between a cell's checkpoints (the latest kept, deleted when the cell ends; 0: none, a stopped cell starts again)",
    )
    parser.add_argument(
        "--time-budget", type=float,
        help="seconds for the whole run: each seed's first arm trains until its share is spent (its steps, at most --steps,"
        " become the seed's step count; the other arms train as many), the rest is kept for the evaluations",
    )
    for name, value in MODES["full"].items():
        kind = int if not isinstance(value, list) else None
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, nargs="+" if kind is None else None, help=f"overrides the mode's {name}")
    args = parser.parse_args()
    privileged = any("reference" in ARMS[arm].get("hint_sources", ()) for arm in args.arms)
    if privileged and not args.privileged_token and not args.report_only:
        parser.error("the grpo+sdpo(sibling+reference) arm needs --privileged-token (or leave it out with --arms)")

    from env_server.tasks import default_registry
    from trainer_client.demos import mistake_pair, read_demos

    mode_name = "tiny" if args.tiny else "quick" if args.quick else "powered" if args.powered else "full"
    mode = {key: getattr(args, key) or value for key, value in MODES[mode_name].items()}
    if args.tiny:
        vars(args).update(TINY_EPISODES)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.results or args.out / "results.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    if args.report_only:  # reads nothing but results.json: no tasks, demos or service
        report_cells(results, results_path, args.out, mode["seeds"], args.warm_start.name)
        return 0
    registry = default_registry()
    demos = read_demos(args.demos)
    demo_ids = {demo.task_id for demo in demos}
    pairs = args.out / "pairs.jsonl"
    with open(pairs, "w", encoding="utf-8") as handle:
        for demo in demos:
            pair = mistake_pair(registry.get(demo.task_id), demo)
            if pair is not None:
                handle.write(pair.model_dump_json() + "\n")
    train_pool = [t for t in registry.ids("warmup", split="train") if t.startswith(args.id_prefix) and t not in demo_ids]
    held_out = [t for t in registry.ids("warmup", split="held_out") if t.startswith(args.id_prefix)]
    tasks = {
        "train": random.Random(0).sample(train_pool, mode["train_tasks"]),
        "eval": random.Random(1).sample(held_out, mode["eval_tasks"]),
    }
    setup = run_setup(args, mode, tasks)
    if measured(results) and (differ := setup_differences(results.get("setup"), setup)):
        parser.error(
            f"{results_path} holds cells of another setup (differs in {', '.join(differ)}): rebuild the same warm start"
            " and settings to continue it, or give another --results"
        )
    results["setup"] = setup

    from trainer_client.environment import environment_factory

    factory = environment_factory(_client_settings(args))
    if mode["frontier_samples"]:
        if mode["frontier_samples"] < mode["generations"]:
            parser.error(f"--frontier-samples must be at least the group size ({mode['generations']}) to estimate its variance")
        if "frontier" not in results:
            results["frontier"] = frontier(tasks["train"], mode["frontier_samples"], mode["generations"], factory, args)
            print(f"frontier: {len(results['frontier']['tasks'])} of {len(tasks['train'])} tasks in {results['frontier']['seconds']:.0f} s", flush=True)
        tasks["frontier"] = results["frontier"]["tasks"]
    results.update({"mode": mode_name, "tasks": tasks})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    results.setdefault("baseline", {})
    results.setdefault("arms", {})
    missing = [
        f"{arm} seed {seed}" + (f" (resumes from {c.name})" if (c := latest_checkpoint(args.out / "runs" / f"{arm}-seed{seed}")) else "")
        for arm in args.arms
        for seed in mode["seeds"]
        if str(seed) not in results["arms"].get(arm, {})
    ]
    print(f"cells to run ({len(missing)}): {', '.join(missing) or 'none'}", flush=True)
    run_cells(results, results_path, args, mode, tasks, pairs, factory, commit or None)

    report_cells(results, results_path, args.out, mode["seeds"], args.warm_start.name)
    return 0


def report_cells(results: dict[str, Any], results_path: Path, out: Path, seeds: list[int], warm_start: str) -> None:
    """The curves and analyses of the cells results.json holds (all of them, or those finished so far) into
    results.json, learning_curve.png and table.md."""
    steps = sorted({0, *(point["step"] for arm in results["arms"].values() for run in arm.values() for point in run["evals"])})
    results["steps"] = steps
    curves = aggregate(results, seeds, steps)
    results["curves"] = curves
    differences, rates, costs = paired_differences(results, seeds, steps), failure_rates(results, seeds), step_costs(results)
    reached = steps_to_reach_by_seeds(results, seeds)
    results.update({"paired_differences": differences, "steps_to_reach": reached, "failure_rates": rates, "step_costs": costs})
    write_results(results_path, results)
    cells = sum(len(runs) for runs in results["arms"].values())
    plot(curves, out / "learning_curve.png", f"warm-started {warm_start}: {cells} cell(s) of {len(seeds)} seed(s), {steps[-1]} steps")
    text = table(curves, steps) + "\n\n" + analysis_tables(differences, reached, rates, costs)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
