"""Time of TRL's tool loop inside `ComposerTrainer`: serial (TRL's loop) vs concurrent tool rounds.

    python benchmarks/trainer_tool_rounds.py [--rollouts 8] [--rounds 5] [--steps 8] [--command "python3 -c pass"] [--tiny]

Starts `coding-env serve` (Docker backend) in a child process and trains a tiny random policy whose
sampler is scripted (a random model emits no tool calls): every rollout calls `bash` with
`--command` for `--rounds` rounds, then `submit`. The training steps alternate between
`concurrent_tool_calls` on and off (the first of each is a warm-up, left out of the figures when the
mode has more steps), and the time of each step's `_tool_call_loop` (all tool rounds of the
generation batch, generation between rounds included) and of the whole step is reported as median
and maximum per mode, with the serial/concurrent ratio. Every timed `bash` call must succeed and
every step's loss be finite, else the run fails. `--tiny` (CI's run): 2 rollouts, 1 round of `true`,
one step per mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from datasets import Dataset
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from samples import checked_loss  # noqa: E402
from service_latency import start_service, wait_pool  # noqa: E402

from trainer_client.client import ClientSettings  # noqa: E402
from trainer_client.environment import environment_factory  # noqa: E402
from trainer_client.policy import load_tool_tokenizer, tiny_random_model  # noqa: E402
from trainer_client.trainer import ComposerConfig, ComposerTrainer  # noqa: E402


class ScriptedRoundsTrainer(ComposerTrainer):
    """Samples `rounds` bash calls then `submit`, and times each generation batch's tool loop."""

    def __init__(self, *args: Any, command: str, rounds: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command, self._rounds = command, rounds
        self.loop_times: list[tuple[bool, float]] = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = []
        for ids in prompt_ids:
            done = self._tokenizer.decode(ids).count("<tool_response>")
            if done < self._rounds:
                call = {"name": "bash", "arguments": {"command": self._command}}
            elif done == self._rounds:
                call = {"name": "submit", "arguments": {}}
            else:
                texts.append("Done.<|im_end|>")
                continue
            texts.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>")
        return [self._tokenizer.encode(text, add_special_tokens=False) for text in texts], None

    def _tool_call_loop(self, *args: Any):
        started = time.perf_counter()
        result = super()._tool_call_loop(*args)
        self.loop_times.append((self.args.concurrent_tool_calls, time.perf_counter() - started))
        failed = [call for environment in self.environments for call in environment.tool_calls
                  if call.tool_name == "bash" and call.error_kind is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} timed bash calls failed, the first: {failed[0]}")
        return result


class AlternateToolMode(TrainerCallback):
    """Flips `concurrent_tool_calls` before every step, and keeps each step's time per mode."""

    def __init__(self) -> None:
        self.step_times: list[tuple[bool, float]] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        args.concurrent_tool_calls = state.global_step % 2 == 0
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_times.append((args.concurrent_tool_calls, time.perf_counter() - self._started))


def summary(samples: list[tuple[bool, float]]) -> dict[bool, list[float]]:
    """Per mode, the samples after the first (warm-up) one; the one sample when there is no other."""
    by_mode = {mode: [seconds for m, seconds in samples if m == mode] for mode in (False, True)}
    return {mode: times[1:] or times for mode, times in by_mode.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="training steps, alternating modes (even, >= 4 for a warm-up per mode)")
    parser.add_argument("--command", default="python3 -c pass")
    parser.add_argument("--tiny", action="store_true", help="2 rollouts, 1 round of `true`, a step per mode: every path and check")
    args = parser.parse_args()
    if args.tiny:
        args.rollouts, args.rounds, args.steps, args.command = 2, 1, 2, "true"

    process, address = start_service(pool_size=args.rollouts, max_sessions=args.rollouts + 2)
    try:
        with httpx.Client(base_url=f"http://{address}") as http:
            wait_pool(http, args.rollouts)
        tokenizer = load_tool_tokenizer()
        factory = environment_factory(ClientSettings(base_url=f"http://{address}"))
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "task_id": "builtin/fizzbuzz"}] * 64)
        alternate = AlternateToolMode()
        with tempfile.TemporaryDirectory() as output_dir:
            config = ComposerConfig(
                output_dir=output_dir, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
                per_device_train_batch_size=args.rollouts, num_generations=args.rollouts, max_steps=args.steps,
                max_completion_length=128 * (args.rounds + 2), activation_checkpointing=False, sdpo_weight=1.0,
                disable_tqdm=True,
            )
            trainer = ScriptedRoundsTrainer(
                model=tiny_random_model(len(tokenizer), hidden_size=32, layers=2), args=config, train_dataset=dataset,
                processing_class=tokenizer, environment_factory=factory, callbacks=[alternate],
                command=args.command, rounds=args.rounds,
            )
            try:
                trainer.train()
            finally:
                trainer.close_environments()
            for row in trainer.state.log_history:
                if "loss" in row:
                    checked_loss(row["loss"], f"step {row['step']}")
    finally:
        process.terminate()
        process.wait(timeout=60)

    loops, steps = summary(trainer.loop_times), summary(alternate.step_times)
    print(f"{args.rollouts} rollouts x {args.rounds} rounds of bash {args.command!r} + submit per step; "
          f"{len(loops[True])} measured steps per mode")
    print(f"{'mode':<12}{'tool loop p50 s':>16}{'max s':>8}{'step p50 s':>12}{'max s':>8}")
    for mode, name in ((False, "serial"), (True, "concurrent")):
        print(f"{name:<12}{statistics.median(loops[mode]):>16.2f}{max(loops[mode]):>8.2f}"
              f"{statistics.median(steps[mode]):>12.2f}{max(steps[mode]):>8.2f}")
    ratio = statistics.median(loops[False]) / statistics.median(loops[True])
    print(f"tool loop serial / concurrent: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
