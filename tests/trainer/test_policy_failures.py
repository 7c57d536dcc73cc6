"""Hint sites at every failure the policy causes, from real TRL rollouts against the real service.

The sampler is scripted (a random model writes no tool calls); everything else is real: TRL 1.16's
response parsing and tool loop (which answers unparsable calls, unknown tools and arguments that are
not named parameters itself), the environment adapter, the service's error kinds and hints in Docker
sandboxes, the hint-site location and one optimizer step of all the losses.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.trainer.conftest import SERVICE_TOKEN, ScriptedPolicyTrainer, train_scripted
from trainer_client.client import ClientSettings

pytestmark = pytest.mark.docker


def call(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


UNPARSABLE = '<tool_call>\n{"name": "bash", "arguments": {"command": "cat solution.py"}\n</tool_call><|im_end|>'

SCRIPTS: list[list[str]] = [
    [  # an unknown tool, arguments that are not named parameters (TRL answers), a wrong parameter (the service answers)
        call("run_python", {"code": "print(1)"}),
        call("bash", "ls"),
        call("bash", {"cmd": "ls"}),
        call("submit", {}),  # the untouched stub: the hidden checks fail

        "Submitted.<|im_end|>",  # after the episode is over: no failure
    ],
    [call("bash", {"command": "ls -a"}), UNPARSABLE],  # a call that does not parse ends the rollout
    ["The answer is 42.<|im_end|>"],  # no tool call, never submitted
    # a bad command, then calls until the tool-iteration limit (4) stops the loop before the last one runs
    [call("bash", {"command": "pytset -q"}), *[call("bash", {"command": "pwd"})] * 4],
]
"""One script per rollout: its assistant turns in order. Each script's first turn is unique."""

EXPECTED_SITES = [
    [(0, ("tool_not_found",)), (1, ("type_error",)), (2, ("type_error",)), (3, ("submission_failed",))],
    [(1, ("json_decode",))],
    [(0, ("no_tool_call",))],
    [(0, ("command_not_found",))],
]


class FailingPolicyTrainer(ScriptedPolicyTrainer):
    """Plays `SCRIPTS`; keeps each batch's parsed completions and hint sites."""

    scripts = SCRIPTS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hint_sites: list[list[list[Any]]] = []
        self.completions: list[list[list[dict]]] = []

    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        self.completions.append(result[3])
        return result

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.hint_sites.append(output["hint_sites"])
        return output


@pytest.fixture(scope="module")
def trainer(service_url, tokenizer, base_model, tmp_path_factory) -> FailingPolicyTrainer:
    settings = ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN)
    return train_scripted(FailingPolicyTrainer, settings, tokenizer, base_model, tmp_path_factory.mktemp("failures"), jsd_top_k=64)


def test_every_policy_failure_is_a_hint_site(trainer: FailingPolicyTrainer) -> None:
    assert len(trainer.completions) == 1
    # the rollouts went as scripted through TRL's own loop
    turns = [[m for m in messages if m["role"] == "assistant"] for messages in trainer.completions[0]]
    assert [len(t) for t in turns] == [5, 2, 1, 5]
    assert "tool_calls" not in turns[1][1] and "<tool_call>" in turns[1][1]["content"]  # TRL could not parse it
    assert turns[3][4]["tool_calls"]  # the last call of rollout 3 was parsed but never run
    sites = trainer.hint_sites[0]
    assert [[(site.turn, site.error_kinds) for site in rollout] for rollout in sites] == EXPECTED_SITES


def test_hints_carry_the_error(trainer: FailingPolicyTrainer) -> None:
    (unknown, untyped, wrong_parameter, wrong_submission), (unparsable,), (no_call,), (bad_command,) = trainer.hint_sites[0]
    assert "'run_python' not found" in unknown.hints[0] and "submit" in unknown.hints[0]  # the tools that exist
    assert "type str" in untyped.hints[0]
    assert wrong_parameter.hints[0]  # the service's own hint for its `type_error`
    assert "6 of 6 hidden tests failed" in wrong_submission.hints[0]  # counts only: nothing of the tests themselves
    assert "Expecting ',' delimiter" in unparsable.hints[0] and "cat solution.py" in unparsable.hints[0]
    assert "submit" in no_call.hints[0]
    assert bad_command.hints[0]
    tokenizer = trainer.processing_class
    for site in (unknown, unparsable, no_call):  # what the teacher reads is the hint, in the chat template
        assert site.hints[0][:40] in tokenizer.decode(site.hint_ids)


def test_rollout_metrics_are_logged(trainer: FailingPolicyTrainer) -> None:
    (entry,) = [e for e in trainer.state.log_history if "sdpo/hint_sites" in e]
    assert entry["sdpo/hint_sites"] == 7
    assert entry["sdpo/loss"] > 0
    assert entry["policy/tool_calls"] == 10  # 4 + 1 + 0 + 5 parsed calls
    # valid turns: submit; `ls -a`; five in rollout 3 (a failing command is still a valid call) -> 7 of 13
    assert entry["policy/valid_call_rate"] == pytest.approx(7 / 13)
    assert entry["policy/failures/no_tool_call"] == 1 and entry["policy/failures/json_decode"] == 1
    assert entry["policy/failures/submission_failed"] == 1
    assert entry["policy/failures/sandbox_error"] == 0
    assert "reward/group_std" in entry and "canary/cheat_rate" not in entry
