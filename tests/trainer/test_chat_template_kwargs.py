"""`chat_template_kwargs` (TRL's `GRPOConfig` field) reach every context the trainer renders itself:
the teacher's hint contexts, the DPO pairs' contexts. Checked with a Qwen3-style template, whose
generation prompt with `enable_thinking=False` carries an empty think block."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch

from tests.trainer.conftest import build_batch, make_config, make_trainer, preference_pairs, teacher_sequence

# Like Qwen3's template: tools in the system block, `<tool_call>` JSON in assistant turns, tool results as
# `<tool_response>` user turns, a think block on every assistant turn (empty without reasoning: TRL's
# prefix-preserving `qwen3_training.jinja` does the same), and an empty think block opening the
# assistant turn when `enable_thinking` is false.
QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{{- '<think>\\n' + (message.reasoning_content or '') + '\\n</think>\\n\\n' }}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3_tokenizer(tokenizer: Any) -> Any:
    qwen3 = copy.deepcopy(tokenizer)
    qwen3.chat_template = QWEN3_STYLE_TEMPLATE
    return qwen3


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_hint_sites_train_with_the_rollouts_chat_template_kwargs(tmp_path, qwen3_tokenizer, base_model, enable_thinking) -> None:
    config = make_config(tmp_path, sdpo_weight=1.0, chat_template_kwargs={"enable_thinking": enable_thinking})
    trainer = make_trainer(base_model, qwen3_tokenizer, config)
    inputs = build_batch(trainer, qwen3_tokenizer, hinted=[True, False])
    (site,) = inputs["hint_sites"][0]
    prompt = inputs["prompt_ids"][0][inputs["prompt_mask"][0].bool()].tolist()
    completion = inputs["completion_ids"][0].tolist()
    # The rollout's own assistant headers carry the empty think block exactly when thinking is off ...
    assert qwen3_tokenizer.decode(prompt).endswith("<|im_start|>assistant\n" + ("" if enable_thinking else EMPTY_THINK))
    # ... and the teacher's context puts the hint before that same header.
    teacher = teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids)
    turn = completion[site.start : site.end]
    assert teacher[len(teacher) - len(turn) :] == turn
    assert qwen3_tokenizer.decode(teacher[: len(teacher) - len(turn)]).endswith(
        "did you mean `pytest`?<|im_end|>\n<|im_start|>assistant\n" + ("" if enable_thinking else EMPTY_THINK)
    )
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    assert trainer._metrics["train"]["sdpo/loss"][-1] > 0


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_dpo_pairs_are_rendered_with_the_chat_template_kwargs(tmp_path, qwen3_tokenizer, base_model, enable_thinking) -> None:
    config = make_config(tmp_path, dpo_weight=1.0, dpo_tokens="all", chat_template_kwargs={"enable_thinking": enable_thinking})
    trainer = make_trainer(base_model, qwen3_tokenizer, config, preference_pairs=preference_pairs())
    pair = trainer.dpo.preferences.pairs[0]
    context = qwen3_tokenizer.decode(pair.context_ids)
    assert context.endswith("<|im_start|>assistant\n" + ("" if enable_thinking else EMPTY_THINK))
    chosen = qwen3_tokenizer.decode(pair.chosen_ids)  # whole (`dpo_tokens: all`): its rendering is what is checked
    # the action is what the model writes after the header: with thinking on, its (here empty) think block first
    assert chosen.startswith(("" if not enable_thinking else EMPTY_THINK) + "<tool_call>")
    assert chosen.endswith("</tool_call><|im_end|>")
    assert json.loads(chosen.split("<tool_call>\n")[1].split("\n")[0])["arguments"] == {"command": "python3 -m pytest -q"}
    loss = trainer.compute_loss(trainer.model, build_batch(trainer, qwen3_tokenizer, hinted=[False, False]))
    assert torch.isfinite(loss)
