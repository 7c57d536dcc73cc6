"""Which tokens of an assistant turn are its tool call's schema, and which are what the call says.

A turn such as

    <tool_call>
    {"name": "write_file", "arguments": {"path": "utils.py", "content": "def f(x): ..."}}
    </tool_call><|im_end|>

has two kinds of token. The **schema** tokens are the envelope, the tool's name and the argument names:
which call this is. The **content** tokens are the argument values (inside their quotes) and any prose
outside a call: what the call says. `TurnTokenClasses.content_mask` tells them apart on the token ids the
policy sampled, and `content_sites` narrows hint sites to their content (decision 132): a teacher that
has read a privileged context, or that a submission failed, is in a state the student cannot observe,
and at the schema tokens (which tool now) that state is all it teaches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from trainer_client.hint_sites import HintSite

DistilledTokens = Literal["all", "content"]
"""Which tokens of a hint site's turn SDPO distils: every one, or its content (decision 132)."""

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


def _skip(text: str, position: int) -> int:
    while position < len(text) and text[position] in _WHITESPACE:
        position += 1
    return position


def _members(text: str, position: int) -> list[tuple[str, int, int]]:
    """`(key, value start, value end)` of each member of the JSON object at `text[position]`, and raises
    ValueError or IndexError where there is none (a call that does not parse)."""
    position = _skip(text, position)
    if text[position] != "{":
        raise ValueError("not an object")
    position = _skip(text, position + 1)
    members = []
    while text[position] != "}":
        key, position = _DECODER.raw_decode(text, position)
        if not isinstance(key, str):
            raise ValueError("a key that is not a string")
        position = _skip(text, position)
        if text[position] != ":":
            raise ValueError("no ':' after a key")
        start = _skip(text, position + 1)
        _, position = _DECODER.raw_decode(text, start)
        members.append((key, start, position))
        position = _skip(text, position)
        if text[position] == ",":
            position = _skip(text, position + 1)
    return members


def argument_value_spans(text: str, position: int) -> list[tuple[int, int]]:
    """Character spans of the argument values of the call object at `text[position]` (`{"name": ...,
    "arguments": {...}}`): a string's characters inside its quotes, any other value whole. Empty when the
    call does not parse or its arguments are not an object."""
    try:
        arguments = next(((start, end) for key, start, end in _members(text, position) if key == "arguments"), None)
        if arguments is None or text[arguments[0]] != "{":
            return []
        spans = []
        for _, start, end in _members(text, arguments[0]):
            spans.append((start + 1, end - 1) if text[start] == '"' else (start, end))
        return spans
    except (ValueError, IndexError):
        return []


class TurnTokenClasses:
    """Tells a turn's content tokens from its schema tokens, for one tokenizer and tool-call format."""

    def __init__(self, tokenizer: Any, tool_call_marker: str = "<tool_call>") -> None:
        self._tokenizer = tokenizer
        self._special_ids = frozenset(tokenizer.all_special_ids)
        self._opener = tool_call_marker
        self._closer = tool_call_marker[:1] + "/" + tool_call_marker[1:]  # `</tool_call>`

    def _decode(self, token_ids: Sequence[int]) -> tuple[str, list[int]]:
        """The turn's text, and where each token's text ends in it. Decoding prefixes (not tokens one by one)
        keeps a character that spans tokens whole; a token that ends inside one ends where the prefix's text does."""
        text, ends, reached = "", [], 0
        for count in range(1, len(token_ids) + 1):
            text = self._tokenizer.decode(list(token_ids[:count]), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            reached = max(reached, len(text.rstrip("\ufffd")))  # an incomplete UTF-8 sequence decodes to U+FFFD
            ends.append(reached)
        return text, ends

    def content_spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of a turn's content: its calls' argument values and the prose outside its calls."""
        spans, position = [], 0
        while position < len(text):
            opener = text.find(self._opener, position)
            prose_end = len(text) if opener < 0 else opener
            prose = text[position:prose_end]
            if prose.strip():
                start = position + len(prose) - len(prose.lstrip())
                spans.append((start, start + len(prose.strip())))
            if opener < 0:
                break
            body = opener + len(self._opener)
            closer = text.find(self._closer, body)
            spans += argument_value_spans(text, body)
            position = len(text) if closer < 0 else closer + len(self._closer)
        return spans

    def content_mask(self, token_ids: Sequence[int]) -> tuple[bool, ...]:
        """Per token of a turn, whether its text overlaps the turn's content; special tokens (end of turn) never do."""
        text, ends = self._decode(token_ids)
        spans = self.content_spans(text)
        mask, start = [], 0
        for token, end in zip(token_ids, ends):
            overlaps = any(low < end and start < high for low, high in spans)
            mask.append(overlaps and token not in self._special_ids)
            start = end
        return tuple(mask)


def content_sites(sites: Sequence[HintSite], completion_ids: Sequence[int], classes: TurnTokenClasses) -> list[HintSite]:
    """`sites` with their distilled tokens narrowed to content (decisions 132, 133), at every site: one whose
    turn failed for its form too, since a teacher distilled at the schema of a call the student already got
    wrong can confirm it (the whole-turn privileged arm taught `submit` where bash was meant, and its most
    common form failure is that very `submit` with bash's arguments). A site left with no content token (a
    `submit` without arguments, an unparsable call with no prose) is dropped: the form is GRPO's to learn,
    from the reward."""
    narrowed = []
    for site in sites:
        mask = classes.content_mask(completion_ids[site.start : site.end])
        if any(mask):
            narrowed.append(replace(site, token_mask=mask))
    return narrowed
