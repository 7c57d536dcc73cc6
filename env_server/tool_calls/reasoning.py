"""Reasoning blocks: removed before any family looks for calls, so a call written while thinking
is not a call."""

from __future__ import annotations

import re

# (opening, closing) of each family's reasoning block: DeepSeek R1, Qwen3, GLM, MiniMax, Nemotron
# and others write <think>; Kimi ◁think▷; Magistral [THINK]; Seed-OSS <seed:think>; Command A
# <|START_THINKING|>.
_TAGGED_BLOCKS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<seed:think>", "</seed:think>"),
    ("◁think▷", "◁/think▷"),
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
)


_ANALYSIS = re.compile(r"\s*analysis\b")


def strip_reasoning(text: str) -> str:
    """`text` without its reasoning blocks; find-based, one forward pass per kind of block."""
    for opening, closing in _TAGGED_BLOCKS:
        text = _strip_tagged(text, opening, closing)
    return _strip_analysis(text)


def _strip_tagged(text: str, opening: str, closing: str) -> str:
    # A lone closer first: the prompt opened the block (Qwen3, DeepSeek R1), so everything
    # before it is reasoning. Then closed blocks; an unclosed one runs to the end of the
    # message (the model was cut off while thinking).
    first_close, first_open = text.find(closing), text.find(opening)
    if first_close >= 0 and not 0 <= first_open < first_close:
        text = text[first_close + len(closing) :]
    kept: list[str] = []
    pos = 0
    while (start := text.find(opening, pos)) >= 0:
        kept.append(text[pos:start])
        end = text.find(closing, start + len(opening))
        pos = len(text) if end < 0 else end + len(closing)
    kept.append(text[pos:])
    return "".join(kept)


def _strip_analysis(text: str) -> str:
    """Without gpt-oss harmony's analysis messages: `<|channel|>analysis ... <|message|>` up to
    `<|end|>`, or up to (not including) the next `<|start|>`, or to the end."""
    kept: list[str] = []
    pos = search = 0
    while (start := text.find("<|channel|>", search)) >= 0:
        search = start + len("<|channel|>")
        if _ANALYSIS.match(text, search) is None:
            continue
        body = text.find("<|message|>", search)
        if body < 0:
            break  # no message follows this channel, nor any later one
        body += len("<|message|>")
        end, next_start = text.find("<|end|>", body), text.find("<|start|>", body)
        if end >= 0 and (next_start < 0 or end < next_start):
            stop = end + len("<|end|>")
        else:
            stop = next_start if next_start >= 0 else len(text)
        kept.append(text[pos:start])
        pos = search = stop
    kept.append(text[pos:])
    return "".join(kept)
