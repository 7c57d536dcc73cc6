"""Shared pieces of the trainer tests: SmolLM2's real tokenizer, tiny random models, and rollouts
built token by token the way TRL's tool loop builds them (a random model emits no tool calls)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import torch
from datasets import Dataset

from env_server.models import ErrorKind
from trainer_client.client import ClientSettings
from trainer_client.environment import environment_factory
from trainer_client.hint_sites import HintSite, ToolCallRecord, locate_hint_sites, teacher_row, turn_reports
from trainer_client.packing import Continuation, PackedRow
from trainer_client.policy import load_tool_tokenizer, tiny_random_model
from trainer_client.records import PreferencePair
from trainer_client.trainer import ComposerConfig, ComposerTrainer

if TYPE_CHECKING:
    from tests.support.service import SharedServices

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
    }
]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tool_tokenizer()


@pytest.fixture(scope="session")
def base_model(tokenizer: Any) -> torch.nn.Module:
    return tiny_random_model(len(tokenizer), hidden_size=32, layers=2, seed=0, init_std=0.5)


def constant_reward(completions: list, **kwargs: Any) -> list[float]:
    return [float(i % 2) for i in range(len(completions))]


def make_config(tmp_path: Path, config_class: type = ComposerConfig, **overrides: Any) -> Any:
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=24,
        report_to=[],
        logging_steps=1,
        seed=0,
        save_strategy="no",
    )
    return config_class(**{**defaults, **overrides})


def make_trainer(model: torch.nn.Module, tokenizer: Any, config: Any, trainer_class: type = ComposerTrainer, **kwargs: Any):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Fix the bug."}]}] * 4)
    trainer = trainer_class(
        model=copy.deepcopy(model),
        reward_funcs=constant_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        **kwargs,
    )
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    return trainer


def tool_call_text(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call><|im_end|>"


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    model_token_mask: list[int]
    messages: list[dict[str, Any]]
    records: list[ToolCallRecord]


def build_rollout(trainer: ComposerTrainer, tokenizer: Any, hinted: bool) -> Rollout:
    """Turn 0 calls bash, the tool answers, turn 1 replies in text: TRL's token layout for a tool round."""
    prompt = [{"role": "user", "content": "Make the tests pass."}]
    prompt_ids = tokenizer.apply_chat_template(
        prompt,
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        chat_template=trainer.chat_template,
        **trainer.chat_template_kwargs,  # as TRL renders the prompt (`_tokenize_prompts`)
    )
    turn0 = tokenizer.encode(tool_call_text("pytset -q"), add_special_tokens=False)
    tool_message = {"role": "tool", "name": "bash", "content": "bash: pytset: command not found"}
    suffix = trainer._get_tool_suffix_ids([tool_message])
    turn1 = tokenizer.encode("Fixed it.<|im_end|>", add_special_tokens=False)
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": "pytset -q"}}}]},
        tool_message,
        {"role": "assistant", "content": "Fixed it."},
    ]
    record = ToolCallRecord(
        "bash",
        ErrorKind.COMMAND_NOT_FOUND,
        "`pytset` is not a command; did you mean `pytest`?" if hinted else None,
    )
    return Rollout(
        list(prompt_ids),
        [*turn0, *suffix, *turn1],
        [1] * len(turn0) + [0] * len(suffix) + [1] * len(turn1),
        messages,
        [record],
    )


def build_batch(trainer: ComposerTrainer, tokenizer: Any, hinted: list[bool]) -> dict[str, Any]:
    """A batch shaped like `_generate_and_score_completions` output, hint sites included."""
    rollouts = [build_rollout(trainer, tokenizer, h) for h in hinted]
    pad_id = tokenizer.pad_token_id
    prompt_width = max(len(r.prompt_ids) for r in rollouts)
    completion_width = max(len(r.completion_ids) for r in rollouts)
    prompt_ids = torch.tensor([[pad_id] * (prompt_width - len(r.prompt_ids)) + r.prompt_ids for r in rollouts])
    prompt_mask = torch.tensor([[0] * (prompt_width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rollouts])
    completion_ids = torch.tensor([r.completion_ids + [pad_id] * (completion_width - len(r.completion_ids)) for r in rollouts])
    completion_mask = torch.tensor([[1] * len(r.completion_ids) + [0] * (completion_width - len(r.completion_ids)) for r in rollouts])
    tool_mask = torch.tensor([r.model_token_mask + [1] * (completion_width - len(r.completion_ids)) for r in rollouts])
    sites = [
        locate_hint_sites(
            turn_reports(r.records, r.messages, {"bash"}, episode_over=True, last_turn_ended=True),
            (cm * tm).tolist(),
            trainer._hint_template,
        )
        for r, cm, tm in zip(rollouts, completion_mask, tool_mask)
    ]
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([1.0, -1.0] * (len(rollouts) // 2) + [0.5] * (len(rollouts) % 2)),
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
        "hint_sites": sites,
        "hint_tokens": torch.tensor(sum(s.end - s.start for ss in sites for s in ss)),
    }


def teacher_sequence(prompt: list[int], completion: list[int], site: HintSite, header_ids: Sequence[int]) -> list[int]:
    """One site's teacher input as a plain sequence: the context up to turn k's header, the hint, the header, turn k."""
    row = teacher_row(prompt, completion, [site], header_ids)
    (continuation,) = row.continuations
    return [*row.context[: continuation.cut], *continuation.token_ids]


def alone(sequence: list[int]) -> PackedRow:
    """A whole sequence as a packed row of one continuation (what `SdpoChannel.teacher_logits` takes)."""
    return PackedRow(sequence[:1], [Continuation(1, sequence[1:])])


def full_forward_logps(model: torch.nn.Module, context: tuple[int, ...], action: tuple[int, ...]) -> torch.Tensor:
    """The summed log-prob of `action` after `context`, from the model's own full forward."""
    ids = torch.tensor([[*context, *action]])
    logits = model(input_ids=ids).logits[0, len(context) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(action)[:, None]).sum()


def expected_pair_logps(model: torch.nn.Module, preferences: Any) -> torch.Tensor:
    with torch.no_grad():
        return torch.tensor(
            [
                [full_forward_logps(model, pair.context_ids, action) for action in (pair.chosen_ids, pair.rejected_ids)]
                for pair in preferences.pairs
            ]
        )


def bash_call(command: str) -> dict[str, Any]:
    """An assistant message with one `bash` call, arguments as a JSON string (as OpenAI messages carry them)."""
    call = {"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def preference_pairs() -> list[PreferencePair]:
    context = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Run the tests."}]
    return [
        PreferencePair(state_id=f"s{i}", messages=context, chosen=bash_call("python3 -m pytest -q"), rejected=bash_call(f"pytset {i}"))
        for i in range(3)
    ]


class ScriptedPolicyTrainer(ComposerTrainer):
    """Replaces only sampling: rollout i of the batch plays `scripts[i]`, one assistant turn per generation call
    (a later turn finds its script by its first turn, which must be unique); every context the policy was
    sampled on is kept (`sampled_contexts`)."""

    scripts: ClassVar[list[list[str]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampled_contexts: list[list[int]] = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tokenizer, scripts = self._tokenizer, self.scripts
        completions = []
        for index, ids in enumerate(prompt_ids):
            self.sampled_contexts.append(list(ids))
            context = tokenizer.decode(ids)
            turn = context.count("<|im_start|>assistant") - 1  # the generation prompt opens one more
            script = index if turn == 0 else next(i for i, s in enumerate(scripts) if s[0].removesuffix("<|im_end|>") in context)
            completions.append(tokenizer.encode(scripts[script][turn], add_special_tokens=False))
        return completions, None


def train_scripted(
    trainer_class: type[ScriptedPolicyTrainer], settings: ClientSettings, tokenizer: Any, base_model: torch.nn.Module,
    directory: Path, **config: Any,
) -> Any:
    """One optimizer step of `trainer_class` on four fizzbuzz rollouts (groups of two) through the service.
    Sites are distilled whole (`sdpo_tokens: all`): these tests check which turns become sites, before
    `content` narrows them (tests/trainer/test_call_tokens.py)."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "task_id": "builtin/fizzbuzz"}] * 4)
    defaults = dict(max_steps=1, per_device_train_batch_size=4, num_generations=2, max_completion_length=2048,
                    max_tool_calling_iterations=4, sdpo_weight=1.0, sdpo_tokens="all")
    trainer = trainer_class(  # a copy: TRL patches `forward` on the instance it trains
        model=copy.deepcopy(base_model), args=make_config(directory, **{**defaults, **config}), train_dataset=dataset,
        processing_class=tokenizer, environment_factory=environment_factory(settings),
    )
    try:
        trainer.train()
    finally:
        trainer.close_environments()
    return trainer


SERVICE_TOKEN = "trainer-test-token"
PRIVILEGED_TOKEN = "trainer-test-privileged-token"


@pytest.fixture(scope="session")
def service_url(services: SharedServices) -> str:
    """The session's service with a bearer token, a privileged token (task references) and room for six
    sessions (the capacity test fills it)."""
    return services.get(api_token=SERVICE_TOKEN, privileged_token=PRIVILEGED_TOKEN, max_sessions=6).url
