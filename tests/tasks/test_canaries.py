"""Canaries planted from a hidden file's own tests: each fails where its original passes, in the
file's own style, the same ones at every grading, under fresh names."""

from __future__ import annotations

import ast
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from env_server.grading import canaries

HIDDEN = '''import unittest

import pytest


def double(x):
    return 2 * x


def test_double():
    assert double(2) == 4
    assert double("ab") == "abab"


@pytest.mark.parametrize("x", [1, 2])
def test_double_param(x):
    result = double(x)
    if x > 5:
        return
    assert result == x + x


def test_double_with_early_way_out():
    value = double(3)
    if value > 0:
        assert value in (6, 7)
        return
    assert value == [6][0]


class TestDouble:
    def test_list(self):
        assert double([1]) == [1, 1]


class DoubleCase(unittest.TestCase):
    def testNumbers(self):
        self.assertEqual(double(5), 10)

    def testTruth(self):
        self.assertTrue(double(1) > 1)
'''


def _outcomes(*paths: Path) -> dict[str, dict[str, bool]]:
    """Per test file (by module name), whether each of its tests passed: one pytest run for all of them, without
    the plugins installed here (the graders' pytest loads none either; autoloading them costs 1-3 s a run)."""
    report = paths[0].parent / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *map(str, paths)],
                   cwd=paths[0].parent, capture_output=True, check=False, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    outcomes: dict[str, dict[str, bool]] = {path.stem: {} for path in paths}
    for case in ElementTree.parse(report).iter("testcase"):
        classname = case.get("classname", "")
        test = f"{classname.rsplit('.', 1)[-1]}::{case.get('name', '').split('[')[0]}"
        outcomes[classname.split(".")[0]][test] = not any(child.tag in ("failure", "error") for child in case)
    return outcomes


def test_every_canary_fails_where_its_original_passes(tmp_path: Path) -> None:
    planted_by_file = {}
    for seed in range(6):
        text, planted = canaries.plant(HIDDEN, random.Random(seed))
        assert len(planted) == canaries.CANARIES_PER_FILE
        path = tmp_path / f"test_hidden_{seed}.py"
        path.write_text(text)
        planted_by_file[path] = (seed, text, planted)
    outcomes_by_file = _outcomes(*planted_by_file)
    for path, (seed, text, planted) in planted_by_file.items():
        outcomes = outcomes_by_file[path.stem]
        names = {name for _, name in planted}
        real = {test: ok for test, ok in outcomes.items() if test.split("::")[1] not in names}
        assert real and all(real.values()), real
        for scope, name in planted:
            found = [ok for test, ok in outcomes.items() if test.endswith(f"::{name}")]
            assert found and not any(found), (seed, scope, name, text)


def test_the_same_tests_are_copied_and_changed_at_every_grading_under_fresh_names() -> None:
    first, planted_first = canaries.plant(HIDDEN, random.Random(1))
    second, planted_second = canaries.plant(HIDDEN, random.Random(2))
    assert {name for _, name in planted_first} != {name for _, name in planted_second}

    def bodies(text: str, planted: list[tuple[str, str]]) -> list[str]:
        names = {name for _, name in planted}
        return sorted(
            ast.unparse(node.body) if isinstance(node.body, ast.AST) else "\n".join(ast.unparse(stmt) for stmt in node.body)
            for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef) and node.name in names
        )

    assert bodies(first, planted_first) == bodies(second, planted_second)


def test_canaries_take_the_style_of_their_scope() -> None:
    for seed in range(10):
        _, planted = canaries.plant(HIDDEN, random.Random(seed))
        for scope, name in planted:
            if scope == "DoubleCase":
                assert name.startswith("test") and name[4].isupper(), name  # camel case like testNumbers
            else:
                assert name.startswith("test_"), name
            assert not any(c in "0123456789abcdef" for c in name.removeprefix("test_").replace("_", "")) or name.isidentifier()


def test_a_file_with_no_changeable_test_gets_copies_that_fail_first_thing(tmp_path: Path) -> None:
    text = "import os\n\n\ndef test_runs():\n    if os.sep:\n        return\n    assert False\n"
    planted_text, planted = canaries.plant(text, random.Random(0))
    assert len(planted) == 2
    path = tmp_path / "test_fallback.py"
    path.write_text(planted_text)
    outcomes = _outcomes(path)["test_fallback"]
    assert outcomes["test_fallback::test_runs"] is True
    assert [ok for test, ok in outcomes.items() if test != "test_fallback::test_runs"] == [False, False]


def test_copies_that_fail_first_thing_parse_whatever_the_first_statement(tmp_path: Path) -> None:
    """Spaces before a tab-indented statement, or an assertion between a nested def and its
    decorator, would not parse: every graded test of the file would error."""
    text = (
        "import os\nimport unittest\n\n\nclass Paths(unittest.TestCase):\n"
        "\tdef test_walk(self):\n\t\t\"\"\"Docstring first.\"\"\"\n\t\tfor sep in os.sep:\n\t\t\tself.assertTrue(sep)\n\n"
        "\tdef test_inline(self): seps = [os.sep]; print(seps)\n\n"
        "\tdef test_decorated_first(self):\n\t\t@staticmethod\n\t\tdef join(*parts):\n\t\t\treturn os.sep.join(parts)\n"
        "\t\tprint(join('a', 'b'))\n"
    )
    paths = []
    for seed in range(4):
        planted_text, planted = canaries.plant(text, random.Random(seed))
        assert len(planted) == 3
        paths.append(tmp_path / f"test_tabs{seed}.py")
        paths[-1].write_text(planted_text)
    outcomes_by_file = _outcomes(*paths)
    for path in paths:
        outcomes = outcomes_by_file[path.stem]
        originals = {"Paths::test_walk", "Paths::test_inline", "Paths::test_decorated_first"}
        assert all(outcomes[test] for test in originals)
        assert [ok for test, ok in outcomes.items() if test not in originals] == [False, False, False]


def test_an_inverted_comparison_keeps_the_brackets_around_its_operands(tmp_path: Path) -> None:
    """`(a - b) == c`: the left operand's node ends before its closing bracket."""
    text = (
        "def test_difference():\n    assert (len('abc') - 1) == (len('ab'))\n\n\n"
        "def test_member():\n    assert (\n        'a'  # == in is\n    ) in ['a']\n\n\n"
        "def test_identity():\n    assert (None) is (None)\n"
    )
    planted_text, planted = canaries.plant(text, random.Random(0))
    assert len(planted) == 3
    path = tmp_path / "test_brackets.py"
    path.write_text(planted_text)
    outcomes = _outcomes(path)["test_brackets"]
    originals = {"test_brackets::test_difference", "test_brackets::test_member", "test_brackets::test_identity"}
    assert all(outcomes[test] for test in originals)
    assert [ok for test, ok in outcomes.items() if test not in originals] == [False, False, False]


def test_only_tests_the_caller_allows_are_copied() -> None:
    text = "def test_good():\n    assert 1 + 1 == 2\n\n\ndef test_broken_upstream():\n    assert 'a' == 'b'\n"
    for seed in range(5):
        planted_text, planted = canaries.plant(text, random.Random(seed), copyable=lambda scope, name: name == "test_good")
        copies = [node for node in ast.parse(planted_text).body if isinstance(node, ast.FunctionDef) and node.name in {n for _, n in planted}]
        assert copies and all("'a'" not in ast.unparse(node) for node in copies)


def test_canaries_stand_in_the_same_places_at_every_grading() -> None:
    """A copy repeats its original's side effects, so where it runs must be what the gate saw."""
    def shape(seed: int) -> list[str]:
        planted_text, planted = canaries.plant(HIDDEN, random.Random(seed))
        names = {name for _, name in planted}
        return ["<canary>" if any(name in line for name in names) else line for line in planted_text.splitlines()]

    assert shape(1) == shape(2) == shape(3)
