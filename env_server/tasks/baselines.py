"""Trivial baselines: submissions that need no understanding of the task, scored against its checks.

A policy under RL pressure tries the cheapest answers first: a type's default, an argument handed
back unchanged, an output it was shown, the answer most tasks of its kind have, a lookup of the shown
examples, a stub that raises. A task any of these earns reward on teaches that shortcut, so the
validity gate (`env_server.tasks.validation`) serves a task only if every baseline here scores 0.

Call-table tasks (`TaskSpec.hidden_calls`) are scored on the host, without a sandbox: each baseline's
answer to every hidden call is fed through the grader's own judge (`call_checks.judge_calls`) and the
task's own reward rule, exactly as a harness line from the grading sandbox would be. A whole suite
is checked in seconds.

Pytest-mode tasks need their tests to run; `hole_baselines` writes the workspace variants ("delete
the body": every stub's body becomes `return None`, or returns its first parameter) that the gate
then grades in a sandbox.

What the agent can see (`VisibleInfo`) is read from the prompt, the workspace files and the visible
tests: every literal value (sub-values included; JSON held in strings too) and every example call
whose result is shown (`assert f(x) == y`, doctest lines, `f(x) == y` in the prompt).
"""

from __future__ import annotations

import ast
import collections
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from env_server.grading import call_checks
from env_server.grading.in_sandbox import typed_values
from env_server.models import CallCheck, TaskSpec

TYPE_DEFAULTS: tuple[Any, ...] = (None, 0, 0.0, "", [], {}, (), set(), False, True, b"")
"""The constants a stub returns when its author only wants the types to line up."""

MAX_VISIBLE_VALUES = 2000
"""At most this many distinct visible values are tried as constant answers (the first found)."""

_DOCTEST_CALL = re.compile(r"^\s*>>>\s*(.+)$")
_NUMBER = re.compile(r"(?<![\w.])-?\d{1,30}(?:\.\d{1,30})?(?!\w|\.\d)")
_QUOTED = re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`([^`\n]{1,200})`")
_CODE_BLOCK = re.compile(r"```(?:python|py)?\n(.*?)```", re.DOTALL)
_STUB_EXCEPTION = "NotImplementedError"


class BaselineScore(BaseModel):
    """What one trivial baseline earned on a task."""

    name: str
    """The baseline's family: `default`, `identity`, `shown_output`, `most_common_hidden`, `lookup`,
    `raises` (host-scored), or `untouched`, `emptied`, `body:return_none`, `body:identity` (graded)."""

    reward: float
    """The reward the task's own rule gives it; the worst (highest) variant of the family."""

    variant: str = ""
    """Which variant earned `reward` (e.g. the constant `0`, argument 1)."""


@dataclass
class VisibleInfo:
    """Everything a policy could copy from what it is shown."""

    values: dict[str, Any] = field(default_factory=dict)
    """Every literal value seen, by canonical encoding (first seen first)."""

    examples: set[tuple[str, str]] = field(default_factory=set)
    """(function name, canonical encoding of [args, kwargs]) of every call whose result is shown."""

    def add(self, value: Any) -> None:
        """Record `value` and, recursively, its parts."""
        try:
            key = typed_values.canonical(typed_values.encode_strict(value))
        except (typed_values.Unencodable, RecursionError):
            return
        if key in self.values or len(self.values) >= MAX_VISIBLE_VALUES:
            return
        self.values[key] = value
        parts = value.items() if isinstance(value, dict) else value if isinstance(value, list | tuple | set | frozenset) else ()
        for part in parts:
            if isinstance(part, tuple) and isinstance(value, dict):
                self.add(part[0])
                self.add(part[1])
            else:
                self.add(part)
        if isinstance(value, str) and value[:1] in "[{":
            try:
                self.add(json.loads(value))
            except (ValueError, RecursionError):
                pass

    def shows(self, value: Any) -> bool:
        try:
            return typed_values.canonical(typed_values.encode_strict(value)) in self.values
        except (typed_values.Unencodable, RecursionError):
            return False


def visible_info(task: TaskSpec) -> VisibleInfo:
    """The literals and example calls in the prompt, the workspace files and the visible tests."""
    seen = VisibleInfo()
    sources = [*task.files.values(), *task.visible_tests.values(), *_CODE_BLOCK.findall(task.prompt)]
    for text in sources:
        try:
            _read_tree(ast.parse(text), seen)
        except (SyntaxError, ValueError, RecursionError):
            pass
    for text in [task.prompt, *sources]:
        _read_prose(text, seen)
    return seen


def _literal_text(text: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False, None


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False, None


def _record_example(call: ast.AST, result: ast.AST, seen: VisibleInfo) -> None:
    """`call` is `f(literals...)` or `mod.f(...)` and `result` a literal: a shown example."""
    if not isinstance(call, ast.Call):
        return
    name = call.func.id if isinstance(call.func, ast.Name) else call.func.attr if isinstance(call.func, ast.Attribute) else None
    args = [_literal(arg) for arg in call.args]
    kwargs = {keyword.arg: _literal(keyword.value) for keyword in call.keywords if keyword.arg}
    known, value = _literal(result)
    if name is None or not known or not all(ok for ok, _ in [*args, *kwargs.values()]):
        return
    key = _call_key([value for _, value in args], {name_: value for name_, (_, value) in kwargs.items()})
    if key is not None:
        seen.examples.add((name, key))
    seen.add(value)


def _read_tree(tree: ast.AST, seen: VisibleInfo) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq | ast.Is):
            _record_example(node.left, node.comparators[0], seen)
            _record_example(node.comparators[0], node.left, seen)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("assert") and len(node.args) >= 2:
            _record_example(node.args[0], node.args[1], seen)
            _record_example(node.args[1], node.args[0], seen)
        if isinstance(node, ast.Constant | ast.List | ast.Tuple | ast.Dict | ast.Set | ast.UnaryOp):
            known, value = _literal(node)
            if known:
                seen.add(value)


def _read_prose(text: str, seen: VisibleInfo) -> None:
    """Numbers, quoted and back-quoted literals, doctest lines (`>>> f(x)` then the result) and
    `f(x) == y` / `f(x) -> y` pieces of prose."""
    for number in _NUMBER.findall(text):
        seen.add(float(number) if "." in number else int(number))
    for quoted in _QUOTED.finditer(text):
        known, value = _literal_text(quoted.group(1) or quoted.group(0))
        if known:
            seen.add(value)
    lines = text.splitlines()
    for index, line in enumerate(lines):
        doctest = _DOCTEST_CALL.match(line)
        if doctest and index + 1 < len(lines) and not _DOCTEST_CALL.match(lines[index + 1]):
            _read_expression_pair(doctest.group(1), lines[index + 1].strip(), seen)
        for piece in re.split(r";|\. |, and ", line):
            for operator in ("==", "->", "=>", "➞", "→"):
                left, found, right = piece.partition(operator)
                if found:
                    _read_expression_pair(left.strip(" `\t:"), right.strip(" `\t.:"), seen)


_PIECE_CHARS = 200
"""How far around an `==` or `->` the prose reader looks for the call and its result."""


def _expression(text: str, *, from_end: bool) -> ast.expr | None:
    """The longest expression ending (`from_end`) or starting at an end of `text`, cut at spaces:
    `Examples: f(2)` gives `f(2)`, `4 (twice 2)` gives `4`."""
    text = text[-_PIECE_CHARS:] if from_end else text[:_PIECE_CHARS]
    cuts = [index + 1 for index, char in enumerate(text) if char == " "] if from_end else [
        index for index, char in enumerate(text) if char == " "
    ]
    candidates = [text, *(text[cut:] for cut in cuts)] if from_end else [text, *(text[:cut] for cut in reversed(cuts))]
    for candidate in candidates:
        try:
            return ast.parse(candidate.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return None


def _read_expression_pair(call_text: str, result_text: str, seen: VisibleInfo) -> None:
    call, result = _expression(call_text, from_end=True), _expression(result_text, from_end=False)
    if result is None:
        return
    if call is not None:
        _record_example(call, result, seen)
    known, value = _literal(result)
    if known:
        seen.add(value)


def _call_key(args: list[Any], kwargs: dict[str, Any]) -> str | None:
    try:
        return typed_values.canonical(typed_values.encode_strict([list(args), dict(kwargs)]))
    except (typed_values.Unencodable, RecursionError):
        return None


# ------------------------------------------------------------------------------------------------
# Call tables, scored on the host


Answer = Callable[[int, CallCheck], dict[str, Any]]
"""A baseline's harness line for call `index` (`{"i": index, "returned": ...}` or `"raised"`)."""


def _returned(value: Any, check: CallCheck, index: int) -> dict[str, Any]:
    """The harness line for call `index` answering `value` (arguments left as they were)."""
    if check.json_result:
        try:
            value = json.loads(json.dumps(value))
        except (TypeError, ValueError, RecursionError):
            return {"i": index, "returned": list(typed_values.UNENCODABLE)}
    line: dict[str, Any] = {"i": index, "returned": typed_values.encode(value)}
    if check.expected_args is not None:
        line["args"] = check.args
    return line


def _score(task: TaskSpec, answer: Answer) -> float:
    """The task's reward for `answer`, judged call by call as the grader judges harness lines
    (an all-or-nothing task stops at the first failing call)."""
    passed = 0
    for index, check in enumerate(task.hidden_calls):
        if call_checks.judge_outcome(check, answer(index, check))[0]:
            passed += 1
        elif task.reward_mode == "binary":
            return 0.0
    return task.reward_for(passed, len(task.hidden_calls))


def constant_reward(task: TaskSpec, value: Any) -> float:
    """The reward a submission that returns `value` from every hidden call would get."""
    return _score(task, lambda index, check: _returned(value, check, index))


def _worst(name: str, variants: Iterator[tuple[str, float]]) -> BaselineScore:
    worst = BaselineScore(name=name, reward=0.0)
    for variant, reward in variants:
        if reward > worst.reward or not worst.variant:
            worst = BaselineScore(name=name, reward=reward, variant=variant)
        if reward >= 1.0:
            break
    return worst


def _decoded(check: CallCheck) -> tuple[list[Any], dict[str, Any]]:
    return [typed_values.decode(arg) for arg in check.args], {name: typed_values.decode(value) for name, value in check.kwargs.items()}


def plain_checks(checks: Iterable[CallCheck]) -> list[CallCheck]:
    """The calls that expect a value (not an exception, not a judge's verdict)."""
    return [check for check in checks if check.raises is None and check.judge is None]


def _commonest_expected(checks: Iterable[CallCheck]) -> Any:
    """The expected value most of the plain `checks` share (None when there is none)."""
    counts = collections.Counter(typed_values.canonical(check.expected) for check in plain_checks(checks))
    return typed_values.decode(json.loads(counts.most_common(1)[0][0])) if counts else None


def call_table_baselines(task: TaskSpec, seen: VisibleInfo | None = None) -> list[BaselineScore]:
    """Every host-scored baseline's worst variant on a call-table task."""
    seen = seen if seen is not None else visible_info(task)
    checks = task.hidden_calls
    decoded = [_decoded(check) for check in checks]
    positions = {index for args, _ in decoded for index in range(len(args))}
    keywords = {name for _, kwargs in decoded for name in kwargs}

    def argument(which: int | str) -> float:
        def answer(index: int, check: CallCheck) -> dict[str, Any]:
            args, kwargs = decoded[index]
            present = which in kwargs if isinstance(which, str) else which < len(args)
            return _returned((kwargs[which] if isinstance(which, str) else args[which]) if present else None, check, index)

        return _score(task, answer)

    common = _commonest_expected(checks)
    scores = [
        _worst("default", ((repr(value), constant_reward(task, value)) for value in TYPE_DEFAULTS)),
        _worst("identity", ((f"argument {which}", argument(which)) for which in [*sorted(positions), *sorted(keywords)])),
        _worst("shown_output", ((repr(value)[:60], constant_reward(task, value)) for value in seen.values.values())),
        BaselineScore(name="most_common_hidden", reward=constant_reward(task, common), variant=repr(common)[:60]),
        _lookup_baseline(task, seen, decoded),
        _worst("raises", ((name, _raising_reward(task, name)) for name in _exception_names(task))),
    ]
    return scores


def _lookup_baseline(task: TaskSpec, seen: VisibleInfo, decoded: list[tuple[list[Any], dict[str, Any]]]) -> BaselineScore:
    """Answer a call the agent was shown with a shown value (when its result was shown at all),
    every other call with the answer most of those others share."""
    shown = []
    for check, (args, kwargs) in zip(task.hidden_calls, decoded, strict=True):
        key = _call_key(args, kwargs)
        inputs = [args, tuple(args), kwargs, *([args[0]] if len(args) == 1 and not kwargs else [])]
        was_shown = (check.function, key) in seen.examples or any(seen.shows(value) for value in inputs if value != [] and value != {})
        shown.append(was_shown and check.expected is not None and seen.shows(typed_values.decode(check.expected)))
    guess = _commonest_expected(check for check, is_shown in zip(task.hidden_calls, shown, strict=True) if not is_shown)
    reward = _score(task, lambda index, check: _returned(typed_values.decode(check.expected) if shown[index] else guess, check, index))
    return BaselineScore(name="lookup", reward=reward, variant=f"{sum(shown)} shown, else {guess!r}"[:80])


def _exception_names(task: TaskSpec) -> list[str]:
    raised = collections.Counter(check.raises for check in task.hidden_calls if check.raises)
    return [_STUB_EXCEPTION, *(name for name, _ in raised.most_common(1) if name != _STUB_EXCEPTION)]


def _raising_reward(task: TaskSpec, name: str) -> float:
    return _score(task, lambda index, _: {"i": index, "raised": name})


# ------------------------------------------------------------------------------------------------
# Pytest-mode workspaces: "delete the body"


def _is_stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == _STUB_EXCEPTION


def _first_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    names = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]]
    names = names[1:] if names and names[0] in ("self", "cls") else names
    return names[0] if names else None


def _stubs(text: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_stub(node)]


def _replace_bodies(text: str, statement: Any) -> str:
    """`text` with every stub's raising statement replaced by `statement(function)`."""
    lines = text.splitlines(keepends=True)
    for function in sorted(_stubs(text), key=lambda node: node.body[-1].lineno, reverse=True):
        raising = function.body[-1]
        indent = " " * raising.col_offset
        start, end = raising.lineno - 1, (raising.end_lineno or raising.lineno)
        lines[start:end] = [f"{indent}{statement(function)}\n"]
    return "".join(lines)


def hole_baselines(task: TaskSpec) -> dict[str, dict[str, str]]:
    """Workspace files of the "delete the body" baselines, by name: every function of the task's
    files whose body only raises `NotImplementedError` returns None (`body:return_none`) or its first
    parameter unchanged (`body:identity`). Empty when the task has no such stub."""
    holes = {path: text for path, text in task.files.items() if path.endswith(".py") and _stubs(text)}
    if not holes:
        return {}
    return {
        "body:return_none": {path: _replace_bodies(text, lambda _: "return None") for path, text in holes.items()},
        "body:identity": {
            path: _replace_bodies(text, lambda function: f"return {_first_parameter(function) or 'None'}") for path, text in holes.items()
        },
    }
