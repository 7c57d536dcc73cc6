"""A handful of small tasks that ship with the service: smoke tests for clients and CI.

Each has visible tests (the agent may run them, pytest) and hidden checks graded by call table
(`TaskSpec.hidden_calls`: the expected results never enter the sandbox) that probe cases the
visible ones do not, so passing the visible tests alone is not enough. Every hidden check fails
on the untouched workspace, so a bare task scores 0.
"""

from __future__ import annotations

from env_server.models import CallCheck, TaskSpec
from env_server.tasks import StaticSuite

SUITE = "builtin"

_FIZZBUZZ = TaskSpec(
    id="builtin/fizzbuzz",
    prompt=(
        "Implement `fizzbuzz(n: int) -> str` in solution.py: return 'Fizz' for multiples of 3, "
        "'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, else str(n)."
    ),
    files={"solution.py": "def fizzbuzz(n: int) -> str:\n    raise NotImplementedError\n"},
    visible_tests={
        "test_visible.py": (
            "from solution import fizzbuzz\n\n\n"
            "def test_three():\n    assert fizzbuzz(3) == 'Fizz'\n\n\n"
            "def test_plain():\n    assert fizzbuzz(1) == '1'\n"
        )
    },
    hidden_calls=[
        CallCheck.build("solution", "fizzbuzz", [n], expected=expected)
        for n, expected in [(5, "Buzz"), (15, "FizzBuzz"), (30, "FizzBuzz"), (9, "Fizz"), (7, "7"), (0, "FizzBuzz")]
    ],
    metadata={"solution": {"solution.py": (
        "def fizzbuzz(n: int) -> str:\n"
        "    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)\n"
    )}},
)

_REVERSE_WORDS = TaskSpec(
    id="builtin/reverse_words",
    prompt=(
        "Implement `reverse_words(text: str) -> str` in solution.py: reverse the order of the "
        "words; words are separated by runs of whitespace; the result joins them with one space."
    ),
    files={"solution.py": "def reverse_words(text: str) -> str:\n    raise NotImplementedError\n"},
    visible_tests={
        "test_visible.py": (
            "from solution import reverse_words\n\n\n"
            "def test_two_words():\n    assert reverse_words('hello world') == 'world hello'\n"
        )
    },
    hidden_calls=[
        CallCheck.build("solution", "reverse_words", [text], expected=expected)
        for text, expected in [("  a   b	c ", "c b a"), ("", ""), ("one", "one")]
    ],
    metadata={"solution": {"solution.py": (
        "def reverse_words(text: str) -> str:\n    return ' '.join(reversed(text.split()))\n"
    )}},
)

_FIX_MEDIAN = TaskSpec(
    id="builtin/fix_median",
    prompt=(
        "stats.py has a bug: `median` is wrong for lists of even length and mutates its "
        "argument. Fix it without changing its signature."
    ),
    files={"stats.py": (
        "def median(values: list[float]) -> float:\n"
        "    values.sort()\n"
        "    return values[len(values) // 2]\n"
    )},
    visible_tests={
        "test_visible.py": (
            "from stats import median\n\n\n"
            "def test_odd():\n    assert median([3, 1, 2]) == 2\n"
        )
    },
    # Every check fails on the untouched code: even lengths (wrong value), odd ones (it sorts
    # its argument in place, which `expected_args` catches).
    hidden_calls=[
        CallCheck.build("stats", "median", [values], expected=expected, expected_args=[values])
        for values, expected in [([4, 1, 3, 2], 2.5), ([1.0, 2.0], 1.5), ([3, 1, 2], 2), ([9, 8, 7, 6, 5], 7)]
    ],
    metadata={"solution": {"stats.py": (
        "def median(values: list[float]) -> float:\n"
        "    ordered = sorted(values)\n"
        "    middle = len(ordered) // 2\n"
        "    if len(ordered) % 2:\n"
        "        return ordered[middle]\n"
        "    return (ordered[middle - 1] + ordered[middle]) / 2\n"
    )}},
)

_WORD_COUNT = TaskSpec(
    id="builtin/word_count",
    prompt=(
        "Write `top_words(path: str, k: int) -> list[tuple[str, int]]` in counter.py: the k most "
        "frequent lower-cased words of the text file at `path` (words are runs of letters), "
        "most frequent first, ties broken alphabetically. `corpus.txt` is an example input."
    ),
    files={
        "counter.py": "def top_words(path: str, k: int) -> list[tuple[str, int]]:\n    raise NotImplementedError\n",
        "corpus.txt": "The cat and the hat. The end, and THE start!\n",
    },
    visible_tests={
        "test_visible.py": (
            "from counter import top_words\n\n\n"
            "def test_corpus():\n    assert top_words('corpus.txt', 1) == [('the', 4)]\n"
        )
    },
    # Each check reads a file only the grading workspace holds.
    hidden_files={".grader-data/ties.txt": "b a c b a d", ".grader-data/digits.txt": "it's 42 IT it"},
    hidden_calls=[
        CallCheck.build("counter", "top_words", [path, k], expected=expected)
        for path, k, expected in [
            (".grader-data/ties.txt", 3, [("a", 2), ("b", 2), ("c", 1)]),
            (".grader-data/digits.txt", 2, [("it", 3), ("s", 1)]),
        ]
    ],
    metadata={"solution": {"counter.py": (
        "import collections\nimport re\n\n\n"
        "def top_words(path: str, k: int) -> list[tuple[str, int]]:\n"
        "    with open(path) as handle:\n"
        "        counts = collections.Counter(re.findall('[a-z]+', handle.read().lower()))\n"
        "    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]\n"
    )}},
)

TASKS: tuple[TaskSpec, ...] = (_FIZZBUZZ, _REVERSE_WORDS, _FIX_MEDIAN, _WORD_COUNT)
"""The builtin tasks; `metadata["solution"]` holds files that solve each (used by tests)."""


class BuiltinSuite(StaticSuite):
    def __init__(self) -> None:
        super().__init__(list(TASKS))
