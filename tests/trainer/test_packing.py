"""Packed rows (`trainer_client.packing`, decision 075): a context run once for several continuations
scores each continuation exactly as it would be scored alone: a DPO pair's two actions, a rollout's
hinted turns for the SDPO teacher."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import MistralConfig, Qwen2Config

from env_server.models import ErrorKind
from tests.trainer.conftest import bash_call, build_batch, expected_pair_logps, make_config, make_trainer, preference_pairs, teacher_sequence
from trainer_client.hint_sites import TurnFailure, TurnReport, locate_hint_sites, teacher_row
from trainer_client.packing import Continuation, PackedRow, add_context, pack, shares_enough, takes_shared_prefixes
from trainer_client.records import PreferencePair


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_shared_prefix_scores_each_action_as_if_alone(tmp_path, tokenizer, base_model, attention: str) -> None:
    """One row per pair (the context run once, the rejected action masked from the chosen one) gives
    the log-probs and gradients of one row per sequence, and of each sequence run alone."""
    model = copy.deepcopy(base_model)
    model.set_attn_implementation(attention)
    longer = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in stats.py, then submit."},
    ]
    other = PreferencePair(state_id="long", messages=longer, chosen=bash_call("cat stats.py"), rejected=bash_call("rm -rf tests"))
    pairs = [*preference_pairs(), other]  # contexts and actions of different lengths: rows are padded
    trainer = make_trainer(model, tokenizer, make_config(tmp_path, dpo_weight=1.0), preference_pairs=pairs)
    assert trainer.shared_prefixes
    preferences, causal_lm = trainer.dpo.preferences, trainer.model
    indices = list(range(len(pairs)))

    def logps_and_gradients(shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
        causal_lm.zero_grad()
        batch = preferences.collate(indices, tokenizer.pad_token_id, shared_prefix=shared)
        # packed: one row, a prefix tree: the system prompt once, the longer context branching off it (079)
        assert batch.input_ids.size(0) == (1 if shared else 2 * len(pairs))
        logps = trainer.dpo.sequence_logps(causal_lm, batch)
        (logps * torch.arange(1.0, logps.numel() + 1)).sum().backward()  # unequal weights: a leak shows in the gradients
        return logps.detach(), torch.cat([parameter.grad.flatten() for parameter in causal_lm.parameters()])

    shared, shared_gradients = logps_and_gradients(True)
    separate, separate_gradients = logps_and_gradients(False)
    torch.testing.assert_close(shared, separate, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shared.view(-1, 2), expected_pair_logps(causal_lm, preferences), rtol=1e-4, atol=1e-4)
    # equal up to float summation order (a rejected action that saw the chosen one differs by ~100%)
    assert (shared_gradients - separate_gradients).norm() < 1e-5 * separate_gradients.norm()


def test_models_that_slide_a_window_or_use_flash_attention_take_one_row_per_sequence() -> None:
    assert takes_shared_prefixes(Qwen2Config(_attn_implementation="sdpa"))
    assert not takes_shared_prefixes(Qwen2Config(_attn_implementation="flash_attention_2"))
    assert not takes_shared_prefixes(MistralConfig(_attn_implementation="sdpa"))  # sliding_window 4096


def test_a_rollouts_hint_sites_share_its_context_in_the_teacher(tmp_path, tokenizer, base_model) -> None:
    """Two sites of one rollout (turn 1's context holds turn 0 unhinted): one packed row gives each
    site's teacher logits from its own full forward."""
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    assert trainer.shared_prefixes
    inputs = build_batch(trainer, tokenizer, hinted=[True])
    prompt = inputs["prompt_ids"][0][inputs["prompt_mask"][0].bool()].tolist()
    completion = inputs["completion_ids"][0].tolist()
    mask = (inputs["completion_mask"][0] * inputs["tool_mask"][0]).tolist()
    reports = [
        TurnReport(1, (TurnFailure(ErrorKind.COMMAND_NOT_FOUND, "`pytset` is not a command."),)),
        TurnReport(0, (TurnFailure(ErrorKind.NO_TOOL_CALL, "Call a tool."),)),
    ]
    sites = locate_hint_sites(reports, mask, trainer._hint_template)
    assert [site.turn for site in sites] == [0, 1]
    row = teacher_row(prompt, completion, sites, trainer._hint_template.header_ids)
    batch = pack([row], tokenizer.pad_token_id, shared=True)
    assert batch.input_ids.size(0) == 1  # one row for both sites
    turns = [site.end - site.start for site in sites]
    with torch.no_grad():
        packed = trainer.sdpo.teacher_logits([row], turns)
        expected = torch.cat(
            [
                trainer.model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - turn - 1 : -1]
                for sequence, turn in (
                    (teacher_sequence(prompt, completion, site, trainer._hint_template.header_ids), turn)
                    for site, turn in zip(sites, turns, strict=True)
                )
            ]
        )
    torch.testing.assert_close(packed, expected, rtol=1e-4, atol=1e-4)


def test_a_packed_row_masks_each_continuation_from_the_others() -> None:
    row = PackedRow([10, 11, 12, 13], [Continuation(2, [20, 21]), Continuation(4, [30])])
    batch = pack([row], pad_token_id=0, shared=True)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 20, 21, 30]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 4]]  # each continuation goes on from its cut
    sees = batch.attention_mask[0].int().tolist()
    assert sees[4] == [1, 1, 0, 0, 1, 0, 0]  # cut at 2: the context before the cut and itself
    assert sees[5] == [1, 1, 0, 0, 1, 1, 0]
    assert sees[6] == [1, 1, 1, 1, 0, 0, 1]  # never the other continuation
    assert batch.predictors(0, 0) == [1, 4] and batch.predictors(0, 1) == [3]
    separate = pack([row], pad_token_id=0, shared=False)
    assert separate.input_ids.tolist() == [[10, 11, 20, 21, 0], [10, 11, 12, 13, 30]]
    assert separate.predictors(0, 0) == [1, 2] and separate.predictors(0, 1) == [3]
    assert batch.token_count() == 7 and separate.token_count() == 4 + 5  # padding left out
    with pytest.raises(ValueError):
        pack([PackedRow([10], [Continuation(0, [20])])], pad_token_id=0, shared=True)


def test_a_branch_sees_what_it_follows_and_its_continuations_see_the_branch() -> None:
    """A prefix tree in one row (decision 079): a second context parts from the first after two tokens."""
    row = PackedRow(
        [10, 11, 12],
        [Continuation(3, [30]), Continuation(4, [40, 41], branch=0)],
        branches=[Continuation(2, [20, 21])],
    )
    batch = pack([row], pad_token_id=0, shared=True)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21, 30, 40, 41]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 2, 3, 3, 4, 5]]
    sees = batch.attention_mask[0].int().tolist()
    assert sees[3] == [1, 1, 0, 1, 0, 0, 0, 0]  # the branch: the context before its cut, and itself
    assert sees[5] == [1, 1, 1, 0, 0, 1, 0, 0]  # the context's continuation: never the branch
    assert sees[7] == [1, 1, 0, 1, 1, 0, 1, 1]  # the branch's continuation: the branch's whole sequence
    assert batch.predictors(0, 0) == [2] and batch.predictors(0, 1) == [4, 6]
    assert row.sequence(0) == [10, 11, 20, 21]
    separate = pack([row], pad_token_id=0, shared=False)
    assert separate.input_ids.tolist() == [[10, 11, 12, 30, 0, 0], [10, 11, 20, 21, 40, 41]]
    assert separate.predictors(0, 1) == [3, 4]
    for invalid in (
        PackedRow([10, 11], [Continuation(2, [30], branch=0)], branches=[Continuation(2, [20])]),  # cut where the branch starts
        PackedRow([10, 11], [Continuation(2, [30], branch=1)], branches=[Continuation(2, [20])]),  # no such branch
        PackedRow([10, 11], [], branches=[Continuation(2, [20])]),  # nothing to score
    ):
        with pytest.raises(ValueError):
            pack([invalid], pad_token_id=0, shared=True)


def test_adding_contexts_grows_a_prefix_tree() -> None:
    row = PackedRow([1, 2, 3], [Continuation(3, [9])])
    row = add_context(row, [1, 2, 3, 4, 5], [[8]])  # extends the context
    row = add_context(row, [1, 2, 3, 4, 6], [[7]])  # parts from that branch after 4
    row = add_context(row, [1, 2, 3, 4], [[5]])  # ends inside a branch: no branch of its own
    assert [(b.cut, list(b.token_ids), b.branch) for b in row.branches] == [(3, [4, 5], None), (4, [6], 0)]
    assert [(c.cut, c.branch) for c in row.continuations] == [(3, None), (5, 0), (5, 1), (4, 0)]
    batch = pack([row], pad_token_id=0, shared=True)
    assert batch.token_count() == len({1, 2, 3, 4, 5, 6}) + 4  # every distinct prefix once, then the actions
    separate = pack([row], pad_token_id=0, shared=False)
    assert separate.input_ids[:, :6].tolist() == [[1, 2, 3, 9, 0, 0], [1, 2, 3, 4, 5, 8], [1, 2, 3, 4, 6, 7], [1, 2, 3, 4, 5, 0]]
    assert shares_enough(row, [1, 2, 7, 7]) and not shares_enough(row, [1, 7, 7, 7])
    with pytest.raises(ValueError):
        add_context(row, [2, 3], [[1]])


@pytest.mark.parametrize(("sources", "chains"), [((), [None, 0]), (("template",), [None, None])], ids=["one-message", "two-messages"])
def test_a_message_after_the_prompt_is_read_before_every_turn_up_to_the_site(tmp_path, tokenizer, base_model, sources, chains) -> None:
    """`after_prompt` placement: the teacher reads the message right after the task prompt, then the rollout
    up to the site; packed (sites with one message share a chain of branches), it scores each site's turn
    as that whole sequence run alone does."""
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0, hint_placement="after_prompt"))
    assert not trainer.sdpo.reads_policy_cache  # its rows branch off the prompt: they run with their contexts
    inputs = build_batch(trainer, tokenizer, hinted=[True])
    prompt = inputs["prompt_ids"][0][inputs["prompt_mask"][0].bool()].tolist()
    completion = inputs["completion_ids"][0].tolist()
    mask = (inputs["completion_mask"][0] * inputs["tool_mask"][0]).tolist()
    reports = [TurnReport(1, ()), TurnReport(0, (TurnFailure(ErrorKind.NO_TOOL_CALL, "Call a tool."),))]
    sites = locate_hint_sites(reports, mask, trainer._hint_template, sources=sources, privileged="A reference solution: print(42)")
    assert [site.turn for site in sites] == [0, 1]  # privileged: the turn that acted without failing too
    header = trainer._hint_template.header_ids
    row = teacher_row(prompt, completion, sites, header, "after_prompt")
    # one chain per message: the message and the rollout up to its first site, then on to the next
    assert [branch.branch for branch in row.branches] == chains and row.branches[0].cut == len(prompt) - len(header)
    assert list(row.branches[0].token_ids) == [*sites[0].hint_ids, *header]
    turns = [site.end - site.start for site in sites]
    with torch.no_grad():
        packed = trainer.sdpo.teacher_logits([row], turns)
        expected = []
        for site, turn in zip(sites, turns):
            sequence = [*prompt[: len(prompt) - len(header)], *site.hint_ids, *header, *completion[: site.end]]
            expected.append(trainer.model(input_ids=torch.tensor([sequence])).logits[0, len(sequence) - turn - 1 : -1])
    torch.testing.assert_close(packed, torch.cat(expected), rtol=1e-4, atol=1e-4)


def test_the_raw_error_source_quotes_the_tool_answer_at_a_failed_turn(tmp_path, tokenizer, base_model) -> None:
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=1.0))
    inputs = build_batch(trainer, tokenizer, hinted=[True])
    mask = (inputs["completion_mask"][0] * inputs["tool_mask"][0]).tolist()
    reports = [TurnReport(1, (TurnFailure(ErrorKind.COMMAND_NOT_FOUND, "Did you mean pytest?"),)), TurnReport(0, ())]
    answers = ["bash: pytset: command not found", ""]
    (site,) = locate_hint_sites(reports, mask, trainer._hint_template, sources=("raw_error",), answers=answers)
    assert site.hints == ("The tool answered: bash: pytset: command not found",)  # not the template's hint
    (both,) = locate_hint_sites(reports, mask, trainer._hint_template, sources=("template", "raw_error"), answers=answers)
    assert both.hints == ("Did you mean pytest?", "The tool answered: bash: pytset: command not found")
