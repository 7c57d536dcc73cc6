"""Several tool calls in one assistant turn through TRL's real trainer, the environment adapter and
the real service (decision 031): the turn is one step of the service, its calls run in order, each
with its own record, and the calls past the service's per-step cap do not run and are blamed
`too_many_calls`, with the service's hint, at that turn's hint site.

A random model emits no tool calls, so sampling is scripted (as in test_training_run.py): the first
turn carries one call more than the cap (write a file, read it back with bash, more commands), the
second submits, the third closes. Everything else is real.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from datasets import Dataset

from env_server.models import DEFAULT_MAX_CALLS_PER_STEP, ErrorKind
from tests.trainer.conftest import SERVICE_TOKEN, make_config
from trainer_client.client import ClientSettings
from trainer_client.environment import environment_factory
from trainer_client.trainer import ComposerTrainer

pytestmark = pytest.mark.docker

FIRST_TURN = [
    ("write_file", {"path": "note.txt", "content": "from the first call\n"}),
    ("bash", {"command": "cat note.txt"}),
    *[("bash", {"command": "true"})] * (DEFAULT_MAX_CALLS_PER_STEP - 2),
    ("bash", {"command": "echo over the cap > over.txt"}),
]


def calls_text(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>" for name, arguments in calls)


class ThreeCallTurnTrainer(ComposerTrainer):
    """Scripted sampling; keeps each batch's tool messages, call records and hint sites."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tool_messages: list[list[dict]] = []
        self.call_records: list[list[Any]] = []
        self.hint_sites: list[list[Any]] = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # Keyed by the tool responses the context holds: none before the first turn, one per call after it.
        texts = {0: calls_text(FIRST_TURN), len(FIRST_TURN): calls_text([("submit", {})])}
        completions = []
        for ids in prompt_ids:
            text = texts.get(self._tokenizer.decode(ids).count("<tool_response>"), "Done.")
            completions.append(self._tokenizer.encode(text + "<|im_end|>", add_special_tokens=False))
        return completions, None

    def _tool_call_loop(self, *args: Any):
        result = super()._tool_call_loop(*args)
        self.tool_messages.extend([m for m in messages if m["role"] == "tool"] for messages in result[1])
        return result

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.call_records.extend(list(environment.tool_calls) for environment in self.environments)
        self.hint_sites.extend(output["hint_sites"])
        return output


@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent", "serial"])
def test_a_turn_with_several_calls_runs_them_in_order_up_to_the_cap(service_url, tokenizer, base_model, tmp_path, concurrent) -> None:
    factory = environment_factory(ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN))
    config = make_config(
        tmp_path, max_steps=1, max_completion_length=1024, sdpo_weight=1.0, sdpo_tokens="all",  # whole turns: `submit {}` is a site
        concurrent_tool_calls=concurrent, concurrent_resets=concurrent
    )
    trainer = ThreeCallTurnTrainer(
        model=copy.deepcopy(base_model),
        args=config,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "task_id": "builtin/fizzbuzz"}] * 2),
        processing_class=tokenizer,
        environment_factory=factory,
    )
    try:
        trainer.train()
    finally:
        trainer.close_environments()

    assert len(trainer.call_records) == 2
    for messages, records, sites in zip(trainer.tool_messages, trainer.call_records, trainer.hint_sites, strict=True):
        # One tool message per call of the first turn, in order, then submit's.
        assert [m["name"] for m in messages] == [name for name, _ in FIRST_TURN] + ["submit"]
        assert messages[1]["content"] == "from the first call"  # the write ran before the read
        assert messages[-2]["content"].startswith(f"Not run: at most {DEFAULT_MAX_CALLS_PER_STEP} tool calls")
        assert "Submitted" in messages[-1]["content"]  # the skipped call did not use up a step
        assert [(r.tool_name, r.error_kind) for r in records] == [
            *((name, None) for name, _ in FIRST_TURN[:-1]), ("bash", ErrorKind.TOO_MANY_CALLS), ("submit", None)
        ]
        assert records[-2].hint  # the service's hint for the call it did not run
        # The turn that made too many calls is a hint site, and so is the submission of the unsolved task.
        assert [(site.turn, site.error_kinds) for site in sites] == [(0, ("too_many_calls",)), (1, ("submission_failed",))]
