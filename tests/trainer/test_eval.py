"""`coding-train eval`: the estimators on numbers, episodes through the real service, the command end to end."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.trainer.conftest import SERVICE_TOKEN
from trainer_client.client import ClientSettings
from trainer_client.demos import play_demo
from trainer_client.environment import environment_factory
from trainer_client.evaluation import Episode, EvalSettings, Evaluator, bootstrap_interval, pass_at_k, summarize
from trainer_client.trl_rollout import rollout_token_ids


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 2), (6, 1, 3), (4, 0, 2), (4, 4, 1), (7, 3, 7), (10, 3, 1)])
def test_pass_at_k_is_the_chance_that_a_random_k_subset_holds_a_pass(n: int, c: int, k: int) -> None:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    exact = sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(exact)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_bootstrap_interval_of_constant_values_is_a_point() -> None:
    assert bootstrap_interval([0.5] * 10) == (0.5, 0.5)


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_units() -> None:
    rng = torch.Generator().manual_seed(0)
    small = torch.rand(20, generator=rng).tolist()
    large = small * 25
    low, high = bootstrap_interval(small)
    assert low < sum(small) / len(small) < high
    low_large, high_large = bootstrap_interval(large)
    assert high_large - low_large < (high - low) / 2
    assert bootstrap_interval(small, seed=1) == bootstrap_interval(small, seed=1)


def test_weighted_bootstrap_is_a_pooled_rate() -> None:
    # Two tasks: 3 of 3 turns valid, 0 of 1 valid; the pooled rate is 3/4, not the mean 1/2.
    assert bootstrap_interval([1.0, 0.0], [3, 1], level=0.0) == (0.75, 0.75)  # the median resample
    assert bootstrap_interval([1.0, 0.0], level=0.0) == (0.5, 0.5)
    assert bootstrap_interval([1.0, 1.0, 0.0], [3, 3, 0]) == (1.0, 1.0)  # a task without turns weighs nothing


class _ScriptedModel:
    """A `generate` that emits the turns of a script, per row: turn k after k assistant headers past the prompt's."""

    def __init__(self, tokenizer: Any, turns: list[list[int]]) -> None:
        self.device = torch.device("cpu")
        self._header = tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self._pad = tokenizer.pad_token_id
        self._turns = turns

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, **_: Any) -> Any:
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            real = [token for token, kept in zip(ids, mask) if kept]  # the batch's padding is masked out
            opened = sum(real[i : i + len(self._header)] == self._header for i in range(len(real)))
            rows.append(ids + self._turns[min(opened - 1, len(self._turns) - 1)][:max_new_tokens])
        width = max(map(len, rows))
        return SimpleNamespace(sequences=torch.tensor([row + [self._pad] * (width - len(row)) for row in rows]), past_key_values=None)


def _builtin(task_id: str) -> Any:
    from env_server.tasks import default_registry

    return default_registry().get(task_id)


@pytest.mark.docker
@pytest.mark.slow
def test_an_expert_passes_and_a_silent_model_fails(service_url: str, tokenizer: Any) -> None:
    factory = environment_factory(ClientSettings(base_url=service_url, api_token=SERVICE_TOKEN))
    environment = factory()
    try:
        demo = play_demo(environment, _builtin("builtin/reverse_words"), "command_typo")
    finally:
        environment._close()
    ids, mask = rollout_token_ids(tokenizer, demo.messages, json.loads(demo.tools))
    from trainer_client.hint_sites import assistant_turn_spans

    turns = [ids[start:end] for start, end in assistant_turn_spans(mask)]
    settings = EvalSettings(n=2, temperature=0.0, max_new_tokens=1024, max_completion_length=8192, concurrency=2)

    expert = Evaluator(_ScriptedModel(tokenizer, turns), tokenizer, factory, settings).run(["builtin/reverse_words"])
    report = summarize(expert, k=2)
    assert report["pass@1"]["value"] == 1.0 and report["mean_reward"]["value"] == 1.0
    # Every turn called a tool; the mistyped command is a failure the policy caused, not a malformed call.
    # (On a loaded machine a test run may also time out; that is the only other kind allowed.)
    assert report["valid_tool_call_rate"]["value"] == 1.0
    assert report["error_kinds"]["command_not_found"] == 2 and set(report["error_kinds"]) <= {"command_not_found", "timeout"}
    assert all(e.submitted for e in expert) and {e.turns for e in expert} == {len(turns) - 1}  # stops at submit

    silent = tokenizer.encode("I think the code is fine.<|im_end|>", add_special_tokens=False)
    idle = Evaluator(_ScriptedModel(tokenizer, [silent]), tokenizer, factory, settings).run(["builtin/reverse_words"])
    report = summarize(idle, k=2)
    # No call, no submission: the untouched workspace is not graded and the turn is a `no_tool_call`.
    assert report["pass@1"]["value"] == 0.0 and report["mean_reward"]["value"] == 0.0
    assert report["valid_tool_call_rate"]["value"] == 0.0
    assert report["error_kinds"] == {"no_tool_call": 2}


@pytest.mark.docker
@pytest.mark.slow
def test_eval_command_writes_report_and_figure(service_url: str, tmp_path: Path) -> None:
    from trainer_client.cli import main

    out = tmp_path / "eval"
    argv = ["eval", "--model", "tiny-random", "--env-url", service_url, "--api-token", SERVICE_TOKEN, "--suite", "builtin"]
    argv += ["--split", "all", "--limit", "2", "--n", "2", "--max-new-tokens", "8", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "eval.json").read_text())
    assert (report["tasks"], report["episodes"], report["n"]) == (2, 4, 2)
    for key in ("pass@1", "pass@2", "mean_reward", "valid_tool_call_rate"):
        low, high = report[key]["ci95"]
        assert low <= report[key]["value"] <= high
    assert sum(report["turns_per_episode"]["histogram"].values()) == 4
    assert report["seconds_per_task"] > 0 and not math.isnan(report["seconds"])
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # One transcript per episode, each the conversation from the task on.
    transcripts = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len(transcripts) == 4 and {t["sample"] for t in transcripts} == {0, 1}
    for one in transcripts:
        assert one["messages"][0]["role"] in ("system", "user") and one["messages"][-1]["role"] in ("assistant", "tool")
        assert sum(m["role"] == "assistant" for m in one["messages"]) == one["turns"]
    readable = sorted((out / "transcripts").glob("*.md"))
    assert len(readable) == 4 and all(path.read_text().startswith("# builtin/") for path in readable)
    assert "## assistant" in readable[0].read_text()


def test_ungraded_episodes_are_left_out_not_failed() -> None:
    episodes = [
        Episode("a", 0, reward=1.0, turns=2, valid_turns=2),
        Episode("a", 1, reward=None, turns=3, valid_turns=0),  # grading hit a sandbox fault
        Episode("b", 0, reward=0.0, turns=1, valid_turns=1, error_kinds=["test_failure"]),
        Episode("b", 1, reward=0.5, turns=1, valid_turns=0, error_kinds=["json_decode"]),
    ]
    report = summarize(episodes, k=2)
    assert (report["tasks"], report["episodes"], report["ungraded_episodes"]) == (2, 3, 1)
    assert report["pass@1"]["value"] == 0.5  # task a: 1 of 1 graded, task b: 0 of 2
    assert report["valid_tool_call_rate"]["value"] == 3 / 4
    assert report["error_kinds"] == {"test_failure": 1, "json_decode": 1}
    assert report["turns_per_episode"]["histogram"] == {1: 2, 2: 1}


@pytest.mark.parametrize("k", [1, 2])
def test_the_figure_names_each_rate_once_and_says_when_a_panel_is_empty(k: int, tmp_path: Path) -> None:
    from trainer_client.evaluation import plot

    episodes = [Episode("a", sample, reward=1.0, turns=2, valid_turns=2) for sample in range(k)]
    summary = summarize(episodes, k=k)
    assert summary["error_kinds"] == {}
    titles = plot(summary, tmp_path / "eval.png", k=k, title="t")
    assert titles == ["rates (95% bootstrap CI over tasks)", "error kinds (count)", "turns per episode"]
    assert (tmp_path / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
