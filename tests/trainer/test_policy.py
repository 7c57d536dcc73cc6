"""`load_policy`: what it hands to TRL, by name or from a checkpoint directory."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from datasets import Dataset
from trl.chat_template_utils import qwen2_5_chat_template, qwen2_5_training_chat_template, supports_tool_calling

from tests.trainer.conftest import make_config
from trainer_client.policy import load_policy, tiny_random_model
from trainer_client.trainer import ComposerTrainer


def test_a_checkpoint_saved_with_trls_training_template_gets_the_one_trl_parses(tmp_path, tokenizer: Any) -> None:
    # SFTTrainer may save the training variant of the template (generation tags); GRPO would then
    # not recognise it and parse no tool calls at all.
    tokenizer.chat_template = qwen2_5_training_chat_template
    try:
        tiny_random_model(len(tokenizer), hidden_size=16, layers=1).save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)
    finally:
        tokenizer.chat_template = qwen2_5_chat_template
    model, loaded = load_policy(str(tmp_path))
    assert loaded.chat_template == qwen2_5_chat_template and supports_tool_calling(loaded)
    assert model.config.hidden_size == 16 and loaded.pad_token_id is not None


def test_a_chatml_checkpoint_without_tool_calling_gets_trls_qwen2_5_template(tmp_path, tokenizer: Any) -> None:
    template = tokenizer.chat_template
    tokenizer.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    try:
        tiny_random_model(len(tokenizer), hidden_size=16, layers=1).save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)
    finally:
        tokenizer.chat_template = template
    _, loaded = load_policy(str(tmp_path))
    assert loaded.chat_template == qwen2_5_chat_template


def test_a_plain_string_prompt_is_refused_with_a_clear_message(tmp_path, tokenizer: Any, base_model) -> None:
    dataset = Dataset.from_list([{"prompt": "Fix the bug.", "task_id": "builtin/fizzbuzz"}] * 2)
    with pytest.raises(ValueError, match="list of chat messages.*task_row"):
        ComposerTrainer(
            model=copy.deepcopy(base_model),  # TRL patches `forward` on the instance it trains; keep the fixture clean
            args=make_config(tmp_path),
            train_dataset=dataset,
            processing_class=tokenizer,
            environment_factory=lambda: None,  # never called: the rows are refused first
        )
