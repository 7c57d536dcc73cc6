"""`coding-train hint-uptake` end to end: a real (tiny random) policy's episodes through the real service,
every source's sites scored, and the reference read by the teacher alone (decision 129)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import PRIVILEGED_TOKEN, SERVICE_TOKEN
from trainer_client.cli import main
from trainer_client.call_tokens import TurnTokenClasses
from trainer_client.hint_sites import HintTemplate, teacher_row
from trainer_client.hint_uptake import SiteScore, episode_sites, read_episodes, score_episode, uptake_table
from trainer_client.losses import generalized_jsd
from trainer_client.policy import PolicySpec, load_policy

pytestmark = pytest.mark.docker

REFERENCE_MARK = "'Fizz' * (n % 3 == 0)"
"""A line only fizzbuzz's reference solution has (`builtin.py`)."""


def test_the_command_scores_each_source_and_the_policy_never_reads_the_reference(service_url: str, tmp_path: Path, tokenizer) -> None:
    out = tmp_path / "uptake"
    common = ["--model", "tiny-random", "--sources", "template", "raw_error", "sibling", "reference", "--out", str(out)]
    assert main([
        "hint-uptake", *common, "--env-url", service_url, "--api-token", SERVICE_TOKEN, "--privileged-token", PRIVILEGED_TOKEN,
        "--suite", "builtin", "--split", "all", "--id-prefix", "builtin/fizzbuzz", "--n", "2", "--max-turns", "2",
        "--max-new-tokens", "16", "--max-completion-length", "64", "--concurrency", "2",
    ]) == 0
    episodes = read_episodes(out / "episodes.jsonl")
    assert len(episodes) == 2 and not any(episode.passed for episode in episodes)  # a random model solves nothing
    sites = [json.loads(line) for line in (out / "sites.jsonl").read_text().splitlines()]
    by_source = {source: [site for site in sites if site["source"] == source] for source in ("template", "reference", "sibling")}
    assert by_source["template"] and by_source["reference"] and not by_source["sibling"]  # no sibling passed
    assert {site["placement"] for site in sites} == {"before_turn", "after_prompt"}
    assert all(REFERENCE_MARK in site["message"] for site in by_source["reference"])
    for episode in episodes:  # every token the policy was sampled on or produced
        assert REFERENCE_MARK not in tokenizer.decode(episode.context)
    report = json.loads((out / "uptake.json").read_text())
    rows = {(row["source"], row["placement"]): row for row in report["rows"]}
    assert rows[("reference", "after_prompt")]["failing"]["sites"] > 0
    assert rows[("reference", "after_prompt")]["failing"]["jsd"]["per_token"] > 0  # it reads something the student does not
    assert report["meta"]["episodes"] == 2 and "| reference | before_turn |" in (out / "uptake.md").read_text()
    # the saved episodes score again without the service
    again = tmp_path / "again"
    assert main(["hint-uptake", *common[:-1], str(again), "--episodes", str(out / "episodes.jsonl"),
                 "--suite", "builtin"]) == 0
    assert json.loads((again / "uptake.json").read_text())["rows"] == report["rows"]
    scored_as_plain_forwards(episodes)


def scored_as_plain_forwards(episodes: list) -> None:
    """Each site's teacher, run after the student's cropped keys and values, scores as its whole sequence run alone."""
    model, tokenizer = load_policy(PolicySpec(name="tiny-random"))
    model.eval()
    template = HintTemplate(tokenizer)
    episode = episodes[0]
    classes = TurnTokenClasses(tokenizer)
    scores = score_episode(model, episode, episodes, ["template", "reference"], ["before_turn", "after_prompt"], template, classes)
    assert scores
    prompt, completion = episode.context[: episode.prompt_length], episode.context[episode.prompt_length :]
    with torch.no_grad():
        student_logits = model(input_ids=torch.tensor([episode.context])).logits[0]
        expected = []
        for source in ("template", "reference"):
            sites = episode_sites(episode, episodes, source, template)
            for placement in ("before_turn", "after_prompt"):
                row = teacher_row(prompt, completion, sites, template.header_ids, placement)
                for site, continuation in zip(sites, row.continuations):
                    sequence = [*row.sequence(continuation.branch)[: continuation.cut], *continuation.token_ids]
                    turn = site.end - site.start
                    teacher = model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - turn - 1 : -1]
                    first = episode.prompt_length + site.start
                    student = student_logits[first - 1 : first - 1 + turn]
                    content = torch.tensor(classes.content_mask(completion[site.start : site.end]))
                    jsd = generalized_jsd(student, teacher, reduction="none")
                    expected.append((source, placement, site.turn, float(jsd.sum()), float(jsd[content].sum())))
    got = sorted((s.source, s.placement, s.turn, s.jsd, s.content_jsd) for s in scores)
    assert [key[:3] for key in got] == [key[:3] for key in sorted(expected)]
    for mine, theirs in zip(got, sorted(expected)):
        assert mine[3:] == pytest.approx(theirs[3:], rel=1e-3, abs=1e-4)


def test_the_table_splits_failing_from_passing_and_weighs_tasks_by_tokens() -> None:
    scores = [
        SiteScore("reference", "before_turn", False, "t1", 0, 0, "m", 10, 1.0, -2.0, 4, 0.5, -0.5),
        SiteScore("reference", "before_turn", False, "t2", 0, 0, "m", 30, 1.0, -6.0, 0, 0.0, 0.0),
        SiteScore("reference", "before_turn", True, "t1", 1, 0, "m", 5, 0.5, 0.0, 5, 0.5, 0.0),
    ]
    (row,) = uptake_table(scores)
    assert row["failing"]["sites"] == 2 and row["failing"]["tokens"] == 40
    assert row["failing"]["jsd"]["per_token"] == pytest.approx(2 / 40)
    assert row["failing"]["logp_change"]["per_token"] == pytest.approx(-8 / 40)
    assert row["passing"]["logp_change"]["per_token"] == 0.0
    content, schema = row["failing"]["by_tokens"]["content"], row["failing"]["by_tokens"]["schema"]
    assert content["tokens"] == 4 and content["logp_change"]["per_token"] == pytest.approx(-0.5 / 4)
    assert schema["tokens"] == 36 and schema["logp_change"]["per_token"] == pytest.approx(-7.5 / 36)
    assert row["passing"]["by_tokens"]["schema"]["tokens"] == 0 and row["passing"]["by_tokens"]["schema"]["jsd"]["per_token"] is None
