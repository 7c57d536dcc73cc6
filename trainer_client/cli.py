"""`coding-train`: train a policy against the service (`train`), the warm start (`demos`, `sft`),
`eval`, `hint-uptake` (what each SDPO hint source tells the teacher), `plot` (a run's per-step logs),
plus the trace tools (`ingest`, `replay`)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainer_client.client import ClientSettings, CodingEnvClient
from trainer_client.lora import LoraSettings
from trainer_client.policy import PolicySpec
from trainer_client.shipped_configs import find_config, input_path
from trainer_client.teacher_contexts import HINT_PLACEMENTS, HINT_SOURCES
from trainer_client.task_rows import task_row

if TYPE_CHECKING:
    from trainer_client.demos import Demo


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

    peft: LoraSettings | None = None
    """Train a LoRA adapter instead of every weight (`peft: {}` takes the defaults); the saved model is
    then the adapter, and `trainer.sdpo_teacher: base` (the policy with its adapter off) needs it."""

    save_final_model: bool = True
    """Save the trained model (or adapter) to `output_dir` at the end. TRL's `save_strategy` only governs
    intermediate checkpoints; set this false for smoke and benchmark runs (SmolLM2 is 517 MB)."""

    @model_validator(mode="after")
    def _base_teacher_needs_an_adapter(self) -> TrainRunConfig:
        if self.trainer.get("sdpo_teacher") == "base" and self.trainer.get("sdpo_weight", 0) > 0 and self.peft is None:
            raise ValueError(
                "trainer.sdpo_teacher 'base' is the policy with its LoRA adapter off: add a `peft:` section "
                "(`peft: {}` for the defaults) or pass --lora-r, or choose sdpo_teacher 'live' or 'ema'"
            )
        return self


def load_run_config(path: Path, peft_overrides: dict[str, Any] | None = None) -> TrainRunConfig:
    """The run config of a YAML file; `peft_overrides` (from the --lora-* flags) add or amend its `peft:` section.
    Its DPO pairs path is looked up beside the file first (`input_path`)."""
    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle) or {}
    trainer = raw.get("trainer") or {}
    if isinstance(trainer.get("dpo_pairs_path"), str):
        trainer["dpo_pairs_path"] = input_path(trainer["dpo_pairs_path"], path)
    if peft_overrides:
        raw["peft"] = {**(raw.get("peft") or {}), **peft_overrides}
    return TrainRunConfig.model_validate(raw)


def lora_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `peft:` fields given as --lora-* flags."""
    flags = {"r": args.lora_r, "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout,
             "target_modules": args.lora_target_modules}
    return {name: value for name, value in flags.items() if value is not None}


def gpu_requirement(trainer: dict[str, Any], *, generation: str = "transformers", bf16_default: bool = False) -> str | None:
    """What in a run's `trainer:` options (or its generation) needs a CUDA GPU when torch sees none; None
    when it runs here. `bf16_default`: the trainer's own default (TRL's GRPOConfig trains in bf16)."""
    import torch

    if torch.cuda.is_available():
        return None
    if generation == "vllm":
        return "generation: vllm, which generates on a GPU"
    if trainer.get("use_cpu"):
        return None
    if trainer.get("fp16"):
        return "trainer.fp16: true"
    if trainer.get("bf16", bf16_default):
        return "trainer.bf16: " + ("true" if "bf16" in trainer else "unset, and TRL's default is true")
    return None


def stop_without_gpu(command: str, config: Path, needs: str | None) -> None:
    """Stops the command with what needs a GPU, before anything is loaded."""
    if needs:
        raise SystemExit(
            f"coding-train {command}: {config} needs a CUDA GPU ({needs}) and torch sees none. On CPU, use a "
            "*_cpu.yaml config, or set trainer.use_cpu: true and trainer.bf16: false (docs/trainer.md, \"Train on a GPU\")."
        )


def build_trainer(run: TrainRunConfig) -> Any:
    """The run's `ComposerTrainer`, ready to `train()`; it reads the service's tools from `run.environment`."""
    # Heavy imports (torch, TRL) only for the command that needs them.
    from datasets import Dataset

    from trainer_client.environment import environment_factory
    from trainer_client.policy import load_policy
    from trainer_client.trainer import ComposerConfig, ComposerTrainer

    use_vllm = run.generation == "vllm" or (run.generation == "auto" and importlib.util.find_spec("vllm") is not None)
    config = ComposerConfig(**{"use_vllm": use_vllm, **run.trainer})
    model, tokenizer = load_policy(run.policy)
    rows = [task_row(task) for task in run.tasks] * run.task_repeats
    trainer = ComposerTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=environment_factory(run.environment),
        peft_config=run.peft.peft_config() if run.peft else None,
    )
    if run.peft and trainer.is_world_process_zero():
        trainer.model.print_trainable_parameters()
    return trainer


def config_file(command: str, value: Path, folder: str = "") -> Path:
    """`--config` as a file: a path, or the name of a shipped config (`cpu_smoke`); stops the command if neither."""
    try:
        return find_config(value, folder)
    except FileNotFoundError as error:
        raise SystemExit(f"coding-train {command}: {error}") from None


def train(args: argparse.Namespace) -> int:
    args.config = config_file("train", args.config)
    try:
        run = load_run_config(args.config, lora_overrides(args))
    except ValidationError as error:
        raise SystemExit(f"coding-train train: {args.config}: {error}") from None
    if args.env_url:
        run.environment.base_url = args.env_url
    if args.max_steps is not None:
        run.trainer["max_steps"] = args.max_steps
    if args.output_dir is not None:
        run.trainer["output_dir"] = str(args.output_dir)
    stop_without_gpu("train", args.config, gpu_requirement(run.trainer, generation=run.generation, bf16_default=True))
    trainer = build_trainer(run)
    try:
        trainer.train()
        trainer.save_state()  # trainer_state.json: the per-step metrics (log_history) of the run
        if run.save_final_model:
            trainer.save_model(trainer.args.output_dir)  # a PEFT model saves its adapter only
    finally:
        trainer.close_environments()
    return 0


def _add_task_selection(parser: argparse.ArgumentParser, *, default_split: str) -> None:
    parser.add_argument("--suite", required=True, help="task suite (e.g. warmup, builtin)")
    parser.add_argument("--split", choices=["train", "held_out", "all"], default=default_split, help="fixed id-hash split")
    parser.add_argument("--limit", type=int, help="only the first N tasks (after --shuffle)")
    parser.add_argument("--shuffle", action="store_true", help="seeded shuffle of the ids first (mixes a suite's levels)")
    parser.add_argument("--id-prefix", help="only task ids that start with this (e.g. warmup/l1/: the first level)")
    parser.add_argument(
        "--tools", nargs="+", metavar="NAME", help="the episodes' tools (submit is always one); default: every tool of the service"
    )


def select_task_ids(args: argparse.Namespace, settings: ClientSettings) -> list[str]:
    """Ids of a suite's split, as the service serves and splits them (`GET /tasks?suite=&split=`)."""
    with CodingEnvClient(settings) as client:
        ids = client.task_ids(args.suite, split=None if args.split == "all" else args.split)
    if args.id_prefix:
        ids = [task_id for task_id in ids if task_id.startswith(args.id_prefix)]
    if args.shuffle:
        random.Random(args.seed).shuffle(ids)
    return ids[: args.limit] if args.limit is not None else ids


def make_demos(args: argparse.Namespace) -> int:
    # The expert scripts need the tasks' reference solutions, which the service never hands out: read from the
    # suites installed here (decision 123). Which tasks, the service says.
    from env_server.tasks import default_registry
    from trainer_client.demos import play_demos, write_demos
    from trainer_client.environment import environment_factory

    if args.split == "held_out":
        raise SystemExit("coding-train demos: demos are training data; held-out tasks are for evaluation only")
    settings = ClientSettings(base_url=args.env_url, api_token=args.api_token, tools=args.tools)
    registry = default_registry()
    tasks = [registry.get(task_id) for task_id in select_task_ids(args, settings)]
    demos = play_demos(
        tasks, environment_factory(settings), mistake_rate=args.mistake_rate, seed=args.seed, concurrency=args.concurrency
    )
    kept, played = write_demos(_with_progress(demos, len(tasks)), args.out)
    print(f"{kept}/{played} demos graded 1.0 written to {args.out}")
    return 0 if kept else 1


def _with_progress(demos: Iterator[Demo], total: int) -> Iterator[Demo]:
    """The demos as they come, each announced on stderr: a long run shows how far it is (and where it stalls)."""
    started = time.monotonic()
    for played, demo in enumerate(demos, 1):
        print(f"[{played}/{total}, {time.monotonic() - started:.0f} s] {demo.task_id}: reward {demo.reward:g}", file=sys.stderr, flush=True)
        yield demo


def fine_tune(args: argparse.Namespace) -> int:
    from trainer_client.sft import load_sft_config, run_sft

    args.config = config_file("sft", args.config, "sft")
    run = load_sft_config(args.config)
    if args.output_dir is not None:
        run.output_dir = args.output_dir
    if args.max_steps is not None:
        run.trainer["max_steps"] = args.max_steps
    stop_without_gpu("sft", args.config, gpu_requirement(run.trainer))
    print(f"saved to {run_sft(run)}")
    return 0


def evaluate_policy(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from trainer_client.environment import environment_factory
    from trainer_client.evaluation import EvalSettings, Evaluator, write_report
    from trainer_client.policy import load_policy

    client = ClientSettings(base_url=args.env_url, api_token=args.api_token, tools=args.tools)
    task_ids = select_task_ids(args, client)
    settings = EvalSettings(
        n=args.n,
        temperature=args.temperature,
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_completion_length=args.max_completion_length,
        concurrency=args.concurrency,
        seed=args.seed,
    )
    model, tokenizer = load_policy(PolicySpec(name=args.model))
    model.eval()
    started = time.perf_counter()
    with tqdm(total=len(task_ids) * args.n, desc="episodes", unit="ep") as bar:
        evaluator = Evaluator(model, tokenizer, environment_factory(client, grade_unsubmitted=False), settings, bar.update)
        episodes = evaluator.run(task_ids)
    seconds = time.perf_counter() - started
    meta = {
        "model": args.model,
        "suite": args.suite,
        "split": args.split,
        "id_prefix": args.id_prefix,
        "tools": client.tools,
        **settings.model_dump(),
        "seconds": seconds,
        "seconds_per_task": seconds / max(1, len(task_ids)),
    }
    report = write_report(episodes, args.out, k=args.n, meta=meta)
    print(
        f"pass@1 {report['pass@1']['value']:.3f} {report['pass@1']['ci95']}  "
        f"valid tool calls {report['valid_tool_call_rate']['value']:.3f}  -> {args.out / 'eval.json'}"
    )
    return 0


def measure_hint_uptake(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from trainer_client.environment import environment_factory
    from trainer_client.evaluation import EvalSettings, Evaluator
    from trainer_client.hint_uptake import SampledEpisode, measure, read_episodes, uptake_table, write_episodes, write_report
    from trainer_client.policy import load_policy
    from trainer_client.teacher_contexts import hint_sources

    if args.sources is None:  # every source this command can read: saved episodes hold their references
        references = bool(args.privileged_token) or args.episodes is not None
        args.sources = ["template", "raw_error", "sibling", *(["reference"] if references else [])]
        if not references:
            print("hint-uptake: no --privileged-token, so the reference source is not measured", file=sys.stderr)
    sources = hint_sources(args.sources)
    model, tokenizer = load_policy(PolicySpec(name=args.model))
    model.eval()
    episodes_path = args.out / "episodes.jsonl"
    started = time.perf_counter()
    if args.episodes is not None:
        episodes = read_episodes(args.episodes)
    else:
        if "reference" in sources and not args.privileged_token:
            raise SystemExit("coding-train hint-uptake: the reference source needs --privileged-token (the service's privileged_token)")
        client = ClientSettings(base_url=args.env_url, api_token=args.api_token, tools=args.tools, privileged_token=args.privileged_token or None)
        task_ids = select_task_ids(args, client)
        settings = EvalSettings(
            n=args.n, temperature=args.temperature, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
            max_completion_length=args.max_completion_length, concurrency=args.concurrency, seed=args.seed,
        )
        # The episodes are played without the privileged token: the policy's sessions never hold it.
        player = client.model_copy(update={"privileged_token": None})
        with tqdm(total=len(task_ids) * args.n, desc="episodes", unit="ep") as bar:
            played = Evaluator(model, tokenizer, environment_factory(player, grade_unsubmitted=False), settings, bar.update).run(task_ids)
        references = {}
        if "reference" in sources:
            with CodingEnvClient(client) as reader:
                references = {task_id: reader.task_reference(task_id) for task_id in task_ids}
        episodes = [SampledEpisode.of(episode, references.get(episode.task_id)) for episode in played if episode.reward is not None]
        write_episodes(episodes, episodes_path)
    sampled = time.perf_counter()
    scores = measure(model, tokenizer, episodes, sources, args.placements)
    meta = {
        "model": args.model,
        "episodes": len(episodes),
        "passed": sum(episode.passed for episode in episodes),
        "tasks": len({episode.task_id for episode in episodes}),
        "sources": list(sources),
        "placements": args.placements,
        "sampling_seconds": sampled - started,
        "scoring_seconds": time.perf_counter() - sampled,
        "episodes_file": str(args.episodes or episodes_path),
    }
    print(write_report(uptake_table(scores, seed=args.seed), scores, args.out, meta), end="")
    print(f"{meta['passed']}/{meta['episodes']} episodes passed; -> {args.out / 'uptake.json'}")
    return 0


def plot_metrics(args: argparse.Namespace) -> int:
    from trainer_client.metrics_plot import plot_run, read_run_log

    try:
        log = read_run_log(args.run_dir)
    except FileNotFoundError as error:
        raise SystemExit(f"coding-train plot: {error}") from None
    out = args.out or args.run_dir / "metrics.png"
    panels = plot_run(log, out, title=f"{args.run_dir}: {len(log.steps)} logged steps (from {log.source})")
    print(f"{len(panels)} panels of {len(log.steps)} steps from {log.source} -> {out}")
    return 0


def serve_model(args: argparse.Namespace) -> int:
    from trainer_client.model_server import serve

    serve(args.model, host=args.host, port=args.port, max_tokens=args.max_tokens)
    return 0


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in --help, except where there is none to show (a required option, or an
    override that is unset by default: its help says what applies then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coding-train", description="Train a policy on the coding environment service.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="GRPO + SDPO + DPO against the service")
    run.add_argument("--config", required=True, type=Path, help="run YAML, or a shipped config's name (cpu_smoke, ...: trainer_client/configs/)")
    run.add_argument("--env-url", help="service URL (overrides environment.base_url)")
    run.add_argument("--max-steps", type=int, help="optimizer steps (overrides trainer.max_steps)")
    run.add_argument(
        "--output-dir", type=Path, help="where checkpoints, the final model (or adapter) and trainer_state.json go (overrides trainer.output_dir)"
    )
    lora = run.add_argument_group("LoRA", "train an adapter (each flag adds or amends the config's `peft:` section)")
    lora.add_argument("--lora-r", type=int, help="adapter rank (unset: the config's, else 16)")
    lora.add_argument("--lora-alpha", type=float, help="adapter scale numerator (unset: the config's, else 32)")
    lora.add_argument("--lora-dropout", type=float, help="dropout on the adapter input (unset: the config's, else 0)")
    lora.add_argument("--lora-target-modules", nargs="+", metavar="NAME", help="layers that get an adapter (default: all attention and MLP projections)")
    run.set_defaults(func=train)
    demos = commands.add_parser("demos", help="play expert episodes from reference solutions; write SFT chat data")
    _add_task_selection(demos, default_split="train")
    demos.add_argument("--env-url", required=True, help="service URL")
    demos.add_argument("--api-token", help="bearer token of the service")
    demos.add_argument("--out", required=True, type=Path, help="JSONL file to write")
    demos.add_argument("--mistake-rate", type=float, default=0.3, help="share of episodes that make a mistake first and recover")
    demos.add_argument("--seed", type=int, default=0, help="seed of the mistake draws")
    demos.add_argument("--concurrency", type=int, default=4, help="sessions at once")
    demos.set_defaults(func=make_demos)
    sft = commands.add_parser("sft", help="warm start: TRL SFTTrainer on demos (loss on assistant turns)")
    sft.add_argument("--config", required=True, type=Path, help="SFT YAML, or a shipped SFT config's name (smollm2_cpu, ...: trainer_client/configs/sft/)")
    sft.add_argument("--output-dir", type=Path, help="overrides output_dir")
    sft.add_argument("--max-steps", type=int, help="overrides trainer.max_steps")
    sft.set_defaults(func=fine_tune)
    evaluate = commands.add_parser("eval", help="pass@k of a policy on a task split, through the service")
    evaluate.add_argument("--model", required=True, help="smollm2-135m-instruct, tiny-random, or a checkpoint directory")
    evaluate.add_argument("--env-url", required=True, help="service URL")
    evaluate.add_argument("--api-token", help="bearer token of the service")
    _add_task_selection(evaluate, default_split="held_out")
    evaluate.add_argument("--n", type=int, default=4, help="samples per task (pass@1 and pass@n are reported)")
    evaluate.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (0: greedy)")
    evaluate.add_argument("--max-turns", type=int, default=10, help="assistant turns per episode")
    evaluate.add_argument("--max-new-tokens", type=int, default=256, help="tokens per assistant turn")
    evaluate.add_argument("--max-completion-length", type=int, default=2048, help="token budget of a whole episode")
    evaluate.add_argument("--concurrency", type=int, default=8, help="episodes (service sessions) at once")
    evaluate.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
    evaluate.add_argument("--out", required=True, type=Path, help="directory for eval.json and eval.png")
    evaluate.set_defaults(func=evaluate_policy)
    uptake = commands.add_parser(
        "hint-uptake", help="how far each SDPO hint source moves the teacher from the student, on failing and passing turns"
    )
    uptake.add_argument("--model", required=True, help="smollm2-135m-instruct, tiny-random, or a checkpoint directory")
    uptake.add_argument("--env-url", help="service URL (not needed with --episodes)")
    uptake.add_argument("--api-token", help="bearer token of the service")
    uptake.add_argument(
        "--privileged-token", default=os.environ.get("CODING_ENV_PRIVILEGED_TOKEN"),
        help="the service's privileged_token, for the reference source (default: $CODING_ENV_PRIVILEGED_TOKEN)",
    )
    _add_task_selection(uptake, default_split="held_out")
    uptake.add_argument("--n", type=int, default=4, help="episodes per task (a task's episodes are one group, for the sibling source)")
    uptake.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    uptake.add_argument("--max-turns", type=int, default=6, help="assistant turns per episode")
    uptake.add_argument("--max-new-tokens", type=int, default=256, help="tokens per assistant turn")
    uptake.add_argument("--max-completion-length", type=int, default=1536, help="token budget of a whole episode")
    uptake.add_argument("--concurrency", type=int, default=8, help="episodes (service sessions) at once")
    uptake.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
    uptake.add_argument(
        "--sources", nargs="+", choices=HINT_SOURCES,
        help="hint sources to measure (default: all four, reference only with a privileged token)"
    )
    uptake.add_argument(
        "--placements", nargs="+", choices=HINT_PLACEMENTS, default=list(HINT_PLACEMENTS),
        help="where the teacher reads the message",
    )
    uptake.add_argument("--episodes", type=Path, help="score these sampled episodes (an earlier run's episodes.jsonl) instead of sampling")
    uptake.add_argument("--out", required=True, type=Path, help="directory for episodes.jsonl, uptake.json and uptake.md")
    uptake.set_defaults(func=measure_hint_uptake)
    plot = commands.add_parser("plot", help="draw a training run's per-step logs (reward, pass rate, error kinds, each loss) to a PNG")
    plot.add_argument("run_dir", type=Path, help="the run's output_dir (trainer_state.json, TensorBoard event files or checkpoints)")
    plot.add_argument("--out", type=Path, help="PNG to write (unset: RUN_DIR/metrics.png)")
    plot.set_defaults(func=plot_metrics)
    model_server = commands.add_parser("serve-model", help="a policy as an OpenAI-compatible chat-completions server (vf-eval, examples)")
    model_server.add_argument("--model", required=True, help="tiny-random, smollm2-135m-instruct, or a checkpoint directory")
    model_server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    model_server.add_argument("--port", type=int, default=8001, help="port to listen on (0: any free one, printed)")
    model_server.add_argument("--max-tokens", type=int, default=256, help="tokens per reply when a request sets no max_tokens")
    model_server.set_defaults(func=serve_model)
    try:
        from trainer_client.traces.cli import register as register_traces
    except ImportError:
        pass  # trace tools not installed in this checkout
    else:
        register_traces(commands)
    for command in commands.choices.values():
        command.formatter_class = DefaultsHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
