"""Two real ComposerTrainer steps (alpha > 0, beta > 0) against the real service and Docker sandboxes.

A random model emits no tool calls, so the policy's sampler is scripted: each rollout's turns are
fixed token sequences (a failing or a working bash call, then `submit`, then a closing text). All
else is real: TRL's tool loop, the environment adapter, the service's error kinds and hints, hint
site location, the three losses and the optimizer. The same run is made twice, with the resets of a
batch and the tool calls of a round run concurrently (the default) and serially (TRL's loops), and
the two are compared.
"""

from __future__ import annotations

import copy
import functools
import threading
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from tests.trainer.conftest import SERVICE_TOKEN, make_config, preference_pairs, tool_call_text
from trainer_client.client import ClientSettings
from trainer_client.environment import environment_factory
from trainer_client.trainer import ComposerTrainer

pytestmark = pytest.mark.docker


class ScriptedSamplerTrainer(ComposerTrainer):
    """Replaces only sampling: turn 0 is a bad command in even rollouts, a good one in odd ones."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tokenizer = self._tokenizer
        completions = []
        for index, ids in enumerate(prompt_ids):
            rounds = tokenizer.decode(ids).count("<tool_response>")
            if rounds == 0:
                text = tool_call_text("pytset -q" if index % 2 == 0 else "ls")
            elif rounds == 1:
                text = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>'
            else:
                text = "Done.<|im_end|>"
            completions.append(tokenizer.encode(text, add_special_tokens=False))
        return completions, None


class RecordingTrainer(ScriptedSamplerTrainer):
    """Keeps, per generation batch, the prompts, the tool messages, the environments' call records and the hint sites."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[list[list[int]]] = []
        self.tool_messages: list[list[list[dict]]] = []
        self.call_records: list[list[list[Any]]] = []
        self.hint_sites: list[list[list[Any]]] = []

    def _tool_call_loop(self, *args: Any):
        result = super()._tool_call_loop(*args)
        completions = result[1]
        self.tool_messages.append([[m for m in messages if m["role"] == "tool"] for messages in completions])
        return result

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.prompts.append([ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])])
        self.call_records.append([list(environment.tool_calls) for environment in self.environments])
        self.hint_sites.append(output["hint_sites"])
        return output


def meeting_environments(factory: functools.partial, rollouts: int) -> functools.partial:
    """The factory's environments, except that each reset waits until every rollout's reset is in flight,
    and each episode's first call until every rollout's first call is: serial resets or a serial tool
    loop cannot get past them (the barrier breaks; the reset raises, the call fails)."""
    barrier = threading.Barrier(rollouts, timeout=120)
    reset_barrier = threading.Barrier(rollouts, timeout=120)

    class MeetingEnvironment(factory.func):
        def reset(self, **row: Any) -> str:
            reset_barrier.wait()
            self._met = False
            return super().reset(**row)

        def _call(self, tool_name: str, arguments: dict[str, Any]) -> str:
            if not self._met:
                self._met = True
                barrier.wait()
            return super()._call(tool_name, arguments)

    return functools.partial(MeetingEnvironment, *factory.args, **factory.keywords)


class GradientCheck(TrainerCallback):
    def __init__(self) -> None:
        self.steps_checked = 0

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        for name, param in model.named_parameters():
            assert param.grad is not None, f"{name} got no gradient"
            assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
        self.steps_checked += 1


@pytest.fixture(scope="module")
def runs(service_url, tokenizer, base_model, tmp_path_factory) -> dict[str, tuple[RecordingTrainer, GradientCheck]]:
    """The same two-step training run with concurrent and with serial resets and tool rounds."""
    factory = environment_factory(ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "task_id": "builtin/fizzbuzz"}] * 4)
    results = {}
    for mode in ("concurrent", "serial"):
        config = make_config(
            tmp_path_factory.mktemp(mode),
            max_steps=2,
            max_completion_length=256,
            sdpo_weight=1.0,
            sdpo_tokens="all",  # whole turns: the `submit {}` turn is a site too
            dpo_weight=0.5,
            dpo_batch_size=2,
            jsd_top_k=64,
            concurrent_tool_calls=mode == "concurrent",
            concurrent_resets=mode == "concurrent",
        )
        rollouts = config.per_device_train_batch_size * config.steps_per_generation
        check = GradientCheck()
        trainer = RecordingTrainer(
            model=copy.deepcopy(base_model),  # TRL patches `forward` on the instance it trains; keep the fixture clean
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            environment_factory=meeting_environments(factory, rollouts) if mode == "concurrent" else factory,
            preference_pairs=preference_pairs(),
            callbacks=[check],
        )
        try:
            trainer.train()
        finally:
            trainer.close_environments()
        results[mode] = trainer, check
    return results


def test_two_steps_with_all_three_channels(runs) -> None:
    trainer, check = runs["concurrent"]
    assert check.steps_checked == 2
    logs = [entry for entry in trainer.state.log_history if "sdpo/loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        # one rollout of two hit `command_not_found` with a hint, and both submitted the untouched stub
        assert entry["sdpo/hint_sites"] == 3
        assert entry["policy/failures/submission_failed"] == 2
        assert entry["sdpo/loss"] > 0 and entry["sdpo/jsd"] > 0
        assert entry["env/error_rate/command_not_found"] == pytest.approx(0.25)  # 1 of 4 calls
        assert "dpo/loss" in entry
        assert "reward" in entry
    # Step 1: the policy is its own reference (no pair won); step 2: one update towards the chosen side won every pair.
    assert [entry["dpo/accuracy"] for entry in logs] == [0.0, 1.0]


def test_concurrent_tool_rounds_match_the_serial_loop(runs) -> None:
    concurrent, _ = runs["concurrent"]
    serial, _ = runs["serial"]
    assert len(concurrent.tool_messages) == len(serial.tool_messages) == 2
    assert concurrent.call_records == serial.call_records
    assert concurrent.hint_sites == serial.hint_sites
    for batch in concurrent.hint_sites:
        assert [[site.error_kinds for site in sites] for sites in batch] == [
            [("command_not_found",), ("submission_failed",)],
            [("submission_failed",)],
        ]
    assert concurrent.tool_messages == serial.tool_messages


def test_concurrent_resets_match_the_serial_loop(runs) -> None:
    concurrent, _ = runs["concurrent"]
    serial, _ = runs["serial"]
    assert len(concurrent.prompts) == 2
    assert concurrent.prompts == serial.prompts
    for batch in concurrent.prompts:
        for prompt in batch:  # each rollout's prompt ends with the task its reset started
            assert "Implement `fizzbuzz(n: int) -> str`" in concurrent.processing_class.decode(prompt)
