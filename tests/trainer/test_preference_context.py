"""DPO pairs in the rollout's own context: the service's tools, the same token prefix as a rollout of
the same state, chosen and rejected rendered alike, truncation that keeps the head of the context."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.trainer.conftest import make_config, make_trainer
from trainer_client.preferences import PreferenceBatches
from trainer_client.records import PreferencePair
from trainer_client.traces.tool_mapping import map_message, map_messages
from trainer_client.trl_rollout import rollout_token_ids


def schema(name: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The service's {name}.",
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string", "description": text} for key, text in properties.items()},
                "required": list(properties),
            },
        },
    }


SERVICE_TOOLS = [schema("bash", command="Shell command."), schema("read_file", path="File path."), schema("submit")]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def result(name: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "name": name, "content": text}


EPISODE = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in calc.py."},
    call("bash", command="ls"),
    result("bash", "calc.py\ntest_calc.py"),
    call("read_file", path="calc.py"),
    result("read_file", "def add(a, b):\n    return a - b\n"),
    call("submit"),
    result("submit", "Submitted: reward 0.000."),
    {"role": "assistant", "content": "Done."},
]


def test_a_pair_and_a_rollout_of_the_same_state_share_their_token_prefix(tokenizer) -> None:
    ids, _ = rollout_token_ids(tokenizer, EPISODE, SERVICE_TOOLS)
    pair = PreferencePair(state_id="s", messages=EPISODE[:4], chosen=EPISODE[4], rejected=call("bash", command="cat calc.py"))
    (tokenized,) = PreferenceBatches([pair], tokenizer, batch_size=1, max_length=4096, tools=SERVICE_TOOLS).pairs
    assert [*tokenized.context_ids, *tokenized.chosen_ids] == ids[: len(tokenized.context_ids) + len(tokenized.chosen_ids)]
    assert '"name": "read_file"' in tokenizer.decode(tokenized.context_ids)  # the tools are in the context
    # a pair carrying its own tools renders with them, whatever the trainer's default
    own = pair.model_copy(update={"tools": SERVICE_TOOLS})
    assert PreferenceBatches([own], tokenizer, batch_size=1, max_length=4096).pairs[0] == tokenized


def test_truncation_drops_the_oldest_exchanges_and_keeps_the_system_prompt_tools_and_task(tokenizer) -> None:
    history = [*EPISODE[:2]]
    for index in range(30):
        history += [call("bash", command=f"echo step {index}"), result("bash", f"step {index} " * 20)]
    pair = PreferencePair(state_id="long", messages=history, chosen=call("submit"), rejected=call("bash", command="ls"))
    full = PreferenceBatches([pair], tokenizer, batch_size=1, max_length=100_000, tools=SERVICE_TOOLS).pairs[0]
    cut = PreferenceBatches([pair], tokenizer, batch_size=1, max_length=len(full.context_ids) // 2, tools=SERVICE_TOOLS).pairs[0]
    text = tokenizer.decode(cut.context_ids)
    assert len(cut.context_ids) + len(cut.chosen_ids) <= len(full.context_ids) // 2
    assert text.startswith(tokenizer.decode(full.context_ids[:50]))  # the head: system prompt and tools
    assert "Fix the failing test in calc.py." in text and '"name": "submit"' in text
    assert "step 0 " not in text and "step 29 " in text  # the oldest turns went, the latest stayed
    assert text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="system prompt, tools, task and action alone exceed"):
        PreferenceBatches([pair], tokenizer, batch_size=1, max_length=60, tools=SERVICE_TOOLS)


def test_trace_tools_are_mapped_onto_the_services() -> None:
    claude = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should look at the file.",
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "Read", "arguments": json.dumps({"file_path": "calc.py", "offset": 3, "limit": 5})}}],
    }
    mapped = map_message("claude_code", claude)
    assert "reasoning_content" not in mapped  # chosen and rejected are rendered alike: reasoning on neither
    function = mapped["tool_calls"][0]["function"]
    assert function["name"] == "read_file" and json.loads(function["arguments"]) == {"path": "calc.py", "start_line": 3, "end_line": 7}

    def one(source: str, name: str, **arguments: Any) -> Any:
        message = map_message(source, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]})
        return None if message is None else (message["tool_calls"][0]["function"]["name"], json.loads(message["tool_calls"][0]["function"]["arguments"]))

    assert one("claude_code", "Bash", command="pytest -q", timeout=120000) == ("bash", {"command": "pytest -q", "timeout_s": 120.0})
    assert one("claude_code", "Edit", file_path="a.py", old_string="-", new_string="+") == ("edit_file", {"path": "a.py", "old_str": "-", "new_str": "+"})
    assert one("claude_code", "Edit", file_path="a.py", old_string="-", new_string="+", replace_all=True) is None
    assert one("claude_code", "TodoWrite", todos=[]) is None
    assert one("openhands", "str_replace_editor", command="create", path="b.py", file_text="x = 1\n") == ("write_file", {"path": "b.py", "content": "x = 1\n"})
    assert one("openhands", "str_replace_editor", command="view", path="b.py", view_range=[2, -1]) == ("read_file", {"path": "b.py", "start_line": 2})
    assert one("openhands", "str_replace_editor", command="undo_edit", path="b.py") is None
    assert one("openhands", "execute_bash", command="ls", is_input=True) is None
    assert one("openhands", "finish", message="done") == ("submit", {})
    assert one("swe_smith", "bash", command="python -m pytest") == ("bash", {"command": "python -m pytest"})
    assert one("coding_env", "run_tests") == ("run_tests", {})
    # one unmappable call makes the whole history unmappable
    assert map_messages("claude_code", [{"role": "user", "content": "hi"}, claude]) is not None
    assert map_messages("claude_code", [claude, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "WebFetch", "arguments": "{}"}}]}]) is None


def test_a_mistake_pair_carries_the_demos_tools_and_its_rollouts_prefix(tokenizer) -> None:
    from env_server.tasks import default_registry
    from trainer_client.demos import Demo, expert_steps, mistake_pair

    task = default_registry().get("builtin/fix_median")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix median."}]
    for step in expert_steps(task, "missing_file"):
        messages += [call(step.tool, **step.arguments), result(step.tool, "ok")]
    demo = Demo(task_id=task.id, mistake="missing_file", messages=messages[1:], tools=json.dumps(SERVICE_TOOLS), reward=1.0, error_kinds=[])
    pair = mistake_pair(task, demo)
    assert pair.tools == SERVICE_TOOLS
    ids, _ = rollout_token_ids(tokenizer, demo.messages, SERVICE_TOOLS)
    (tokenized,) = PreferenceBatches([pair], tokenizer, batch_size=1, max_length=8192).pairs
    rejected_rollout = [*tokenized.context_ids, *tokenized.rejected_ids]  # the demo made the mistake: its own turn
    assert rejected_rollout == ids[: len(rejected_rollout)]


def test_a_pair_opens_with_the_rollouts_system_prompt_not_the_traced_agents(tmp_path, tokenizer, base_model) -> None:
    """Replayed states carry the traced agent's system prompt (or ingestion's generic one); rollouts start
    from the training prompt's, or from none and the template's default. The pair takes the rollouts'."""
    task = {"role": "user", "content": "Fix the failing test in calc.py."}
    pair = PreferencePair(state_id="s", messages=EPISODE[:4], chosen=EPISODE[4], rejected=call("bash", command="cat calc.py"))
    for system in ([], [{"role": "system", "content": "You train on coding tasks."}]):
        ids, _ = rollout_token_ids(tokenizer, [*system, task, *EPISODE[2:]], SERVICE_TOOLS)
        (tokenized,) = PreferenceBatches([pair], tokenizer, batch_size=1, max_length=4096, tools=SERVICE_TOOLS, system_messages=system).pairs
        assert [*tokenized.context_ids, *tokenized.chosen_ids] == ids[: len(tokenized.context_ids) + len(tokenized.chosen_ids)]
        assert "You are a coding agent." not in tokenizer.decode(tokenized.context_ids)
    # the trainer takes them from its training prompts ("rollout", the default), or keeps the trace's
    for setting, kept in (("rollout", False), ("trace", True)):
        config = make_config(tmp_path, dpo_weight=1.0, dpo_system_prompt=setting)
        trainer = make_trainer(base_model, tokenizer, config, preference_pairs=[pair])  # prompts: one user message
        assert ("You are a coding agent." in tokenizer.decode(trainer.dpo.preferences.pairs[0].context_ids)) == kept
    with pytest.raises(ValueError, match="dpo_system_prompt"):
        make_config(tmp_path, dpo_weight=1.0, dpo_system_prompt="agent")
