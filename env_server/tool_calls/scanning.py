"""Bounded forward scans: the call markers of a message, each with the region it owns.

A family reads each call from its marker up to the next marker at most (the repair fallbacks
never look past it), so the regions are disjoint and a message costs one pass however many
markers it holds; the exact JSON reader alone may read past the next marker (a closing token
quoted in code), and markers inside what it read are skipped.
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Iterator

from env_server.tool_calls import budget

MAX_CALLS_PER_MESSAGE = 64
"""Call markers read from one message, and calls returned from it, at most (the service runs
far fewer calls per step than this)."""


def markers(pattern: re.Pattern[str], text: str) -> Iterator[tuple[re.Match[str], int]]:
    """The first MAX_CALLS_PER_MESSAGE matches of `pattern` in `text`, each with where its region
    ends (the next match's start, or the end of the text); the time budget is checked at each."""
    found = islice(pattern.finditer(text), MAX_CALLS_PER_MESSAGE + 1)
    match = next(found, None)
    for _ in range(MAX_CALLS_PER_MESSAGE):
        if match is None:
            return
        budget.check()
        following = next(found, None)
        yield match, following.start() if following is not None else len(text)
        match = following


def segment(text: str, start: int, end_pattern: re.Pattern[str], stop: int | None = None) -> str:
    """`text` from `start` to the next match of `end_pattern` before `stop` (or to `stop`, by
    default the end of the text)."""
    stop = len(text) if stop is None else stop
    end = end_pattern.search(text, start, stop)
    return text[start : end.start() if end else stop]


class ForwardSearch:
    """Repeated searches for one pattern from positions that only move forward, in one pass in
    all: a search from a position before the last match found returns that match again, and
    after a search that found nothing every later one finds nothing without scanning."""

    def __init__(self, pattern: re.Pattern[str], text: str, stop: int | None = None) -> None:
        self._pattern, self._text = pattern, text
        self._stop = len(text) if stop is None else stop
        self._searched_from = self._stop + 1
        self._found: re.Match[str] | None = None

    def search(self, pos: int) -> re.Match[str] | None:
        """The first match starting at `pos` or later (before the stop)."""
        reusable = pos >= self._searched_from and (self._found is None or pos <= self._found.start())
        if not reusable:
            self._searched_from, self._found = pos, self._pattern.search(self._text, pos, self._stop)
        return self._found
