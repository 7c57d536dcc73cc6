"""The verl (0.9.1) agent loop, built the way verl's `AgentLoopWorker` builds one (hydra's
`instantiate` on the loop's registry entry, with the worker's arguments) and run against the real
service, with verl's real Continuous Token builder and the real SmolLM2 ChatML tokenizer of the
trainer tests (Qwen2 model type, Qwen2.5 tool template).

The one double: `ScriptedServer` stands in for verl's LLM server manager (vLLM/SGLang behind
`server_manager.generate`): it returns scripted replies, tokenized, as `TokenOutput`s, and records
the prompt ids it was given. verl's trainer, Ray workers and rollout servers are not run here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.conftest import framework, open_sessions

framework("verl", "verl")
# Hydra 1.4 warns that verl's own `instantiate` call passes no execution whitelist (verl's business).
pytestmark = pytest.mark.filterwarnings("ignore:hydra.utils.instantiate:UserWarning")

import hydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from env_server.tasks import builtin  # noqa: E402
from env_server.tasks import cli as tasks_cli  # noqa: E402
from tests.support.service import RunningService  # noqa: E402
from trainer_client.integrations.verl import AGENT_NAME, CodingEnvAgentLoop  # noqa: E402
from trainer_client.policy import load_tool_tokenizer  # noqa: E402

TASK_ID = "builtin/fizzbuzz"
SOLUTION = builtin.BuiltinSuite().get(TASK_ID).metadata["solution"]["solution.py"]
RESPONSE_LENGTH = 4096
AGENT_LOOP_YAML = """
- name: coding_env
  _target_: trainer_client.integrations.verl.CodingEnvAgentLoop
  coding_env: {settings}
"""
"""A file for verl's `rollout.agent.agent_loop_config_path`, as docs/integrations.md writes it."""


class ScriptedServer:
    """verl's `server_manager`, scripted: each `generate` answers the next reply, ending it with the
    template's end-of-turn token as a model would. With `hang_at`, that call never answers."""

    def __init__(self, tokenizer: Any, replies: list[str], hang_at: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.hang_at = hang_at
        self.prompts: list[list[int]] = []
        self.request_ids: list[str] = []
        self.generated: list[list[int]] = []
        self.reached = asyncio.Event()

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        self.request_ids.append(request_id)
        if len(self.prompts) == self.hang_at:
            self.reached.set()
            await asyncio.Event().wait()  # the model is still thinking when the rollout is dropped
        token_ids = self.tokenizer.encode(self.replies[len(self.generated)] + "<|im_end|>", add_special_tokens=False)
        self.generated.append(token_ids)
        return TokenOutput(token_ids=token_ids, stop_reason="completed")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tool_tokenizer()


def make_loop(
    service: RunningService, server: ScriptedServer, tokenizer: Any, response_length: int = RESPONSE_LENGTH, **coding_env: Any
) -> CodingEnvAgentLoop:
    """What `AgentLoopWorker._run_agent_loop` does, on the loop's entry in docs/integrations.md's YAML."""
    settings = {"service": {"base_url": service.url}, "max_turns": 16, **coding_env}
    [entry] = OmegaConf.create(AGENT_LOOP_YAML.format(settings=json.dumps(settings)))
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == entry["_target_"]  # importing the module registered it too
    trainer_config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": response_length}}})
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=trainer_config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",  # the tiny test model's type: verl picks its Qwen builder
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(OmegaConf.create({})),
        tools=ToolListWrap([]),
    )


async def play(loop_factory: Any, sampling_params: dict[str, Any], **fields: Any) -> Any:
    """Build the loop inside the running event loop (verl's worker does; the loop keeps it) and run it."""
    return await loop_factory().run(sampling_params, **fields)


def row(task_id: str | None = TASK_ID) -> dict[str, Any]:
    """The fields verl's `RLHFDataset` hands `run` for one row."""
    return {"raw_prompt": [{"role": "system", "content": "Solve it."}], "extra_info": {"task_id": task_id} if task_id else {}}


def hermes(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_a_trajectory_reaches_submit_with_model_tokens_masked_in_and_tool_tokens_out(service: RunningService, tokenizer: Any) -> None:
    replies = [
        "Let me look.\n<function=bash>\n<parameter=command>\ncat missing.txt\n</parameter>\n</function>",  # Qwen3-coder XML
        "Writing it.\n" + hermes("write_file", {"path": "solution.py", "content": SOLUTION}) + hermes("run_tests", {}),
        "Done.\n" + hermes("submit", {}),
    ]
    server = ScriptedServer(tokenizer, replies)
    before = open_sessions(service.url)
    output = asyncio.run(play(lambda: make_loop(service, server, tokenizer), {"temperature": 1.0}, **row()))

    assert output.reward_score == 1.0 and output.num_turns == 1 + 3 + 2
    log = output.extra_fields["coding_env"]
    assert [c["tool_name"] for c in log["calls"]] == ["bash", "write_file", "run_tests", "submit"]
    assert log["calls"][0]["error_kind"] == "file_not_found" and log["calls"][0]["hint"]
    assert log["tests_passed"] == log["tests_total"] > 0 and not log["submitted_by_integration"]

    assert len(set(server.request_ids)) == 1  # one id per trajectory: verl keeps it on one server (prefix cache)
    # Each turn's prompt is the previous one plus what came after it: one growing token sequence.
    assert server.prompts[0] == output.prompt_ids
    sequence = output.prompt_ids + output.response_ids
    for prompt in server.prompts[1:]:
        assert sequence[: len(prompt)] == prompt
    # Mask 1 is exactly the model's tokens, in order; mask 0 holds the service's observations.
    assert len(output.response_mask) == len(output.response_ids)
    model_tokens = [t for t, m in zip(output.response_ids, output.response_mask) if m == 1]
    assert model_tokens == [t for generated in server.generated for t in generated]
    tool_text = tokenizer.decode([t for t, m in zip(output.response_ids, output.response_mask) if m == 0])
    assert "missing.txt" in tool_text and "<tool_call>" not in tool_text
    assert log["calls"][0]["hint"] not in tool_text  # hints are the trainer's, not the policy's
    assert open_sessions(service.url) == before


def test_a_row_of_an_exported_suite_is_played_as_verl_reads_it(service: RunningService, tokenizer: Any, tmp_path: Path) -> None:
    """`coding-env tasks export --format parquet`, read by verl's own RLHFDataset, played by the loop."""
    assert tasks_cli.main(["tasks", "export", "--suite", "builtin", "--format", "parquet", "--out", str(tmp_path)]) == 0
    dataset = RLHFDataset(str(tmp_path / "builtin.parquet"), tokenizer, OmegaConf.create({"max_prompt_length": 2048, "filter_overlong_prompts": False}))
    fields = next(dataset[i] for i in range(len(dataset)) if dataset[i]["extra_info"]["task_id"] == TASK_ID)
    assert fields["agent_name"] == AGENT_NAME
    replies = ["Writing it.\n" + hermes("write_file", {"path": "solution.py", "content": SOLUTION}) + hermes("submit", {})]
    output = asyncio.run(play(lambda: make_loop(service, ScriptedServer(tokenizer, replies), tokenizer), {"temperature": 1.0}, **fields))
    assert output.reward_score == 1.0 and output.extra_fields["coding_env"]["task_id"] == TASK_ID


def test_at_the_turn_budget_the_loop_submits_for_the_policy(service: RunningService, tokenizer: Any) -> None:
    server = ScriptedServer(tokenizer, ["I think the answer is 42."])
    output = asyncio.run(play(lambda: make_loop(service, server, tokenizer, max_turns=1), {}, **row()))
    log = output.extra_fields["coding_env"]
    assert [(c["tool_name"], c["error_kind"]) for c in log["calls"]] == [("", "tool_not_found"), ("submit", None)]
    assert log["calls"][0]["hint"]
    assert log["submitted_by_integration"] and log["done"] and output.reward_score == 0.0
    assert len(server.prompts) == 1 and output.response_mask == [1] * len(server.generated[0])


def test_at_the_response_length_the_loop_stops_submits_and_truncates(service: RunningService, tokenizer: Any) -> None:
    server = ScriptedServer(tokenizer, ["Looking around first.\n" + hermes("bash", {"command": "ls"})])
    output = asyncio.run(play(lambda: make_loop(service, server, tokenizer, response_length=8), {}, **row()))
    log = output.extra_fields["coding_env"]
    assert [c["tool_name"] for c in log["calls"]] == ["bash", "submit"] and log["submitted_by_integration"]
    assert len(server.generated[0]) > 8 and output.response_ids == server.generated[0][:8] and output.response_mask == [1] * 8


def test_a_rollout_cancelled_while_the_model_thinks_leaves_no_session(service: RunningService, tokenizer: Any) -> None:
    server = ScriptedServer(tokenizer, [hermes("bash", {"command": "ls"})], hang_at=2)
    before = open_sessions(service.url)

    async def drop_midway() -> None:
        rollout = asyncio.create_task(play(lambda: make_loop(service, server, tokenizer), {}, **row()))
        await server.reached.wait()  # one step ran; the model is thinking over its 2nd turn
        assert await asyncio.to_thread(open_sessions, service.url) == before + 1
        rollout.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rollout

    asyncio.run(drop_midway())
    assert open_sessions(service.url) == before


def test_a_row_without_a_task_id_is_refused_before_any_session(service: RunningService, tokenizer: Any) -> None:
    before = open_sessions(service.url)
    with pytest.raises(ValueError, match="task_id"):
        asyncio.run(play(lambda: make_loop(service, ScriptedServer(tokenizer, []), tokenizer), {}, **row(None)))
    assert open_sessions(service.url) == before
