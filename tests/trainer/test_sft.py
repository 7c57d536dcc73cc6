"""`coding-train sft`: loss on the policy's tokens only, and an output directory that is a policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from trl.chat_template_utils import qwen2_5_chat_template

from trainer_client.cli import gpu_requirement, main
from trainer_client.demos import Demo
from trainer_client.policy import PolicySpec, load_policy
from trainer_client.sft import SFTRunConfig, load_sft_config, run_sft, sft_trainer, tokenize_demo

SFT_CONFIGS = Path(__file__).resolve().parents[2] / "trainer_client" / "configs" / "sft"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {"type": "function", "function": {"name": "submit", "description": "Submit.", "parameters": {"type": "object", "properties": {}}}},
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def _demo() -> Demo:
    messages = [
        {"role": "user", "content": "Write a.py."},
        _call("write_file", path="a.py", content="x = 1\n"),
        {"role": "tool", "name": "write_file", "content": "Wrote a.py (1 lines)"},
        _call("submit"),
        {"role": "tool", "name": "submit", "content": "Submitted: 1/1 hidden tests passed, reward 1.000."},
        {"role": "assistant", "content": "Done."},
    ]
    return Demo(task_id="t/1", mistake=None, messages=messages, tools=json.dumps(TOOLS), reward=1.0, error_kinds=[])


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    from trainer_client.hint_sites import assistant_turn_spans

    return assistant_turn_spans(mask)


def test_loss_mask_covers_exactly_what_the_policy_generates(tokenizer: Any) -> None:
    row = tokenize_demo(tokenizer, _demo())
    ids, mask = row["input_ids"], row["assistant_masks"]
    turns = [tokenizer.decode(ids[start:end]) for start, end in _spans(mask)]
    assert turns == [
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1\\n"}}\n</tool_call><|im_end|>',
        '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>',
        "Done.<|im_end|>",
    ]
    outside = tokenizer.decode([token for token, bit in zip(ids, mask) if not bit])
    assert "Wrote a.py" in outside and "Write a.py." in outside and outside.endswith("<|im_start|>assistant\n")
    # The same conversation through the template in one piece: identical tokens (but the final newline,
    # which the template writes after the last turn and a model never generates).
    whole = tokenizer.apply_chat_template(_demo().messages, tools=TOOLS, tokenize=True, return_dict=False)
    assert list(whole) == ids + tokenizer.encode("\n", add_special_tokens=False)


def _run(tmp_path: Path, **trainer: Any) -> SFTRunConfig:
    demos = tmp_path / "demos.jsonl"
    demos.write_text(_demo().model_dump_json() + "\n")
    options = {"max_steps": 1, "per_device_train_batch_size": 1, "learning_rate": 1e-3, **trainer}
    return SFTRunConfig(policy=PolicySpec(name="tiny-random"), demos=demos, output_dir=tmp_path / "sft", trainer=options)


def test_trl_builds_labels_from_the_policy_tokens_only(tmp_path: Path, tokenizer: Any) -> None:
    trainer = sft_trainer(_run(tmp_path))
    row = trainer.train_dataset[0]
    expected = tokenize_demo(tokenizer, _demo())
    assert row["input_ids"] == expected["input_ids"]
    trained = [label for label in row["labels"] if label != -100]
    assert trained == [t for t, bit in zip(expected["input_ids"], expected["assistant_masks"]) if bit]


@pytest.mark.slow
def test_output_directory_is_a_policy_with_the_tool_template(tmp_path: Path) -> None:
    run = _run(tmp_path)
    before, _ = load_policy(run.policy)
    out = run_sft(run)
    model, tokenizer = load_policy(PolicySpec(name=str(out)))
    # TRL accepts a tool-calling template only when it is one of the strings it bundles.
    assert tokenizer.chat_template == qwen2_5_chat_template
    changed = any((a - b).abs().max() > 0 for a, b in zip(model.state_dict().values(), before.state_dict().values()))
    assert changed


@pytest.mark.parametrize("path", sorted(SFT_CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sft_config_builds_its_trainer(path: Path, tmp_path: Path) -> None:
    run = load_sft_config(path)
    assert run.policy.name == "smollm2-135m-instruct" and run.trainer["max_steps"] > 0
    assert yaml.safe_load(path.read_text())["output_dir"] == str(run.output_dir)
    if gpu_requirement(run.trainer):
        # Without a GPU the command stops with what needs one, before it loads anything...
        with pytest.raises(SystemExit, match=r"needs a CUDA GPU \(trainer\.bf16: true\)"):
            main(["sft", "--config", str(path)])
        run.trainer.update(bf16=False)  # ... and everything else of the config builds on the CPU.
    demos = tmp_path / "demos.jsonl"
    demos.write_text(_demo().model_dump_json() + "\n")
    # The model is not under test (the tiny one builds in a second); the demos are made by `coding-train demos`.
    run = run.model_copy(update={"policy": PolicySpec(name="tiny-random"), "demos": demos, "output_dir": tmp_path / "out"})

    trainer = sft_trainer(run)

    assert trainer.args.max_steps == run.trainer["max_steps"] and len(trainer.train_dataset) == 1
