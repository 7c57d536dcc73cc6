"""`warmup`: procedurally generated easy-to-hard tasks a small model can learn from.

Three levels, all deterministic from a seed (`DEFAULT_SEED`; each task draws from its own
`random.Random(f"{seed}:{level}:{index}")`, so ids and specs are the same in every process):

- `warmup/l1/NNNN` (`LEVEL_SIZES[1]` tasks): write a one-line function from a spec with two
  examples. The operation comes from a grammar of small arithmetic, string, list and word-list
  expressions with random constants and names. The workspace holds a stub that raises.
- `warmup/l2/NNNN`: fix one injected bug (off-by-one, wrong operator, swapped arguments, wrong
  constant) in a 20-60 line module of four functions; visible tests show the failure.
- `warmup/l3/NNNN`: a two-file change: implement a helper that another module uses, or give a
  function a new parameter (replacing a hard-coded constant) and update its caller in another
  module; visible tests check the caller.

Each task carries its reference solution in `metadata["solution"]` (files) and hidden checks
that are plain data, `module.function(*args) == expected`, computed on the host by running the
reference and graded by call table (`TaskSpec.hidden_calls`: the expected values never enter a
sandbox). Every hidden check fails on the untouched workspace (the stub raises; a bug-fix
task only checks inputs where the buggy function's answer differs from the reference's; a new
parameter or a new constant changes every checked answer), so the bare task scores 0.

Train / held-out: `env_server.tasks.splits.split_of(task_id)` (20% held out by a hash of the
id). From Python: `default_registry().ids("warmup", split="held_out")` or
`warmup.split_ids("train")`; on the command line `coding-env tasks list --suite warmup
--split held_out`. Demos and training use `train` only; evaluation uses `held_out`.
"""

from __future__ import annotations

import builtins
import json
import random
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any

from env_server.models import CallCheck, TaskLimits, TaskSpec
from env_server.tasks import StaticSuite
from env_server.tasks.splits import Split, split_of
from env_server.tasks.validation import Validity, host_validity

SUITE = "warmup"
DEFAULT_SEED = 0
LEVEL_SIZES: dict[int, int] = {1: 600, 2: 360, 3: 240}
"""Tasks per level (1,200 in all)."""
HIDDEN_CASES = 5
"""Hidden calls per checked function (fewer when a bug changes the answer on fewer inputs)."""
_MIN_HIDDEN_CASES = 2
_ATTEMPTS = 50
"""Redraws of one task (constants, inputs, bug) before the generator gives up on an index."""

# --------------------------------------------------------------------------------------------
# Values the tasks compute on (short, so prompts and tool calls stay short)

_WORDS = ("apple", "bread", "cat", "delta", "echo", "fig", "grape", "house", "ink", "jam", "kite",
          "lemon", "moon", "note", "ocean", "pear", "queen", "river", "sun", "tree", "sea", "tea")
_LETTERS = "aeinorst"


def _int(rng: random.Random) -> int:
    return rng.randint(0, 40)


def _text(rng: random.Random) -> str:
    return rng.choice(_WORDS) + rng.choice(("", "", rng.choice(_WORDS)))


def _ints(rng: random.Random) -> list[int]:
    return [rng.randint(0, 30) for _ in range(rng.randint(3, 6))]


def _words(rng: random.Random) -> list[str]:
    return rng.sample(_WORDS, rng.randint(3, 5))


@dataclass(frozen=True)
class _Shape:
    """What a level-1 function takes and how to draw its arguments."""

    params: str
    draw: Callable[[random.Random], tuple[Any, ...]]
    names: tuple[str, ...]
    """Function names that fit (one is drawn)."""


_SHAPES: dict[str, _Shape] = {
    "int": _Shape("x: int", lambda rng: (_int(rng),), ("compute", "score", "adjust", "transform", "step", "calc")),
    "int2": _Shape("x: int, y: int", lambda rng: (_int(rng), rng.randint(1, 12)), ("combine", "mix", "merge_values", "pair_score")),
    "str": _Shape("s: str", lambda rng: (_text(rng),), ("shape_text", "format_word", "convert", "rework")),
    "ints": _Shape("xs: list[int]", lambda rng: (_ints(rng),), ("process", "summarize", "select", "map_values")),
    "words": _Shape("words: list[str]", lambda rng: (_words(rng),), ("pick_words", "word_info", "collect", "gather")),
}
_NAME_SUFFIXES = ("", "_value", "_result", "_items", "_v2", "_fn")


def _ints_between(low: int, high: int) -> Callable[[random.Random], int]:
    return lambda rng: rng.randint(low, high)


def _choice(options: Sequence[Any]) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(options)


@dataclass(frozen=True)
class _Operation:
    """One level-1 operation: a Python expression and the English that specifies it.

    `body` and `spec` use `$name` placeholders for the constants drawn by `constants`. An
    operation whose `a` constant is an int can also become a level-3 "new parameter" task.
    """

    shape: str
    returns: str
    body: str
    spec: str
    constants: Mapping[str, Callable[[random.Random], Any]] = field(default_factory=dict)

    def draw_constants(self, rng: random.Random) -> dict[str, Any]:
        return {name: draw(rng) for name, draw in self.constants.items()}


_SMALL = _ints_between(2, 9)
_OPERATIONS: tuple[_Operation, ...] = (
    _Operation("int", "int", "x * $a + $b", "`x` times $a, plus $b", {"a": _SMALL, "b": _ints_between(1, 20)}),
    _Operation("int", "int", "(x + $a) % $b", "the remainder of `x + $a` divided by $b", {"a": _ints_between(1, 20), "b": _ints_between(3, 11)}),
    _Operation("int", "int", "x // $a - $b", "`x` divided by $a (integer division, rounding down), minus $b", {"a": _SMALL, "b": _ints_between(1, 9)}),
    _Operation("int", "int", "abs(x - $a)", "the absolute difference between `x` and $a", {"a": _ints_between(5, 35)}),
    _Operation("int", "int", "max(x, $a) * $b", "the larger of `x` and $a, times $b", {"a": _ints_between(5, 30), "b": _SMALL}),
    _Operation("int", "int", "min(x, $a) + $b", "the smaller of `x` and $a, plus $b", {"a": _ints_between(5, 30), "b": _ints_between(1, 20)}),
    _Operation("int", "int", "x * x - $a", "`x` squared, minus $a", {"a": _ints_between(1, 30)}),
    _Operation("int", "int", "x // 2 if x % 2 == 0 else x * $a + 1", "`x // 2` if `x` is even, otherwise `x * $a + 1`", {"a": _SMALL}),
    _Operation("int2", "int", "x * $a - y", "`x` times $a, minus `y`", {"a": _SMALL}),
    _Operation("int2", "int", "min(x, y) + $a", "the smaller of `x` and `y`, plus $a", {"a": _ints_between(1, 20)}),
    _Operation("int2", "int", "(x - y) * $a", "`x` minus `y`, times $a", {"a": _SMALL}),
    _Operation("int2", "int", "x % y + $a", "the remainder of `x` divided by `y`, plus $a", {"a": _ints_between(1, 20)}),
    _Operation("str", "str", "s.upper() + '$t'", "`s` in upper case, followed by '$t'", {"t": _choice(("!", "?", "_end", "-ok", "."))}),
    _Operation("str", "str", "'$t' + s[::-1]", "'$t' followed by `s` reversed", {"t": _choice((">", "#", "rev:", "x-"))}),
    _Operation("str", "str", "s * $a", "`s` repeated $a times", {"a": _ints_between(2, 4)}),
    _Operation("str", "str", "s[:$a]", "the first $a characters of `s` (all of `s` if it is shorter)", {"a": _ints_between(1, 5)}),
    _Operation("str", "str", "s[-$a:]", "the last $a characters of `s` (all of `s` if it is shorter)", {"a": _ints_between(2, 5)}),
    _Operation("str", "int", "s.count('$c')", "how many times the letter '$c' occurs in `s`", {"c": _choice(_LETTERS)}),
    _Operation("str", "int", "len(s) * $a", "the length of `s` times $a", {"a": _SMALL}),
    _Operation("str", "str", "s.replace('$c', '$d')", "`s` with every '$c' replaced by '$d'", {"c": _choice("aeo"), "d": _choice(("*", "_", "0", "zz"))}),
    _Operation("str", "str", "s[$a:] + s[:$a]", "`s` without its first $a characters, followed by those $a characters", {"a": _ints_between(1, 3)}),
    _Operation("ints", "list[int]", "[v * $a for v in xs]", "a list of each element of `xs` times $a", {"a": _SMALL}),
    _Operation("ints", "list[int]", "[v for v in xs if v > $a]", "the elements of `xs` greater than $a, in order", {"a": _ints_between(5, 25)}),
    _Operation("ints", "int", "sum(v for v in xs if v % $a == 0)", "the sum of the elements of `xs` that are divisible by $a", {"a": _ints_between(2, 5)}),
    _Operation("ints", "list[int]", "[v + $a for v in xs if v % 2 == 1]", "each odd element of `xs` plus $a, in order (even elements are dropped)", {"a": _ints_between(1, 20)}),
    _Operation("ints", "int", "len([v for v in xs if v < $a])", "how many elements of `xs` are less than $a", {"a": _ints_between(5, 25)}),
    _Operation("ints", "list[int]", "sorted(xs)[:$a]", "the $a smallest elements of `xs`, in ascending order", {"a": _ints_between(2, 3)}),
    _Operation("ints", "int", "max(xs) - min(xs) + $a", "the largest element of `xs` minus the smallest, plus $a", {"a": _ints_between(1, 20)}),
    _Operation("ints", "list[int]", "[v % $a for v in xs]", "a list of each element of `xs` modulo $a", {"a": _ints_between(3, 9)}),
    _Operation("ints", "int", "sum(xs) * $a", "the sum of `xs` times $a", {"a": _SMALL}),
    _Operation("words", "list[str]", "[w for w in words if len(w) > $a]", "the words longer than $a characters, in order", {"a": _ints_between(3, 4)}),
    _Operation("words", "list[str]", "[w.upper() for w in words if '$c' in w]", "the words that contain the letter '$c', upper-cased, in order", {"c": _choice(_LETTERS)}),
    _Operation("words", "dict[str, int]", "{w: len(w) * $a for w in words}", "a dict mapping each word to its length times $a", {"a": _ints_between(2, 5)}),
    _Operation("words", "str", "'$t'.join(sorted(words))", "the words in alphabetical order, joined with '$t'", {"t": _choice(("-", ",", "+", "/", " "))}),
    _Operation("words", "int", "sum(len(w) for w in words) + $a", "the total number of letters in all the words, plus $a", {"a": _ints_between(1, 20)}),
)

_MODULES = ("solution", "funcs", "helpers", "utils", "mymod", "tools_impl")
"""Level-1 module names (none shadows the standard library or the test runner)."""


# --------------------------------------------------------------------------------------------
# Hidden checks as data, and running the reference on the host


@dataclass(frozen=True)
class CallChecks:
    """Hidden checks of one function: `module.function(*args)` must equal `expected`."""

    module: str
    function: str
    cases: tuple[tuple[tuple[Any, ...], Any], ...]
    """(args, expected) pairs, computed by running the reference solution."""


def load_modules(files: Mapping[str, str]) -> dict[str, types.ModuleType]:
    """Execute generated `*.py` files as modules that may import one another, without touching
    `sys.modules` or `sys.path` (the code is the generator's own, never an agent's)."""
    sources = {path[: -len(".py")]: text for path, text in files.items() if path.endswith(".py") and "/" not in path}
    loaded: dict[str, types.ModuleType] = {}

    def load(name: str) -> types.ModuleType:
        if name not in loaded:
            module = types.ModuleType(name)
            module.__dict__["__builtins__"] = {**vars(builtins), "__import__": import_}
            loaded[name] = module
            exec(compile(sources[name], f"{name}.py", "exec"), module.__dict__)
        return loaded[name]

    def import_(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name in sources:
            return load(name)
        return builtins.__import__(name, globals_, locals_, fromlist, level)

    for name in sources:
        load(name)
    return loaded


_RAISED = object()
"""What `_call` returns when the call raised (it equals no expected value)."""


def _call(modules: Mapping[str, types.ModuleType], module: str, function: str, args: tuple[Any, ...]) -> Any:
    try:
        # A copy per call: the generated functions must not see another call's mutations.
        return getattr(modules[module], function)(*json.loads(json.dumps(args)))
    except Exception:
        return _RAISED


# --------------------------------------------------------------------------------------------
# Task drafts: what each generator produces before it becomes a TaskSpec


@dataclass
class _Draft:
    prompt: str
    files: dict[str, str]
    solution: dict[str, str]
    checks: list[CallChecks]
    kind: str
    visible_tests: dict[str, str] = field(default_factory=dict)


class _Redraw(Exception):
    """The drawn constants/inputs give no usable task (too few distinguishing cases); draw again."""


def _distinct_cases(
    rng: random.Random,
    draw: Callable[[random.Random], tuple[Any, ...]],
    reference: Callable[[tuple[Any, ...]], Any],
    count: int,
    *,
    differs: Callable[[tuple[Any, ...], Any], bool] = lambda args, expected: True,
    avoid: Sequence[tuple[Any, ...]] = (),
    tries: int = 300,
) -> list[tuple[tuple[Any, ...], Any]]:
    """Up to `count` cases with distinct arguments whose reference answer does not raise and for
    which `differs(args, expected)` holds (e.g. the bare workspace answers differently)."""
    cases: list[tuple[tuple[Any, ...], Any]] = []
    seen = {json.dumps(args) for args in avoid}
    for _ in range(tries):
        args = draw(rng)
        key = json.dumps(args)
        if key in seen:
            continue
        seen.add(key)
        expected = reference(args)
        if expected is not _RAISED and differs(args, expected):
            cases.append((args, expected))
            if len(cases) == count:
                break
    return cases


def _spread(cases: Sequence[tuple[tuple[Any, ...], Any]], distinct: int = HIDDEN_CASES - 1) -> bool:
    """At least `distinct` different answers: a constant function passes at most two of five
    checks of a function written from scratch, and never all checks of a bug fix."""
    return len({json.dumps(expected) for _, expected in cases}) >= distinct


def _function_name(rng: random.Random, shape: _Shape) -> str:
    return rng.choice(shape.names) + rng.choice(_NAME_SUFFIXES)


def _render(operation: _Operation, constants: Mapping[str, Any]) -> tuple[str, str]:
    return Template(operation.body).substitute(constants), Template(operation.spec).substitute(constants)


def _example_text(name: str, args: tuple[Any, ...], expected: Any) -> str:
    return f"{name}({', '.join(map(repr, args))}) == {expected!r}"


def _level_one(rng: random.Random) -> _Draft:
    operation = rng.choice(_OPERATIONS)
    shape = _SHAPES[operation.shape]
    body, spec = _render(operation, operation.draw_constants(rng))
    name, module = _function_name(rng, shape), rng.choice(_MODULES)
    signature = f"def {name}({shape.params}) -> {operation.returns}:"
    path = f"{module}.py"
    solution = {path: f"{signature}\n    return {body}\n"}
    modules = load_modules(solution)
    reference = lambda args: _call(modules, module, name, args)  # noqa: E731
    examples = _distinct_cases(rng, shape.draw, reference, 2)
    hidden = _distinct_cases(rng, shape.draw, reference, HIDDEN_CASES, avoid=[args for args, _ in examples])
    if len(examples) < 2 or len(hidden) < HIDDEN_CASES or not _spread(hidden):
        raise _Redraw
    shown = "; ".join(_example_text(name, args, expected) for args, expected in examples)
    return _Draft(
        prompt=f"Write `{name}({shape.params}) -> {operation.returns}` in {path}: return {spec}.\nExamples: {shown}",
        files={path: f"{signature}\n    raise NotImplementedError\n"},
        solution=solution,
        checks=[CallChecks(module, name, tuple(hidden))],
        kind="write_function",
    )


# --------------------------------------------------------------------------------------------
# Level 2: one injected bug in a small module


@dataclass(frozen=True)
class _Bug:
    kind: str
    """off_by_one, wrong_operator, swapped_args or wrong_constant."""
    old: str
    new: str
    """`old` (once in the function's body) becomes `new`; both may use `$constants`."""


@dataclass(frozen=True)
class _FunctionTemplate:
    """A short function for a level-2 module: header and docstring, a body to plant bugs in."""

    names: tuple[str, ...]
    header: str
    body: str
    draw: Callable[[random.Random, Mapping[str, Any]], tuple[Any, ...]]
    """Arguments of one call, given the constants."""
    bugs: tuple[_Bug, ...]
    constants: Mapping[str, Callable[[random.Random], Any]] = field(default_factory=dict)


def _window_args(rng: random.Random, _: Mapping[str, Any]) -> tuple[Any, ...]:
    values = _ints(rng)
    return values, rng.randint(1, len(values))


def _grade_constants(rng: random.Random) -> int:
    return rng.randint(50, 75)


_TEMPLATES: tuple[_FunctionTemplate, ...] = (
    _FunctionTemplate(
        ("count_between", "count_in_range", "tally_range"),
        'def $name(values: list[int], low: int, high: int) -> int:\n    """How many values v satisfy low <= v <= high."""\n',
        "    count = 0\n    for v in values:\n        if low <= v <= high:\n            count += 1\n    return count\n",
        lambda rng, c: (_ints(rng), (low := rng.randint(2, 12)), low + rng.randint(0, 10)),
        (_Bug("off_by_one", "v <= high", "v < high"), _Bug("wrong_operator", "count += 1", "count -= 1"),
         _Bug("wrong_constant", "count = 0", "count = 1")),
    ),
    _FunctionTemplate(
        ("order_total", "checkout_cost", "bulk_price"),
        'def $name(price: int, quantity: int) -> int:\n    """Cost of `quantity` items at `price` each, $pct% off from $min_qty items on."""\n',
        "    total = price * quantity\n    if quantity >= $min_qty:\n        total -= total * $pct // 100\n    return total\n",
        lambda rng, c: (rng.randint(1, 50), rng.randint(max(1, c["min_qty"] - 2), c["min_qty"] + 3)),
        (_Bug("off_by_one", "quantity >= $min_qty", "quantity > $min_qty"),
         _Bug("wrong_operator", "price * quantity", "price + quantity"),
         _Bug("wrong_constant", "$pct // 100", "$pct // 10")),
        {"pct": _choice((10, 20, 25, 50)), "min_qty": _ints_between(3, 8)},
    ),
    _FunctionTemplate(
        ("running_totals", "prefix_sums", "cumulative"),
        'def $name(values: list[int]) -> list[int]:\n    """Running totals: element i is the sum of values[0] .. values[i]."""\n',
        "    totals = []\n    current = 0\n    for v in values:\n        current += v\n        totals.append(current)\n    return totals\n",
        lambda rng, c: (_ints(rng),),
        (_Bug("wrong_operator", "current += v", "current -= v"), _Bug("wrong_constant", "current = 0", "current = 1"),
         _Bug("off_by_one", "for v in values:", "for v in values[1:]:")),
    ),
    _FunctionTemplate(
        ("pad_left", "left_fill", "justify"),
        'def $name(text: str, width: int) -> str:\n    """`text` padded on the left with \'$fill\' to `width` characters (unchanged if longer)."""\n',
        "    if len(text) >= width:\n        return text\n    return '$fill' * (width - len(text)) + text\n",
        lambda rng, c: (rng.choice(_WORDS), rng.randint(2, 9)),
        (_Bug("off_by_one", "(width - len(text))", "(width - len(text) - 1)"),
         _Bug("swapped_args", "'$fill' * (width - len(text)) + text", "text + '$fill' * (width - len(text))")),
        {"fill": _choice(("*", ".", "0", "-"))},
    ),
    _FunctionTemplate(
        ("percent_of", "share_percent", "ratio_percent"),
        'def $name(part: int, whole: int) -> int:\n    """`part` as a percentage of `whole`, rounded down; 0 when `whole` is 0."""\n',
        "    if whole == 0:\n        return 0\n    return part * 100 // whole\n",
        lambda rng, c: (rng.randint(0, 40), rng.randint(1, 60)),
        (_Bug("swapped_args", "part * 100 // whole", "whole * 100 // part"),
         _Bug("wrong_constant", "part * 100", "part * 10"), _Bug("wrong_operator", "100 // whole", "100 % whole")),
    ),
    _FunctionTemplate(
        ("initials", "first_letters", "acronym"),
        'def $name(words: list[str]) -> str:\n    """The first letter of each word, upper-cased, joined with \'$sep\'."""\n',
        "    letters = [w[0].upper() for w in words]\n    return '$sep'.join(letters)\n",
        lambda rng, c: (_words(rng),),
        (_Bug("off_by_one", "w[0]", "w[1]"), _Bug("wrong_operator", "w[0].upper()", "w[0].lower()")),
        {"sep": _choice(("", ".", "-"))},
    ),
    _FunctionTemplate(
        ("window_sums", "sliding_totals", "chunk_sums"),
        'def $name(values: list[int], size: int) -> list[int]:\n    """Sums of each run of `size` consecutive values, left to right."""\n',
        "    sums = []\n    for start in range(len(values) - size + 1):\n        sums.append(sum(values[start:start + size]))\n    return sums\n",
        _window_args,
        (_Bug("off_by_one", "len(values) - size + 1", "len(values) - size"),
         _Bug("off_by_one", "start:start + size]", "start:start + size - 1]")),
    ),
    _FunctionTemplate(
        ("power_mod", "modular_power", "pow_mod"),
        'def $name(base: int, exponent: int, modulus: int) -> int:\n    """`base` to the power `exponent`, modulo `modulus`."""\n',
        "    return pow(base, exponent, modulus)\n",
        lambda rng, c: (rng.randint(2, 12), rng.randint(2, 9), rng.randint(5, 97)),
        (_Bug("swapped_args", "pow(base, exponent, modulus)", "pow(exponent, base, modulus)"),),
    ),
    _FunctionTemplate(
        ("letter_grade", "grade_for", "rank_score"),
        'def $name(score: int) -> str:\n    """\'A\' for a score of at least $high, \'B\' for at least $low, else \'C\'."""\n',
        "    if score >= $high:\n        return 'A'\n    if score >= $low:\n        return 'B'\n    return 'C'\n",
        lambda rng, c: (rng.randint(c["low"] - 6, c["high"] + 6),),
        # Only bugs whose failing inputs need two different answers (not just 'A'): a constant
        # function must not pass a bug-fix task's hidden checks.
        (_Bug("wrong_operator", "score >= $low", "score <= $low"),),
        {"low": _grade_constants},
    ),
    _FunctionTemplate(
        ("count_vowels", "vowel_count", "tally_vowels"),
        'def $name(text: str) -> int:\n    """How many letters of `text` are vowels (a, e, i, o, u)."""\n',
        "    return sum(1 for ch in text if ch in 'aeiou')\n",
        lambda rng, c: (_text(rng),),
        (_Bug("wrong_operator", "if ch in 'aeiou'", "if ch not in 'aeiou'"),
         _Bug("wrong_constant", "'aeiou'", "'aeio'")),
    ),
)
_MODULES_L2 = ("inventory", "textkit", "scoring", "mathkit", "shop", "records")


def _template_constants(template: _FunctionTemplate, rng: random.Random) -> dict[str, Any]:
    constants = {name: draw(rng) for name, draw in template.constants.items()}
    if "low" in constants:  # letter grades: a B band of 10-20 points
        constants["high"] = constants["low"] + rng.randint(10, 20)
    return constants


def _visible_test(module: str, checks: Sequence[CallChecks]) -> str:
    lines = [f"from {module} import {', '.join(sorted({c.function for c in checks}))}\n"]
    for check in checks:
        for number, (args, expected) in enumerate(check.cases):
            lines.append(
                f"\ndef test_{check.function}_{number}():\n"
                f"    assert {check.function}({', '.join(map(repr, args))}) == {expected!r}\n"
            )
    return "\n".join(lines)


def _level_two(rng: random.Random) -> _Draft:
    module = rng.choice(_MODULES_L2)
    templates = rng.sample(_TEMPLATES, 4)
    names = [rng.choice(t.names) for t in templates]
    constants = [_template_constants(t, rng) for t in templates]
    target = rng.randrange(len(templates))
    bug = rng.choice(templates[target].bugs)
    correct, buggy = [], []
    for index, (template, name, values) in enumerate(zip(templates, names, constants)):
        header = Template(template.header).substitute(values, name=name)
        body = Template(template.body).substitute(values)
        correct.append(header + body)
        if index == target:
            old, new = Template(bug.old).substitute(values), Template(bug.new).substitute(values)
            if body.count(old) != 1:
                raise AssertionError(f"bug {bug} must match the body of {name} exactly once")
            body = body.replace(old, new)
        buggy.append(header + body)
    path = f"{module}.py"
    docstring = f'"""Small helpers of the {module} module."""\n\n\n'
    solution = {path: docstring + "\n\n".join(correct)}
    start = {path: docstring + "\n\n".join(buggy)}
    fixed, broken = load_modules(solution), load_modules(start)
    visible: list[CallChecks] = []
    hidden: list[CallChecks] = []
    for index, (template, name, values) in enumerate(zip(templates, names, constants)):
        draw = lambda r, t=template, v=values: t.draw(r, v)  # noqa: E731
        reference = lambda args, n=name: _call(fixed, module, n, args)  # noqa: E731
        if index != target:
            visible.append(CallChecks(module, name, tuple(_distinct_cases(rng, draw, reference, 1))))
            continue
        # Only inputs where the bug shows: the untouched module fails every hidden check.
        differs = lambda args, expected, n=name: _call(broken, module, n, args) != expected  # noqa: E731
        failing = _distinct_cases(rng, draw, reference, 1 + HIDDEN_CASES, differs=differs)
        if len(failing) < 1 + _MIN_HIDDEN_CASES or not _spread(failing[1:], distinct=2):
            raise _Redraw
        visible.insert(0, CallChecks(module, name, tuple(failing[:1])))
        hidden.append(CallChecks(module, name, tuple(failing[1:])))
    return _Draft(
        prompt=(
            f"{path} has one bug, in `{names[target]}`; test_{module}.py shows it. "
            "Fix the bug without changing the function's signature."
        ),
        files=start,
        solution=solution,
        checks=hidden,
        kind=f"fix_bug/{bug.kind}",
        visible_tests={f"test_{module}.py": _visible_test(module, visible)},
    )


# --------------------------------------------------------------------------------------------
# Level 3: a change across two files

_HELPER_MODULES = ("helpers", "textops", "numops", "core", "lib_ops")
_CALLER_MODULES = ("report", "pipeline", "service", "app_main", "batch")
_CALLER_NAMES = ("apply_all", "run_batch", "process_all", "convert_all", "map_items")
_SINGLE_ARGUMENT = tuple(op for op in _OPERATIONS if op.shape != "int2")
_PARAMETRISABLE = tuple(op for op in _SINGLE_ARGUMENT if isinstance(op.draw_constants(random.Random(0)).get("a"), int))
"""Operations whose constant `a` is an int: it can become a parameter."""
_PARAMETERS = ("factor", "amount", "k", "n", "size")


def _caller_source(helper_module: str, helper: str, caller: str, call_args: str) -> str:
    return (
        f"from {helper_module} import {helper}\n\n\n"
        f"def {caller}(items: list) -> list:\n"
        f'    """`{helper}` applied to each item, in order."""\n'
        f"    return [{helper}({call_args}) for item in items]\n"
    )


@dataclass(frozen=True)
class _TwoFiles:
    """The names of a level-3 task: a helper module and a caller module that imports it."""

    helper_module: str
    caller_module: str
    caller: str

    @property
    def helper_path(self) -> str:
        return f"{self.helper_module}.py"

    @property
    def caller_path(self) -> str:
        return f"{self.caller_module}.py"


def _level_three(rng: random.Random) -> _Draft:
    names = _TwoFiles(rng.choice(_HELPER_MODULES), rng.choice(_CALLER_MODULES), rng.choice(_CALLER_NAMES))
    return _implement_helper(rng, names) if rng.random() < 0.5 else _add_parameter(rng, names)


def _caller_checks(
    rng: random.Random, names: _TwoFiles, shape: _Shape, fixed: Mapping[str, types.ModuleType], broken: Mapping[str, types.ModuleType]
) -> tuple[CallChecks, CallChecks]:
    """(visible, hidden) calls of the caller on short lists, each answered differently by the untouched workspace."""
    draw_items = lambda r: ([shape.draw(r)[0] for _ in range(3)],)  # noqa: E731
    differs = lambda args, expected: _call(broken, names.caller_module, names.caller, args) != expected  # noqa: E731
    reference = lambda args: _call(fixed, names.caller_module, names.caller, args)  # noqa: E731
    cases = _distinct_cases(rng, draw_items, reference, 1 + 3, differs=differs)
    if len(cases) < 1 + _MIN_HIDDEN_CASES or not _spread(cases[1:], distinct=2):
        raise _Redraw
    return CallChecks(names.caller_module, names.caller, tuple(cases[:1])), CallChecks(names.caller_module, names.caller, tuple(cases[1:]))


def _implement_helper(rng: random.Random, names: _TwoFiles) -> _Draft:
    operation = rng.choice(_SINGLE_ARGUMENT)
    shape = _SHAPES[operation.shape]
    body, spec = _render(operation, operation.draw_constants(rng))
    helper = _function_name(rng, shape)
    signature = f"def {helper}({shape.params}) -> {operation.returns}:"
    caller = _caller_source(names.helper_module, helper, names.caller, "item")
    start = {names.helper_path: f"{signature}\n    raise NotImplementedError\n", names.caller_path: caller}
    solution = {names.helper_path: f"{signature}\n    return {body}\n", names.caller_path: caller}
    fixed, broken = load_modules(solution), load_modules(start)
    helper_cases = _distinct_cases(rng, shape.draw, lambda args: _call(fixed, names.helper_module, helper, args), HIDDEN_CASES)
    visible, hidden = _caller_checks(rng, names, shape, fixed, broken)
    if len(helper_cases) < HIDDEN_CASES or not _spread(helper_cases):
        raise _Redraw
    return _Draft(
        prompt=(
            f"`{names.caller}` in {names.caller_path} uses `{helper}` from {names.helper_path}, which is not "
            f"written yet. Implement `{helper}`: it returns {spec}."
        ),
        files=start,
        solution=solution,
        checks=[CallChecks(names.helper_module, helper, tuple(helper_cases)), hidden],
        kind="implement_helper",
        visible_tests={f"test_{names.caller_module}.py": _visible_test(names.caller_module, [visible])},
    )


def _add_parameter(rng: random.Random, names: _TwoFiles) -> _Draft:
    operation = rng.choice(_PARAMETRISABLE)
    shape = _SHAPES[operation.shape]
    values = operation.draw_constants(rng)
    parameter = rng.choice(_PARAMETERS)
    other_values = [v for v in range(2, 10) if v != values["a"]]
    new_value = rng.choice(other_values)
    old_body, _ = _render(operation, values)
    new_body, new_spec = _render(operation, {**values, "a": f"`{parameter}`"})
    new_body = new_body.replace(f"`{parameter}`", parameter)
    helper = _function_name(rng, shape)
    start = {
        names.helper_path: f"def {helper}({shape.params}) -> {operation.returns}:\n    return {old_body}\n",
        names.caller_path: _caller_source(names.helper_module, helper, names.caller, "item"),
    }
    solution = {
        names.helper_path: f"def {helper}({shape.params}, {parameter}: int) -> {operation.returns}:\n    return {new_body}\n",
        names.caller_path: _caller_source(names.helper_module, helper, names.caller, f"item, {new_value}"),
    }
    fixed, broken = load_modules(solution), load_modules(start)
    # The untouched helper takes one argument, so every two-argument call fails on it.
    draw_helper = lambda r: (*shape.draw(r), r.choice(other_values))  # noqa: E731
    helper_cases = _distinct_cases(rng, draw_helper, lambda args: _call(fixed, names.helper_module, helper, args), HIDDEN_CASES)
    visible, hidden = _caller_checks(rng, names, shape, fixed, broken)
    if len(helper_cases) < HIDDEN_CASES or not _spread(helper_cases):
        raise _Redraw
    return _Draft(
        prompt=(
            f"`{helper}` in {names.helper_path} hard-codes {values['a']}. Give it a second parameter "
            f"`{parameter}: int` to use instead (it then returns {new_spec}), and make `{names.caller}` in "
            f"{names.caller_path} pass {new_value} for it."
        ),
        files=start,
        solution=solution,
        checks=[CallChecks(names.helper_module, helper, tuple(helper_cases)), hidden],
        kind="add_parameter",
        visible_tests={f"test_{names.caller_module}.py": _visible_test(names.caller_module, [visible])},
    )


# --------------------------------------------------------------------------------------------
# The suite

_GENERATORS: dict[int, Callable[[random.Random], _Draft]] = {1: _level_one, 2: _level_two, 3: _level_three}
_MAX_STEPS = {1: 10, 2: 15, 3: 20}
"""Tool calls per episode: level 1 needs about three (write, test, submit)."""
_CALL_TIMEOUT_S = 15.0
"""Per hidden call. The functions are instant, but a grading worker's start-up counts towards its
first call, and on a loaded 2-core machine (load 25, a training run beside the grader) that alone
passed the default 5 s and failed reference solutions. A looping submission costs at most
5-8 calls x 15 s, within `_GRADE_TIMEOUT_S`."""
_GRADE_TIMEOUT_S = 150.0


def _task(task_id: str, level: int, seed: int, draft: _Draft) -> TaskSpec:
    return TaskSpec(
        id=task_id,
        prompt=draft.prompt,
        files=draft.files,
        visible_tests=draft.visible_tests,
        hidden_calls=[
            CallCheck.build(check.module, check.function, list(args), expected=expected)
            for check in draft.checks
            for args, expected in check.cases
        ],
        limits=TaskLimits(max_steps=_MAX_STEPS[level], call_timeout_s=_CALL_TIMEOUT_S, grade_timeout_s=_GRADE_TIMEOUT_S),
        metadata={"level": level, "kind": draft.kind, "split": split_of(task_id), "seed": seed, "solution": draft.solution},
    )


def _draw(level: int, index: int, seed: int, seen: set[str]) -> tuple[TaskSpec, Validity]:
    """The task at (level, index): the first draw that is usable, unlike every earlier task, and
    passes the validity gate's host side (no trivial baseline earns reward, e.g. an identity that
    the drawn inputs never tell apart from the spec)."""
    task_id = f"{SUITE}/l{level}/{index:04d}"
    for attempt in range(_ATTEMPTS):
        try:
            draft = _GENERATORS[level](random.Random(f"{seed}:{level}:{index}:{attempt}"))
        except _Redraw:
            continue
        key = json.dumps([draft.prompt, draft.files], sort_keys=True)
        if key in seen:
            continue
        task = _task(task_id, level, seed, draft)
        verdict = host_validity(task)
        if verdict.valid:
            seen.add(key)
            return task, verdict
    raise RuntimeError(f"warmup level {level} task {index}: no usable draw in {_ATTEMPTS} attempts (seed {seed})")


def _drawn(seed: int, sizes: Mapping[int, int]) -> list[tuple[TaskSpec, Validity]]:
    seen: set[str] = set()
    return [_draw(level, index, seed, seen) for level, size in sizes.items() for index in range(size)]


def generate(seed: int = DEFAULT_SEED, sizes: Mapping[int, int] = LEVEL_SIZES) -> list[TaskSpec]:
    """The suite's tasks, level by level; the same list for the same seed and sizes."""
    return [task for task, _ in _drawn(seed, sizes)]


class WarmupSuite(StaticSuite):
    """The `warmup` suite for one seed, generated in memory on first use (a few seconds)."""

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        drawn = _drawn(seed, LEVEL_SIZES)
        # Each draw already passed the gate: its verdict is handed over rather than computed twice.
        super().__init__([task for task, _ in drawn], verdicts={task.id: verdict for task, verdict in drawn})


def split_ids(split: Split, seed: int = DEFAULT_SEED) -> list[str]:
    """Ids of the warmup tasks in `split` (`train` or `held_out`), in suite order."""
    return [task.id for task in generate(seed) if split_of(task.id) == split]
