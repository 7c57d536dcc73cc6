"""A turn's schema tokens against its content tokens, on SmolLM2's real tokenizer, and SDPO distilling only the
content of every site (decisions 132, 133)."""

from __future__ import annotations

import json

import pytest
import torch

from env_server.models import ErrorKind
from tests.trainer.conftest import build_batch, make_config, make_trainer, teacher_sequence
from trainer_client.call_tokens import TurnTokenClasses, argument_value_spans, content_sites
from trainer_client.hint_sites import HintSite
from trainer_client.losses import generalized_jsd


def turn(name: str, arguments: dict, prose: str = "") -> str:
    """A turn as SmolLM2's template renders an assistant tool call."""
    return prose + "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call><|im_end|>"


def content_of(tokenizer, text: str) -> tuple[str, str]:
    """The turn's content tokens and its schema tokens, each decoded as one text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    mask = TurnTokenClasses(tokenizer).content_mask(ids)
    content = tokenizer.decode([t for t, keep in zip(ids, mask) if keep])
    schema = tokenizer.decode([t for t, keep in zip(ids, mask) if not keep])
    return content, schema


def test_the_content_is_the_argument_values_and_the_schema_the_rest(tokenizer) -> None:
    source = 'def area(r: float) -> float:\n    return 3.14 * r * r\n'
    content, schema = content_of(tokenizer, turn("write_file", {"path": "geometry.py", "content": source}))
    assert content == "geometry.py" + json.dumps(source)[1:-1]  # the values as the call's JSON escapes them
    assert schema == '<tool_call>\n{"name": "write_file", "arguments": {"path": "", "content": ""}}\n</tool_call><|im_end|>'


def test_prose_is_content_and_a_call_without_arguments_has_none(tokenizer) -> None:
    content, _ = content_of(tokenizer, turn("bash", {"command": "pytest -q", "timeout": 30}, prose="Run the tests.\n"))
    assert content == "Run the tests.pytest -q30"
    content, schema = content_of(tokenizer, turn("submit", {}))
    assert content == "" and "submit" in schema


def test_a_character_split_across_tokens_is_classed_whole(tokenizer) -> None:
    text = turn("write_file", {"path": "names.py", "content": "NAME = '日本語 Zoë'\n"})
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # some token holds part of a character
    content, _ = content_of(tokenizer, text)
    assert content == "names.pyNAME = '日本語 Zoë'\\n"


@pytest.mark.parametrize("text", ['{"name": "bash", "arguments": {"command": "ls}}', '{"name": "bash", "arguments": "ls"}', "not json", ""])
def test_a_call_that_does_not_parse_has_no_argument_values(text: str) -> None:
    assert argument_value_spans(text, 0) == []


def site(start: int, end: int, *kinds: str) -> HintSite:
    return HintSite(turn=0, start=start, end=end, hints=("h",), hint_ids=(1,), error_kinds=kinds)


def test_every_site_is_narrowed_to_its_content_a_failed_form_too(tokenizer) -> None:
    classes = TurnTokenClasses(tokenizer)
    submit = tokenizer.encode(turn("submit", {}), add_special_tokens=False)
    misnamed = tokenizer.encode(turn("submit", {"command": "pytest -q"}), add_special_tokens=False)
    bash = tokenizer.encode(turn("bash", {"command": "pytset -q"}), add_special_tokens=False)
    completion = [*submit, *misnamed, *bash]
    ends = [len(submit), len(submit) + len(misnamed), len(completion)]
    wrong_submission = site(0, ends[0], ErrorKind.SUBMISSION_FAILED.value)
    no_content_malformed = site(0, ends[0], ErrorKind.TYPE_ERROR.value)
    # bash's arguments under submit's name: the teacher must not reach the name the student got wrong
    misnamed_call = site(ends[0], ends[1], ErrorKind.TYPE_ERROR.value)
    wrong_command = site(ends[1], ends[2], ErrorKind.COMMAND_NOT_FOUND.value)
    privileged = site(ends[1], ends[2])  # a turn that acted in a failed rollout: no failure of its own
    kept = content_sites([wrong_submission, no_content_malformed, misnamed_call, wrong_command, privileged], completion, classes)
    assert [(s.start, s.error_kinds) for s in kept] == [(ends[0], ("type_error",)), (ends[1], ("command_not_found",)), (ends[1], ())]
    for narrowed, turn_ids, content in zip(kept, (misnamed, bash, bash), ("pytest -q", "pytset -q", "pytset -q")):
        assert narrowed.token_mask is not None
        assert tokenizer.decode([t for t, keep in zip(turn_ids, narrowed.token_mask) if keep]) == content
        assert narrowed.distilled_tokens == sum(narrowed.token_mask) < len(turn_ids)


def test_sdpo_distils_only_a_narrowed_sites_tokens(tmp_path, tokenizer, base_model) -> None:
    """The recorded JSD per hint token is the plain forwards' JSD over the site's content tokens."""
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0, sdpo_normalizer="hint_tokens"))
    inputs = build_batch(trainer, tokenizer, hinted=[True])
    (whole,) = inputs["hint_sites"][0]
    completion = inputs["completion_ids"][0].tolist()
    (narrowed,) = content_sites([whole], completion, TurnTokenClasses(tokenizer))
    prompt = inputs["prompt_ids"][0].tolist()
    sequence = teacher_sequence(prompt, completion, whole, trainer._hint_template.header_ids)
    length = whole.end - whole.start
    trainer.model.train()
    with torch.no_grad():
        teacher = trainer.model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - length - 1 : -1]
        first = len(prompt) + whole.start
        student = trainer.model(input_ids=torch.tensor([[*prompt, *completion]])).logits[0, first - 1 : first - 1 + length]
        per_token = generalized_jsd(student, teacher, reduction="none")
        recorded = []
        for sites in ([whole], [narrowed]):
            tokens = sum(s.distilled_tokens for s in sites)
            trainer.compute_loss(trainer.model, {**inputs, "hint_sites": [sites], "hint_tokens": torch.tensor(tokens)})
            recorded.append((trainer._metrics["train"]["sdpo/jsd"][-1], trainer._metrics["train"]["sdpo/hint_tokens"][-1]))
    mask = torch.tensor(narrowed.token_mask)
    assert recorded[0] == pytest.approx((per_token.mean().item(), length), rel=1e-3)
    assert recorded[1] == pytest.approx((per_token[mask].mean().item(), mask.sum().item()), rel=1e-3)


def test_the_trainer_narrows_sites_unless_told_to_distil_whole_turns(tmp_path, tokenizer, base_model) -> None:
    assert make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))._token_classes is not None
    assert make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0, sdpo_tokens="all"))._token_classes is None
    with pytest.raises(ValueError, match="sdpo_tokens"):
        make_config(tmp_path, sdpo_tokens="arguments")
