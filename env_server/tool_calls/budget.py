"""The parse budget: how much one message may cost, in size, in time and in guesswork.

Every family's extraction is a bounded number of forward scans, but the lenient readers behind
them (json-repair, Python's tokenizer) are slow per character, so a message that sends them its
whole length at every marker is where parsing used to go super-linear. One budget per message
(docs/decisions/037-bounded-tool-call-parsing.md):

- size: a message longer than `max_message_chars` is refused before any scan;
- time: `check()` is called between scans (per marker, per JSON value, per fallback); past the
  deadline it raises, so the step answers a typed `json_decode` instead of hanging;
- guesswork: the characters handed to the lenient readers, their time (`run_lenient`, a
  watchdog that stops them) and the tokens the lossless repair walks, over the whole message,
  are capped; past the caps only the exact readers and the parameter-name cut run.
"""

from __future__ import annotations

import contextvars
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable, Iterator, TypeVar

from env_server.tool_calls.registry import ToolCallParseError

MAX_MESSAGE_CHARS = 8 * 1024 * 1024
"""Longest message parsed (twice the service's default 4 MiB body limit, so the limit that
bites on the wire is the body's)."""

PARSE_SECONDS = 2.0
"""Wall-clock seconds one message's parse may take. Linear parsing takes well under 1 s for a
4 MiB message; this is the backstop for what a budget of characters cannot foresee (a loaded host)."""

LENIENT_CHARS = 192 * 1024
"""Characters of one message that may go to the lenient readers (json-repair, the Python
literal reader), all calls together: at 0.5-1.5 µs a character, a few hundred ms at most.
Larger calls are read exactly, or cut out of the raw text at their parameter names."""

LENIENT_SECONDS = 0.25
"""Seconds of one message's parse the lenient readers may take, all calls together. json-repair
is super-linear on some shapes (8 KiB of `{"{"{"...` take seconds), so a character budget alone
cannot bound it: it runs under a watchdog that stops it when this time is spent."""

STRUCTURE_TOKENS = 20_000
"""Strings and brackets of one message that the lossless repair (trailing commas, truncation)
may walk, all calls together (~2 µs each); a truncated call has a few hundred."""


T = TypeVar("T")


class ToolCallBudgetError(ToolCallParseError):
    """The message exceeded the parse budget (size or time); the service answers `json_decode`."""


class _LenientTimeUp(BaseException):
    """Raised inside a lenient reader whose time is spent; a BaseException, so that no handler of
    the reader's own (`except Exception`, `except ValueError`) can swallow it."""


@dataclass
class ParseBudget:
    """What is left of one message's budget."""

    deadline: float
    lenient_chars: int = LENIENT_CHARS
    spent_lenient: int = 0
    lenient_seconds: float = LENIENT_SECONDS
    tokens_left: int = STRUCTURE_TOKENS

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise ToolCallBudgetError(
                f"Tool-call parsing stopped after {PARSE_SECONDS:g} s: the message is too costly to read. "
                "Hint: write fewer, smaller calls per message, as valid JSON (or the family's tags)."
            )

    def allow_lenient(self, chars: int) -> bool:
        """Whether `chars` more characters may go to a lenient reader; spends them if so."""
        if self.spent_lenient + chars > self.lenient_chars:
            return False
        self.spent_lenient += chars
        return True

    def run_lenient(self, read: Callable[[], T]) -> T | None:
        """`read()`, stopped (None) once the lenient readers' time or the deadline is spent.

        The watchdog is a trace function that sees every Python call the reader makes (json-repair
        makes several per character) and raises when time is up; it is this thread's alone, and
        whatever tracer was installed (a coverage tool) is put back after."""
        started = time.monotonic()
        stop_at = min(self.deadline, started + self.lenient_seconds)

        def watchdog(frame: FrameType, event: str, arg: Any) -> None:
            if time.monotonic() > stop_at:
                raise _LenientTimeUp

        previous = sys.gettrace()
        sys.settrace(watchdog)
        try:
            return read()
        except _LenientTimeUp:
            return None
        finally:
            sys.settrace(previous)
            self.lenient_seconds -= time.monotonic() - started

    def take_tokens(self, count: int) -> bool:
        """Spend `count` structure tokens; False (and nothing left) when fewer remain."""
        self.tokens_left -= count
        return self.tokens_left >= 0


_CURRENT: contextvars.ContextVar[ParseBudget | None] = contextvars.ContextVar("tool_call_parse_budget", default=None)


@contextmanager
def parse_budget(text: str) -> Iterator[ParseBudget]:
    """The budget of parsing `text`, current for the block; refuses an oversized text at once."""
    if len(text) > MAX_MESSAGE_CHARS:
        raise ToolCallBudgetError(
            f"The message has {len(text)} characters; tool calls are read from at most {MAX_MESSAGE_CHARS}. "
            "Hint: write large files in several calls."
        )
    budget = ParseBudget(deadline=time.monotonic() + PARSE_SECONDS)
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def current() -> ParseBudget:
    """The budget of the message being parsed; outside `parse_budget` (a call's arguments parsed
    alone), a fresh one with no deadline and the usual lenient allowance."""
    return _CURRENT.get() or ParseBudget(deadline=float("inf"))


def check() -> None:
    """Raise `ToolCallBudgetError` if the current message's time is up."""
    budget = _CURRENT.get()
    if budget is not None:
        budget.check()
