"""Write malformed_calls.jsonl: realistic broken tool calls, each with the call it meant.

    python tests/service/data/generate_malformed_calls.py

Every base call (below) is rendered through every malformation that applies to it: the ways
LLMs break tool calls in practice (trailing commas, raw newlines and unescaped quotes inside
code strings, single quotes, Python literals, truncated closers, prose around the call,
fences, wrong nesting, arguments as a JSON string, XML parameter format). Deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

OUT = Path(__file__).with_name("malformed_calls.jsonl")

BASE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("bash", {"command": "ls -la"}),
    ("bash", {"command": "python3 -m pytest -q tests/test_parser.py -k 'empty or unicode'"}),
    ("bash", {"command": "grep -rn \"TODO\" src | head -20"}),
    ("bash", {"command": "sed -n '10,40p' app/models.py", "timeout_s": 10}),
    ("bash", {"command": "cd /workspace && python3 -c \"import solution; print(solution.fizzbuzz(15))\""}),
    ("read_file", {"path": "solution.py"}),
    ("read_file", {"path": "src/utils/strings.py", "start_line": 10, "end_line": 42}),
    ("list_dir", {"path": "src"}),
    ("search", {"pattern": "def (parse|load)_\\w+", "path": "src"}),
    ("search", {"pattern": "class .*Error"}),
    ("run_tests", {}),
    ("submit", {}),
    ("write_file", {"path": "solution.py", "content": "def fizzbuzz(n: int) -> str:\n    if n % 15 == 0:\n        return \"FizzBuzz\"\n    if n % 3 == 0:\n        return \"Fizz\"\n    return str(n)\n"}),
    ("write_file", {"path": "greet.py", "content": "def greet(name):\n    return f\"Hello, {name}!\"\n\n\nif __name__ == \"__main__\":\n    print(greet('world'))\n"}),
    ("write_file", {"path": "config.py", "content": "DEFAULTS = {\"retries\": 3, \"timeout\": 2.5, \"tags\": [\"a\", \"b\"]}\n"}),
    ("write_file", {"path": "paths.py", "content": "import re\n\nWINDOWS = re.compile(r\"^[A-Z]:\\\\\")\nTAB = \"\\t\"\n"}),
    ("write_file", {"path": "notes/README.md", "content": "# Notes\n\nUse `make test` to run the \"fast\" suite.\n"}),
    ("edit_file", {"path": "stats.py", "old_str": "    return sorted(xs)[len(xs) // 2]\n", "new_str": "    s = sorted(xs)\n    mid = len(s) // 2\n    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2\n"}),
    ("edit_file", {"path": "counter.py", "old_str": "words = text.split(\" \")", "new_str": "words = text.split()"}),
    ("edit_file", {"path": "app.py", "old_str": "print('debug')\n", "new_str": ""}),
]


OPTIONAL_NONE = {"bash": "timeout_s", "read_file": "end_line"}
"""An optional parameter per tool that models like to send as Python's None."""


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def call_json(name: str, args: dict[str, Any]) -> str:
    return dumps({"name": name, "arguments": args})


def _raw_json_string(value: str) -> str:
    """A JSON string as models often write it: real newlines and tabs, escaped quotes."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unescaped_json_string(value: str) -> str:
    """Worse: real newlines AND unescaped double quotes inside the string."""
    return '"' + value + '"'


def _object_with(args: dict[str, Any], render: Callable[[str], str]) -> str:
    parts = [f"{dumps(k)}: {render(v) if isinstance(v, str) else dumps(v)}" for k, v in args.items()]
    return "{" + ", ".join(parts) + "}"


def _has_code(args: dict[str, Any]) -> bool:
    return any(isinstance(v, str) and ("\n" in v or '"' in v) for v in args.values())


# Each malformation: (category, applies(name, args), render(name, args) -> text).
MALFORMATIONS: list[tuple[str, Callable[[str, dict], bool], Callable[[str, dict], str]]] = [
    ("trailing_comma", lambda n, a: True,
     lambda n, a: hermes(call_json(n, a)[:-2] + (",},}" if a else "},"))),
    ("raw_newlines", lambda n, a: any(isinstance(v, str) and "\n" in v for v in a.values()),
     lambda n, a: hermes('{"name": %s, "arguments": %s}' % (dumps(n), _object_with(a, _raw_json_string)))),
    ("unescaped_quotes", lambda n, a: _has_code(a),
     lambda n, a: hermes('{"name": %s, "arguments": %s}' % (dumps(n), _object_with(a, _unescaped_json_string)))),
    ("single_quotes", lambda n, a: not any(isinstance(v, str) and ("'" in v or "\\" in v) for v in a.values()),
     lambda n, a: hermes(repr({"name": n, "arguments": a}))),
    ("python_literals", lambda n, a: n in OPTIONAL_NONE,
     lambda n, a: hermes(call_json(n, {OPTIONAL_NONE[n]: None, **a}).replace("null", "None"))),
    ("truncated_closers", lambda n, a: True,
     lambda n, a: "<tool_call>\n" + call_json(n, a)[:-2]),
    ("truncated_tag_only", lambda n, a: True,
     lambda n, a: "<tool_call>\n" + call_json(n, a)),
    ("prose_around", lambda n, a: True,
     lambda n, a: f"Let me take a look first.\n\n{hermes(call_json(n, a))}\n\nAfter this I will check the output."),
    ("thinking_then_call", lambda n, a: True,
     lambda n, a: f"<think>\nThe user wants {n}. I should call it with the right arguments {{like this}}.\n</think>\n{hermes(call_json(n, a))}"),
    ("fenced_json", lambda n, a: True,
     lambda n, a: f"I'll run this:\n```json\n{json.dumps({'name': n, 'arguments': a}, indent=2)}\n```"),
    ("fenced_unclosed", lambda n, a: True,
     lambda n, a: f"```\n{call_json(n, a)}"),
    ("openai_nesting", lambda n, a: True,
     lambda n, a: hermes(dumps({"type": "function", "function": {"name": n, "arguments": dumps(a)}}))),
    ("parameters_key", lambda n, a: True,
     lambda n, a: hermes(dumps({"name": n, "parameters": a}))),
    ("arguments_as_string", lambda n, a: True,
     lambda n, a: hermes(dumps({"name": n, "arguments": dumps(a)}))),
    ("list_of_calls", lambda n, a: True,
     lambda n, a: hermes(dumps([{"name": n, "arguments": a}]))),
    ("name_as_key", lambda n, a: bool(a),
     lambda n, a: hermes(dumps({n: a}))),
    ("flat_arguments", lambda n, a: bool(a) and "name" not in a,
     lambda n, a: hermes(dumps({"name": n, **a}))),
    ("double_wrapped", lambda n, a: True,
     lambda n, a: hermes(dumps({"tool_call": {"name": n, "arguments": a}}))),
    ("bare_json_in_prose", lambda n, a: True,
     lambda n, a: f"Calling the tool now: {call_json(n, a)} and then I'll continue."),
    ("xml_function", lambda n, a: True,
     lambda n, a: "<tool_call>\n<function=%s>\n%s</function>\n</tool_call>" % (
         n, "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items()))),
    ("xml_function_truncated", lambda n, a: True,
     lambda n, a: ("<function=%s>\n%s" % (n, "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items()))).rstrip("\n")),
    ("newlines_and_trailing_comma", lambda n, a: any(isinstance(v, str) and "\n" in v for v in a.values()),
     lambda n, a: hermes('{"name": %s, "arguments": %s,}' % (dumps(n), _object_with(a, _raw_json_string)[:-1] + ",}"))),
]


def main() -> None:
    rows = []
    for category, applies, render in MALFORMATIONS:
        for index, (name, args) in enumerate(BASE_CALLS):
            if applies(name, args):
                rows.append({"id": f"{category}-{index}", "category": category, "text": render(name, args),
                             "expected": {"name": name, "arguments": args}})
    with OUT.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} calls to {OUT}")


if __name__ == "__main__":
    main()
