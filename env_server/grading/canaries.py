"""Canary tests: copies of a hidden file's own tests that must fail, planted at every grading.

A runner patched to report every test passed, or to skip every test but a recognisable canary,
reports these passed too, and they cannot be told apart from the real tests by name, shape or
style (docs/decisions/056-canaries-from-real-tests.md):

- each canary is a copy of a real test of the same file (decorators, signature, body, in the
  same module or class), with the assertion on every way out of the test changed so that it
  fails wherever the original passes: a literal that an `==` assertion (or unittest's
  `assertEqual` family) compares gets another value, else the assertion is inverted
  (`==`/`!=`, `in`/`not in`, `assertTrue`/`assertFalse`, `assert x` / `assert not (x)`);
- which tests are copied and how they are changed is fixed by the file's text, so the validity
  gate, which grades the reference, checks exactly the canaries every later grading plants
  (a canary the reference passes fails the gate); only their names (built from the words of the
  file's own test names, in its naming style) and their places in the file are drawn afresh at
  each grading.

A file with no test that can be changed this way (every way out of each test needs an
assertion before it) gets copies of a real test that fail first thing.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CANARIES_PER_FILE = 3
"""Canaries planted in a hidden file with at least this many tests (two in smaller ones)."""

# unittest assertions whose literal argument can be changed so that a passing call fails.
_EQUAL_METHODS = frozenset(
    {"assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual", "assertSetEqual",
     "assertSequenceEqual", "assertMultiLineEqual", "assertCountEqual"}
)
_INVERSE_METHODS = {
    "assertTrue": "assertFalse", "assertFalse": "assertTrue", "assertEqual": "assertNotEqual",
    "assertEquals": "assertNotEqual", "assertNotEqual": "assertEqual", "assertIn": "assertNotIn",
    "assertNotIn": "assertIn", "assertIs": "assertIsNot", "assertIsNot": "assertIs", "assertIsNone": "assertIsNotNone",
    "assertIsNotNone": "assertIsNone", "assertIsInstance": "assertNotIsInstance", "assertNotIsInstance": "assertIsInstance",
}
_INVERSE_OPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


@dataclass(frozen=True)
class _Edit:
    """Replace the source between two (line, byte column) positions of the original file."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str


@dataclass(frozen=True)
class _Test:
    node: ast.FunctionDef
    scope: ast.Module | ast.ClassDef


def plant(
    text: str, rng: random.Random, count: int = CANARIES_PER_FILE, copyable: Callable[[str, str], bool] | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """`text` with canaries added, and each canary's (class name or '', test name). The text is
    returned unchanged (no canary) when it does not parse or defines no test. `copyable(class name
    or '', test name)` says which tests may be copied (those the reference passes; default all);
    when it allows none, any test may be."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text, []
    every = list(_tests(tree))
    if not every:
        return text, []
    allowed = [test for test in every if copyable is None or copyable(_scope_name(test), test.node.name)]
    tests = allowed or every
    chooser = random.Random(hashlib.sha256(text.encode()).digest())  # the same canaries at every grading
    lines = text.encode().splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    changed = [(test, edits) for test in tests if (edits := _failing_edits(test.node, chooser, lines)) is not None]
    wanted = count if len(every) >= count else 2
    if changed:
        picks = chooser.sample(changed, min(wanted, len(changed)))
        # A test copied twice is changed twice, each its own way (identical twins would point
        # at the original as the odd one out).
        picks += [(test, _failing_edits(test.node, chooser, lines) or edits) for test, edits in (chooser.choice(changed) for _ in range(wanted - len(picks)))]
    else:
        picks = [(test, _failing_first(test.node, tree, lines)) for test in (chooser.choice(tests) for _ in range(wanted))]
    taken = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    insertions: list[tuple[int, bytes]] = []
    planted = []
    for test, edits in picks:
        name = _fresh_name(test, every, taken, rng)
        taken.add(name)
        scope_tests = [other.node for other in every if other.scope is test.scope]
        # Where it goes is fixed by the file's text, like what is copied: a copy repeats its
        # original's side effects (module state), so the validity gate must see the order every
        # later grading runs.
        anchor = chooser.choice(scope_tests)
        gap = b"\n\n" if isinstance(test.scope, ast.Module) else b"\n"
        copy = _copy(lines, test.node, edits, name)
        # Before or after a real test of its scope: the original is not always the first of the two.
        if chooser.random() < 0.5:
            insertions.append((anchor.end_lineno or anchor.lineno, gap + copy))
        else:
            insertions.append((_first_line(anchor) - 1, copy + gap))
        planted.append((_scope_name(test), name))
    for after, block in sorted(insertions, key=lambda item: item[0], reverse=True):
        lines.insert(after, block)
    return b"".join(lines).decode(), planted


def _scope_name(test: _Test) -> str:
    return test.scope.name if isinstance(test.scope, ast.ClassDef) else ""


def _tests(tree: ast.Module) -> Iterator[_Test]:
    """Test functions pytest collects by default: module-level `test*`, and `test*` methods of
    `Test*` classes and of unittest `TestCase` subclasses defined in the file."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            yield _Test(node, tree)
        elif isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or any(_base_name(base).endswith("TestCase") for base in node.bases)):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    yield _Test(item, node)


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_assertion(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assert):
        return True
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (
        isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self" and call.func.attr.startswith("assert")
    )


def _exit_assertions(function: ast.FunctionDef) -> list[ast.stmt] | None:
    """The assertion each way out of `function` passes last (falling off its end, or a `return`
    in an `if` branch), or None when some way out has none before it or a `return` hides in a
    loop, `try` or `with` (then which assertions ran is not known from the syntax)."""
    if any(isinstance(node, ast.Yield | ast.YieldFrom) for node in _own_nodes(function)):
        return None
    found: dict[int, ast.stmt] = {}

    def block(statements: list[ast.stmt], inherited: ast.stmt | None, ends_function: bool) -> bool:
        last = inherited
        for stmt in statements:
            if _is_assertion(stmt):
                last = stmt
            elif isinstance(stmt, ast.Return):
                if last is None:
                    return False
                found[id(last)] = last
                return True
            elif isinstance(stmt, ast.If):
                if not block(stmt.body, last, False) or not block(stmt.orelse, last, False):
                    return False
            elif any(isinstance(node, ast.Return) for node in _own_nodes(stmt)):
                return False
        if ends_function:
            if last is None:
                return False
            found[id(last)] = last
        return True

    return list(found.values()) if block(function.body, None, True) else None


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `node`, not descending into nested functions, lambdas or classes."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield child
        yield from _own_nodes(child)


def _failing_edits(function: ast.FunctionDef, chooser: random.Random, lines: list[bytes]) -> list[_Edit] | None:
    """Edits that make a copy of `function` (in the file of source `lines`) fail wherever it passes, or None."""
    exits = _exit_assertions(function)
    if not exits:
        return None
    edits: dict[tuple[int, int], _Edit] = {}
    for assertion in exits:
        changed = _changed_literal(assertion, chooser)
        # An inversion fails against a comparison that always answers "equal"; a changed
        # expected value does not, so the parameters' values come before it.
        changed = [changed] if changed else _changed_parameter(function, assertion, chooser) or _inverted(assertion, lines)
        if changed is None:
            return None
        edits.update((edit.start, edit) for edit in changed)
    return list(edits.values())


def _compared_literals(assertion: ast.stmt) -> list[ast.Constant]:
    """Literals an equality assertion compares (alone, or inside a list, tuple, set or dict value)."""
    if isinstance(assertion, ast.Assert):
        test = assertion.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return []
        sides = [test.left, test.comparators[0]]
    else:
        call = assertion.value
        if call.func.attr not in _EQUAL_METHODS or call.keywords:
            return []
        sides = call.args[:2]
    literals = []
    for side in sides:
        stack = [side]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Constant) and _other_value(node.value, random.Random(0)) is not None:
                literals.append(node)
            elif isinstance(node, ast.List | ast.Tuple | ast.Set):
                stack.extend(node.elts)
            elif isinstance(node, ast.Dict):
                stack.extend(node.values)
    return [node for node in literals if node.lineno == node.end_lineno]


def _changed_parameter(function: ast.FunctionDef, assertion: ast.stmt, chooser: random.Random) -> list[_Edit] | None:
    """For `assert f(x) == expected` where `expected` is a `parametrize` argument: its value
    changed in every case (so every case of the copy fails), or None."""
    if isinstance(assertion, ast.Assert):
        test = assertion.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        sides = [test.left, test.comparators[0]]
    elif assertion.value.func.attr in _EQUAL_METHODS and not assertion.value.keywords:
        sides = assertion.value.args[:2]
    else:
        return None
    compared = {side.id for side in sides if isinstance(side, ast.Name)}
    for decorator in function.decorator_list:
        if not (isinstance(decorator, ast.Call) and _base_name(decorator.func) == "parametrize" and len(decorator.args) >= 2):
            continue
        names_node, cases = decorator.args[0], decorator.args[1]
        if isinstance(names_node, ast.Constant) and isinstance(names_node.value, str):
            names = [name.strip() for name in names_node.value.split(",") if name.strip()]
        elif isinstance(names_node, ast.List | ast.Tuple) and all(isinstance(e, ast.Constant) for e in names_node.elts):
            names = [e.value for e in names_node.elts]
        else:
            continue
        for index, name in enumerate(names):
            if name not in compared or not isinstance(cases, ast.List | ast.Tuple) or not cases.elts:
                continue
            edits = []
            for case in cases.elts:
                if isinstance(case, ast.Call) and _base_name(case.func) == "param":
                    values = case.args
                elif len(names) == 1:
                    values = [case]
                else:
                    values = case.elts if isinstance(case, ast.Tuple | ast.List) else []
                node = values[index] if index < len(values) else None
                if not isinstance(node, ast.Constant) or node.lineno != node.end_lineno or _other_value(node.value, chooser) is None:
                    break
                edits.append(_Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), repr(_other_value(node.value, chooser))))
            else:
                return edits
    return None


def _other_value(value: object, chooser: random.Random) -> object:
    """A literal of the same type and look that differs from `value`; None for types left alone."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + chooser.choice((1, 2, 3, -1)) if value else chooser.choice((1, 2))
    if isinstance(value, float):
        return value + chooser.choice((0.5, 1.0, 1.5))
    if isinstance(value, str | bytes):
        chars = value.decode("latin-1") if isinstance(value, bytes) else value
        if not chars:
            changed = chooser.choice("xyz")
        else:
            at = chooser.randrange(len(chars))
            pool = "0123456789" if chars[at].isdigit() else "abcdefghijklmnopqrstuvwxyz" if chars[at].isalpha() else "-_ ."
            changed = chars[:at] + chooser.choice([c for c in pool if c != chars[at].lower()]) + chars[at + 1 :]
        return changed.encode("latin-1") if isinstance(value, bytes) else changed
    return None


def _changed_literal(assertion: ast.stmt, chooser: random.Random) -> _Edit | None:
    literals = _compared_literals(assertion)
    if not literals:
        return None
    node = chooser.choice(literals)
    new = _other_value(node.value, chooser)
    return _Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), repr(new))


_OP_TEXT: dict[type[ast.cmpop], str] = {ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
# Each operator as it may be spelled in the source: its words whole, any spacing between them.
_OP_PATTERN: dict[type[ast.cmpop], re.Pattern[str]] = {
    op: re.compile(r"\s+".join(rf"\b{word}\b" if word.isalpha() else re.escape(word) for word in text.split()))
    for op, text in _OP_TEXT.items()
}


def _source_between(lines: list[bytes], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The source text between two (line, byte column) positions."""
    (line, column), (end_line, end_column) = start, end
    if line == end_line:
        return lines[line - 1][column:end_column].decode()
    return (lines[line - 1][column:] + b"".join(lines[line : end_line - 1]) + lines[end_line - 1][:end_column]).decode()


def _inverted(assertion: ast.stmt, lines: list[bytes]) -> list[_Edit] | None:
    """Edits of the source text only (the rest of the line keeps its quotes and spacing)."""
    if isinstance(assertion, ast.Assert):
        test = assertion.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _INVERSE_OPS:
            left, right = test.left, test.comparators[0]
            # Between the operands lie the brackets that close the left one and open the right
            # one (`(a - b) == c`), and maybe a comment: only the operator itself changes.
            start, end = (left.end_lineno, left.end_col_offset), (right.lineno, right.col_offset)
            between = _source_between(lines, start, end)
            uncommented = re.sub(r"#[^\n]*", lambda comment: " " * len(comment.group()), between)
            found = _OP_PATTERN[type(test.ops[0])].search(uncommented)
            if found is None:
                return None
            operator = _OP_TEXT[_INVERSE_OPS[type(test.ops[0])]]
            return [_Edit(start, end, f"{between[: found.start()]}{operator}{between[found.end() :]}")]
        start, end = (test.lineno, test.col_offset), (test.end_lineno, test.end_col_offset)
        return [_Edit(end, end, ")"), _Edit(start, start, "not (")]
    func = assertion.value.func
    inverse = _INVERSE_METHODS.get(func.attr)
    if inverse is None:
        return None
    # The method name is the attribute's last characters.
    return [_Edit((func.end_lineno, func.end_col_offset - len(func.attr)), (func.end_lineno, func.end_col_offset), inverse)]


def _failing_first(function: ast.FunctionDef, tree: ast.Module, lines: list[bytes]) -> list[_Edit]:
    """The fallback: an assertion that cannot hold, as the copy's first statement, on a name the
    file itself defines or imports (`lines`: the file's source)."""
    names = [alias.asname or alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names]
    names += [target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets if isinstance(target, ast.Name)]
    name = next((name for name in names if name != "*"), function.name)
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str) and len(function.body) > 1:
        first = function.body[1]  # after a docstring
    assertion = f"assert {name} is not {name}"
    # It goes on a line of its own before the statement's first line (its decorators', for a
    # nested def or class), with that line's own indentation, tabs included: spaces before a
    # tab-indented line would not parse. A statement on its `def`'s line (or after a `;`) is a
    # simple one, so the assertion joins it there with a semicolon.
    start = min([first.lineno, *(decorator.lineno for decorator in getattr(first, "decorator_list", []))])
    if start == first.lineno and not lines[start - 1][: first.col_offset].isspace():
        return [_Edit((first.lineno, first.col_offset), (first.lineno, first.col_offset), f"{assertion}; ")]
    line = lines[start - 1]
    indent = line[: len(line) - len(line.lstrip())]
    return [_Edit((start, len(indent)), (start, len(indent)), f"{assertion}\n{indent.decode()}")]


def _first_line(function: ast.FunctionDef) -> int:
    """The line `function`'s source starts on, its decorators included."""
    return min([function.lineno, *(decorator.lineno for decorator in function.decorator_list)])


def _copy(lines: list[bytes], function: ast.FunctionDef, edits: list[_Edit], name: str) -> bytes:
    """The source of `function` (its decorators included) with `edits` applied, named `name`."""
    start = _first_line(function)
    segment = [bytearray(line) for line in lines[start - 1 : function.end_lineno]]
    # From the last edit back, so earlier positions still hold; an insertion at a point sorts
    # after a replacement ending there only when listed so (`_inverted` lists its ")" first).
    for edit in sorted(edits, key=lambda edit: (edit.start, edit.end), reverse=True):
        (line, column), (end_line, end_column) = edit.start, edit.end
        first, last = segment[line - start], segment[end_line - start]
        merged = first[:column] + edit.text.encode() + last[end_column:]
        segment[line - start : end_line - start + 1] = [merged]
    def_line = function.lineno - start
    segment[def_line] = bytearray(re.sub(rb"\bdef\s+" + re.escape(function.name.encode()) + rb"\b", b"def " + name.encode(), bytes(segment[def_line]), count=1))
    return b"".join(bytes(line) for line in segment)


def _fresh_name(test: _Test, tests: list[_Test], taken: set[str], rng: random.Random) -> str:
    """A test name in the style of the file's own (snake or camel case, their words), unused."""
    names = [other.node.name for other in tests if other.scope is test.scope]
    words = sorted({word.lower() for other in tests for word in _WORD.findall(other.node.name.removeprefix("test")) if len(word) > 1})
    words += sorted(
        {node.id.lower() for node in ast.walk(test.node) if isinstance(node, ast.Name) and len(node.id) > 2 and node.id.isidentifier() and "_" not in node.id} - set(words)
    )
    words = words or ["case", "value", "result", "check"]
    camel = sum(bool(re.match(r"test[A-Z]", name)) for name in names) > len(names) / 2
    while True:
        chosen = rng.sample(words, min(len(words), rng.choice((1, 2, 2, 3))))
        name = "test" + "".join(word.capitalize() for word in chosen) if camel else "test_" + "_".join(chosen)
        if name not in taken:
            return name
        words.append(rng.choice(["again", "more", "other", "extra", "second", "edge", "basic"]))
