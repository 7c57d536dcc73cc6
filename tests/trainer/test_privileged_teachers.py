"""The SDPO teacher's privileged sources (decision 129), from real TRL rollouts against the real service.

The sampler is scripted (a random model writes no tool calls); the rest is real: TRL's tool loop, the
environment adapter, the service grading in Docker sandboxes, `GET /references/...` with the privileged
token, the hint sites and the teacher rows the SDPO channel runs, and one optimizer step. Two GRPO
groups on fizzbuzz: in the first, one rollout solves the task and its sibling does not; in the second,
neither does, so only the reference can teach.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.trainer.conftest import PRIVILEGED_TOKEN, SERVICE_TOKEN, ScriptedPolicyTrainer, train_scripted
from trainer_client.client import ClientError, ClientSettings, CodingEnvClient
from trainer_client.hint_sites import teacher_row

pytestmark = pytest.mark.docker

SIBLING_CODE = "def fizzbuzz(n):\n    out = ''\n    if n % 3 == 0:\n        out += 'Fizz'\n    if n % 5 == 0:\n        out += 'Buzz'\n    return out or str(n)\n"
SIBLING_MARK = "out or str(n)"
REFERENCE_MARK = "'Fizz' * (n % 3 == 0)"
"""A line only the task's reference solution has (`builtin.py`)."""


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


DONE = "Submitted.<|im_end|>"
"""The turn TRL asks for after the episode ended: it acted on nothing, so it is no site."""

SCRIPTS: list[list[str]] = [
    [call("write_file", {"path": "solution.py", "content": SIBLING_CODE}), call("submit", {}), DONE],  # solves it
    [call("bash", {"command": "cat solution.py"}),
     call("write_file", {"path": "solution.py", "content": "def fizzbuzz(n):\n    return str(n)\n"}), call("submit", {}), DONE],
    [call("write_file", {"path": "solution.py", "content": "def fizzbuzz(n):\n    return 'Fizz'\n"}), call("submit", {}), DONE],
    ["I cannot do this.<|im_end|>"],
]
"""One script per rollout (groups of two: rollouts 0-1 and 2-3). Each script's first turn is unique."""


class PrivilegedTeacherTrainer(ScriptedPolicyTrainer):
    """Plays `SCRIPTS`; keeps the batch, the rewards, the tool answers and the teacher rows the SDPO channel ran."""

    scripts = SCRIPTS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[dict[str, Any]] = []
        self.rewards: list[float] = []
        self.tool_messages: list[str] = []
        self.teacher_rows: list[Any] = []
        teacher_logits = self.sdpo.teacher_logits

        def recording_teacher_logits(rows, turn_lengths, contexts=None):
            self.teacher_rows.extend(rows)
            return teacher_logits(rows, turn_lengths, contexts)

        self.sdpo.teacher_logits = recording_teacher_logits

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append(output)
        self.rewards += [float(environment.reward or 0.0) for environment in self.environments]
        self.tool_messages += [m["content"] for messages in self._rollout_messages for m in messages if m["role"] == "tool"]
        return output


@pytest.fixture(scope="module")
def trainer(service_url, tokenizer, base_model, tmp_path_factory) -> PrivilegedTeacherTrainer:
    settings = ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN, privileged_token=PRIVILEGED_TOKEN)
    return train_scripted(
        PrivilegedTeacherTrainer, settings, tokenizer, base_model, tmp_path_factory.mktemp("privileged"),
        hint_sources=["template", "sibling", "reference"], completion_samples_per_step=4,
    )


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_privileged_sites_cover_every_turn_of_a_failed_rollout(trainer: PrivilegedTeacherTrainer) -> None:
    assert trainer.rewards == [1.0, 0.0, 0.0, 0.0]
    sites = trainer.batches[0]["hint_sites"]
    assert [[site.turn for site in rollout] for rollout in sites] == [[], [0, 1, 2], [0, 1], [0]]
    decode = trainer.processing_class.decode
    for rollout, sibling in ((1, True), (2, False), (3, False)):
        for site in sites[rollout]:
            message = decode(site.hint_ids)
            assert REFERENCE_MARK in message  # the reference diff, to every site of a failed rollout
            assert (SIBLING_MARK in message) is sibling  # the group's successful rollout, where there is one
    # the feedback still comes at the turns that failed: the submission, the turn without a call
    assert "hidden tests failed" in decode(sites[1][2].hint_ids) and "call submit" in decode(sites[3][0].hint_ids)


def test_the_teacher_reads_what_the_policy_never_does(trainer: PrivilegedTeacherTrainer) -> None:
    batch = trainer.batches[0]
    header = list(trainer._hint_template.header_ids)
    privileged = [site.hint_ids for rollout in batch["hint_sites"] for site in rollout]
    # every context the policy was sampled on (each turn of each rollout), token for token: none holds a
    # privileged message, nor the reference's text
    assert len(trainer.sampled_contexts) == 3 + 4 + 3 + 1
    decode = trainer.processing_class.decode
    for context in trainer.sampled_contexts:
        assert REFERENCE_MARK not in decode(context)
        assert not any(contains(context, list(ids)) for ids in privileged)
    # nor did a tool answer (the sandbox's output) quote it
    assert trainer.tool_messages and not any(REFERENCE_MARK in text for text in trainer.tool_messages)
    # the rows the SDPO channel ran: the student's tokens plus a continuation that reads the message
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    for row in (1, 2, 3):
        prompt = prompt_ids[row][batch["prompt_mask"][row].bool()].tolist()
        completion = completion_ids[row].tolist()
        student = [*prompt, *completion]
        assert REFERENCE_MARK not in decode(student)
        expected = teacher_row(prompt, completion, batch["hint_sites"][row], header)
        assert expected in trainer.teacher_rows
        for continuation, site in zip(expected.continuations, batch["hint_sites"][row]):
            teacher = [*student[: continuation.cut], *continuation.token_ids]
            assert REFERENCE_MARK in decode(teacher)
            assert teacher[-(site.end - site.start):] == completion[site.start : site.end]  # the same turn, scored


def test_the_completions_log_shows_what_the_teacher_read_beside_what_the_policy_did(trainer: PrivilegedTeacherTrainer) -> None:
    lines = [json.loads(line) for line in (Path(trainer.args.output_dir) / "completions.jsonl").read_text().splitlines()]
    assert [line["rollout"] for line in lines] == [0, 1, 2, 3]
    assert [[site["turn"] for site in line["hint_sites"]] for line in lines] == [[], [0, 1, 2], [0, 1], [0]]
    for line in lines[1:]:
        assert all(REFERENCE_MARK in site["teacher_reads"] for site in line["hint_sites"])
        assert REFERENCE_MARK not in json.dumps(line["messages"])


def test_the_loss_trains_on_them(trainer: PrivilegedTeacherTrainer) -> None:
    (entry,) = [e for e in trainer.state.log_history if "sdpo/hint_sites" in e]
    assert entry["sdpo/hint_sites"] == 6
    assert entry["sdpo/loss"] > 0


def test_references_need_the_privileged_token(service_url: str) -> None:
    with CodingEnvClient(ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN, privileged_token=PRIVILEGED_TOKEN)) as client:
        reference = client.task_reference("builtin/fizzbuzz")
        assert reference.task_id == "builtin/fizzbuzz" and REFERENCE_MARK in reference.diff
        assert reference.diff.startswith("--- a/solution.py\n+++ b/solution.py\n")
        with pytest.raises(ClientError) as unknown:
            client.task_reference("builtin/no_such_task")
        assert unknown.value.code == "task_not_found"
    for token in (None, "wrong"):
        with CodingEnvClient(ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN, privileged_token=token)) as client:
            with pytest.raises(ClientError) as refused:
                client.task_reference("builtin/fizzbuzz")
            assert refused.value.code == "forbidden" and refused.value.status == 403
    # the bearer token is still needed first
    answer = httpx.get(f"{service_url}/references/builtin/fizzbuzz", headers={"X-Privileged-Token": PRIVILEGED_TOKEN})
    assert answer.status_code == 401


def test_read_after_the_prompt_the_privileged_teacher_trains_too(service_url, tokenizer, base_model, tmp_path) -> None:
    """The ablation's privileged arm: sibling and reference after the prompt, each rollout's sites one chain."""
    settings = ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN, privileged_token=PRIVILEGED_TOKEN)
    trainer = train_scripted(
        PrivilegedTeacherTrainer, settings, tokenizer, base_model, tmp_path,
        hint_sources=["sibling", "reference"], hint_placement="after_prompt",
    )
    sites = trainer.batches[0]["hint_sites"]
    assert [[site.turn for site in rollout] for rollout in sites] == [[], [0, 1, 2], [0, 1], [0]]
    chains = sorted(([branch.branch for branch in row.branches] for row in trainer.teacher_rows), key=len)  # TRL may reorder rows
    assert chains == [[None], [None, 0], [None, 0, 1]]
    assert not any(REFERENCE_MARK in trainer.processing_class.decode(context) for context in trainer.sampled_contexts)
    (entry,) = [e for e in trainer.state.log_history if "sdpo/loss" in e]
    assert entry["sdpo/loss"] > 0
