"""DPO scores a pair where its two actions differ, not the ending they share (decision 134), on SmolLM2's real
tokenizer."""

from __future__ import annotations

import pytest

from tests.trainer.conftest import make_config
from trainer_client.preferences import PreferenceBatches, without_common_ending
from trainer_client.records import PreferencePair


def write_file(content: str) -> dict:
    arguments = {"path": "helpers.py", "content": content}
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "write_file", "arguments": arguments}}]}


SIGNATURE = "def select_items(xs: list[int]) -> list[int]"
BODY = "\n    return [x for x in xs if x % 2 == 0]\n"
# The warm start's demos make this mistake on purpose: the missing colon (a `mistake_pair`).
MISSING_COLON = PreferencePair(
    state_id="warmup/l1/0001#2",
    messages=[{"role": "user", "content": "Implement select_items in helpers.py."}],
    chosen=write_file(SIGNATURE + ":" + BODY),
    rejected=write_file(SIGNATURE + BODY),
)


def test_the_shared_ending_of_an_edit_is_not_scored(tokenizer) -> None:
    (whole,) = PreferenceBatches([MISSING_COLON], tokenizer, batch_size=1, max_length=4096, tokens="all").pairs
    (cut,) = PreferenceBatches([MISSING_COLON], tokenizer, batch_size=1, max_length=4096).pairs
    assert cut.context_ids == whole.context_ids
    assert whole.chosen_ids[: len(cut.chosen_ids)] == cut.chosen_ids
    assert whole.rejected_ids[: len(cut.rejected_ids)] == cut.rejected_ids
    dropped = whole.chosen_ids[len(cut.chosen_ids) :]
    assert dropped == whole.rejected_ids[len(cut.rejected_ids) :]  # what is not scored, both actions end with
    assert cut.chosen_ids[-1] != cut.rejected_ids[-1]  # what is scored ends where they still differ
    # What is scored: the call up to the signature, with its colon or without (the token that ends each holds
    # the escaped newline's backslash); the function's body, which both actions write, is not.
    assert tokenizer.decode(cut.chosen_ids).endswith(SIGNATURE + ":\\")
    assert tokenizer.decode(cut.rejected_ids).endswith(SIGNATURE + "\\")
    assert "return [x for x in xs if x % 2 == 0]" in tokenizer.decode(dropped)


def test_each_action_keeps_the_token_where_the_two_part() -> None:
    # an insertion: the rejected action only lacks a token; its next token is where it chose otherwise
    assert without_common_ending([1, 2, 9, 3, 4], [1, 2, 3, 4]) == ((1, 2, 9), (1, 2, 3))
    assert without_common_ending([1, 2, 3, 4], [1, 2, 9, 3, 4]) == ((1, 2, 3), (1, 2, 9))
    # different actions that share only the call's closing tokens
    assert without_common_ending([5, 6, 7, 0], [8, 0]) == ((5, 6, 7), (8,))
    # nothing in common at the end, or nothing different at all: both whole
    assert without_common_ending([1, 2, 3], [1, 4, 5]) == ((1, 2, 3), (1, 4, 5))
    assert without_common_ending([1, 2], [1, 2]) == ((1, 2), (1, 2))


def test_the_trainer_scores_the_differing_tokens_unless_told_all(tmp_path) -> None:
    assert make_config(tmp_path, dpo_weight=1.0).dpo_tokens == "differing"
    assert make_config(tmp_path, dpo_weight=1.0, dpo_tokens="all").dpo_tokens == "all"
    with pytest.raises(ValueError, match="dpo_tokens"):
        make_config(tmp_path, dpo_weight=1.0, dpo_tokens="edit")
