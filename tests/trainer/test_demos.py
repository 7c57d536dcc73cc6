"""Expert demos: the scripts, and that a demo is exactly what a TRL rollout of the same episode holds.

The exactness test drives the real `ComposerTrainer` (TRL's tool loop, the real service) with a
sampler that emits the demo's assistant turns, then checks (a) TRL's parsed conversation equals the
demo's and (b) the demo's token layout (what SFT trains on) equals TRL's prompt + completion ids,
with the loss mask equal to TRL's `tool_mask`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset

from tests.trainer.conftest import SERVICE_TOKEN, make_config
from trainer_client.client import ClientSettings
from trainer_client.demos import FINAL_REPLY, Demo, _break_syntax, choose_mistake, expert_steps, play_demo, read_demos, write_demos
from trainer_client.environment import environment_factory
from trainer_client.hint_sites import assistant_turn_spans
from trainer_client.task_rows import task_row
from trainer_client.trainer import ComposerTrainer
from trainer_client.trl_rollout import rollout_token_ids


def _builtin(task_id: str) -> Any:
    from env_server.tasks import default_registry

    return default_registry().get(task_id)


def test_clean_script_inspects_writes_checks_and_submits() -> None:
    task = _builtin("builtin/fix_median")
    steps = [step.tool for step in expert_steps(task)]
    assert steps[0] == "list_dir" and steps[-1] == "submit"
    assert steps.index("read_file") < steps.index("write_file") < len(steps) - 2
    written = {step.arguments["path"]: step.arguments["content"] for step in expert_steps(task) if step.tool == "write_file"}
    assert written == task.metadata["solution"]


def test_a_script_for_fewer_tools_lists_and_tests_with_bash() -> None:
    task = _builtin("builtin/fix_median")
    steps = expert_steps(task, "command_typo", tools={"read_file", "write_file", "bash", "submit"})
    assert {step.tool for step in steps} == {"read_file", "write_file", "bash", "submit"}
    commands = [step.arguments["command"] for step in steps if step.tool == "bash"]
    assert commands[0] == "ls" and task.test_command in commands
    lean = expert_steps(task, tools={"write_file", "bash", "submit"})
    assert {step.tool for step in lean} == {"write_file", "bash", "submit"}
    assert [step.arguments["command"] for step in lean if step.tool == "bash"][1] == f"cat {next(iter(task.metadata['solution']))}"
    with pytest.raises(ValueError, match="write_file"):
        expert_steps(task, tools={"bash", "submit"})


def test_syntax_error_mistake_writes_a_file_that_does_not_compile_then_the_fix() -> None:
    task = _builtin("builtin/fizzbuzz")
    writes = [step for step in expert_steps(task, "syntax_error") if step.tool == "write_file"]
    assert len(writes) == 2
    with pytest.raises(SyntaxError):
        compile(writes[0].arguments["content"], "solution.py", "exec")
    assert writes[1].arguments["content"] == task.metadata["solution"]["solution.py"]


def test_break_syntax_without_a_block_header_still_breaks() -> None:
    with pytest.raises(SyntaxError):
        compile(_break_syntax("x = 1\n"), "m.py", "exec")


def test_mistake_draws_are_seeded_and_follow_the_rate() -> None:
    task = _builtin("builtin/word_count")
    assert choose_mistake(task, 0.0, seed=3) is None
    assert choose_mistake(task, 1.0, seed=3) in {"syntax_error", "command_typo", "missing_file"}
    assert [choose_mistake(task, 0.5, seed=s) for s in range(20)] == [choose_mistake(task, 0.5, seed=s) for s in range(20)]


class _ScriptedTrainer(ComposerTrainer):
    """Generation replaced by the demo's turns: turn k after k assistant headers beyond the prompt's."""

    turns: list[list[int]] = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        header = self.processing_class.encode("<|im_start|>assistant", add_special_tokens=False)
        outputs = []
        for ids in prompt_ids:
            opened = sum(ids[i : i + len(header)] == header for i in range(len(ids)))
            outputs.append(list(self.turns[opened - 1]))  # the prompt ends with the first header
        return outputs, None


def _shape(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant turns whole; tool results by name, with the content only of the file tools. Commands'
    output (test run times, and on a loaded machine a timeout) and the grade may differ between plays."""
    deterministic = {"list_dir", "read_file", "write_file"}
    return [
        m if m["role"] != "tool" else {"role": "tool", "name": m["name"], "content": m["content"] if m["name"] in deterministic else None}
        for m in messages
    ]


@pytest.mark.docker
@pytest.mark.slow
def test_demo_is_exactly_a_trl_rollout_of_the_episode(service_url: str, tokenizer: Any, base_model: Any, tmp_path: Path) -> None:
    settings = ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN)
    factory = environment_factory(settings)
    environment = factory()
    try:
        demo = play_demo(environment, _builtin("builtin/fizzbuzz"), "syntax_error")
    finally:
        environment._close()
    assert demo.reward == 1.0
    assert "syntax_error" in demo.error_kinds
    assert demo.messages[-1] == {"role": "assistant", "content": FINAL_REPLY}

    tools = json.loads(demo.tools)
    ids, mask = rollout_token_ids(tokenizer, demo.messages, tools)
    prompt_length = mask.index(1)
    _ScriptedTrainer.turns = [ids[start + prompt_length : end + prompt_length] for start, end in assistant_turn_spans(mask[prompt_length:])]
    config = make_config(tmp_path, max_completion_length=4096, max_tool_calling_iterations=40, logging_steps=1)
    trainer = _ScriptedTrainer(
        model=copy.deepcopy(base_model),  # TRL patches `forward` on the instance it trains; keep the fixture clean
        args=config,
        train_dataset=Dataset.from_list([task_row("builtin/fizzbuzz")] * 2),
        processing_class=tokenizer,
        environment_factory=factory,
    )
    try:
        output = trainer._generate_and_score_completions([task_row("builtin/fizzbuzz")] * 2)
    finally:
        trainer.close_environments()
    completion = trainer._rollout_messages[0]
    assert _shape(completion) == _shape(demo.messages[1:])

    # What SFT trains on, rendered from TRL's own conversation, is TRL's token sequence and mask.
    trl_prompt = output["prompt_ids"][0][output["prompt_mask"][0].bool()].tolist()
    kept = output["completion_mask"][0].bool()
    trl_completion = output["completion_ids"][0][kept].tolist()
    trl_mask = output["tool_mask"][0][kept].tolist()
    layout_ids, layout_mask = rollout_token_ids(tokenizer, [demo.messages[0], *completion], tools)
    assert layout_ids == trl_prompt + trl_completion
    assert layout_mask == [0] * len(trl_prompt) + trl_mask


def test_only_demos_graded_one_are_written(tmp_path: Path) -> None:
    def demo(task_id: str, reward: float) -> Demo:
        return Demo(task_id=task_id, mistake=None, messages=[{"role": "user", "content": "x"}], tools="[]", reward=reward, error_kinds=[])

    out = tmp_path / "demos.jsonl"
    assert write_demos(iter([demo("a/1", 1.0), demo("a/2", 0.5), demo("a/3", 1.0)]), out) == (2, 3)
    assert [d.task_id for d in read_demos(out)] == ["a/1", "a/3"]


def test_demos_refuse_the_held_out_split() -> None:
    from trainer_client.cli import main

    with pytest.raises(SystemExit, match="held-out"):
        main(["demos", "--suite", "warmup", "--split", "held_out", "--env-url", "http://127.0.0.1:9", "--out", "x.jsonl"])
