"""Tool-call parsing at its worst: adversarial messages of a given size in every registered family's format.

    python benchmarks/parser_worst_case.py                    # the working tree's parser, 4 MiB
    python benchmarks/parser_worst_case.py --rev HEAD~3       # the parser as it was at a commit
    python benchmarks/parser_worst_case.py --families hermes,react --size-mib 1 --modes pinned
    python benchmarks/parser_worst_case.py --tiny             # one family, 64 KiB, every shape both ways (CI)

For every family, the message shapes below are built from the family's own rendering of a call
(so every family gets the same attacks in its own tokens) and parsed with the family detected
and pinned. Each case runs in a child process with a wall-clock limit (a super-linear parser
would otherwise hold the benchmark for minutes), `--repeats` times; the table gives the median
and max seconds per family and shape, and whether every reply was a sane typed result: a list
of at most 64 well-formed calls (the realistic shapes: the calls put in), or the parser's typed
error. The last lines give the worst case per family. A reply that is not sane (a case killed at its
limit, a crash, a wrong result) fails the run after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
PARSER_FILES = ("env_server/__init__.py", "env_server/tool_call_parser.py", "env_server/tool_calls")
SENTINEL = "SENTINELVALUE"
PARAMS = {"bash": ["command"], "write_file": ["path", "content"]}


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _kwargs(arguments: dict[str, str]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())


def _tags(arguments: dict[str, str], open_: Callable[[str], str], close: str) -> str:
    return "".join(f"{open_(k)}{v}{close}\n" for k, v in arguments.items())


Render = Callable[[str, dict[str, str]], str]
RENDER: dict[str, Render] = {
    "mistral": lambda n, a: f"[TOOL_CALLS]{n}[ARGS]{_json(a)}",
    "nemotron": lambda n, a: f"<TOOLCALL>[{_json({'name': n, 'arguments': a})}]</TOOLCALL>",
    "tool_calls_tag": lambda n, a: f"<tool_calls>\n{_json({'name': n, 'arguments': a})}\n</tool_calls>",
    "minimax_m2": lambda n, a: f'<minimax:tool_call>\n<invoke name="{n}">\n'
    + _tags(a, lambda k: f'<parameter name="{k}">', "</parameter>") + "</invoke>\n</minimax:tool_call>",
    "command_r": lambda n, a: f"Action: ```json\n[{_json({'tool_name': n, 'parameters': a})}]\n```",
    "gemma": lambda n, a: f"```tool_code\nprint(default_api.{n}({_kwargs(a)}))\n```",
    "deepseek": lambda n, a: f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{_json(a)}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "kimi_k2": lambda n, a: f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{n}:0<|tool_call_argument_begin|>{_json(a)}"
    "<|tool_call_end|><|tool_calls_section_end|>",
    "harmony": lambda n, a: f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_json(a)}<|call|>",
    "phi4": lambda n, a: f"functools[{_json({'name': n, 'arguments': a})}]",
    "granite": lambda n, a: f"<|tool_call|>[{_json({'name': n, 'arguments': a})}]",
    "claude_xml": lambda n, a: f'<function_calls>\n<invoke name="{n}">\n'
    + _tags(a, lambda k: f'<parameter name="{k}">', "</parameter>") + "</invoke>\n</function_calls>",
    "function_tag_json": lambda n, a: f"<function={n}>{_json(a)}</function>",
    "qwen3_coder": lambda n, a: f"<tool_call>\n<function={n}>\n" + _tags(a, lambda k: f"<parameter={k}>\n", "\n</parameter>")
    + "</function>\n</tool_call>",
    "glm45": lambda n, a: f"<tool_call>{n}\n" + _tags(a, lambda k: f"<arg_key>{k}</arg_key>\n<arg_value>", "</arg_value>")
    + "</tool_call>",
    "hermes": lambda n, a: f"<tool_call>\n{_json({'name': n, 'arguments': a})}\n</tool_call>",
    "llama3_json": lambda n, a: f"<|python_tag|>{_json({'name': n, 'parameters': a})}<|eom_id|>",
    "react": lambda n, a: f"Thought: go\nAction: {n}\nAction Input: {_json(a)}\nObservation:",
    "llama3_pythonic": lambda n, a: f"[{n}({_kwargs(a)})]",
    "xlam": lambda n, a: f"[{_json({'name': n, 'arguments': a})}]",
    "fenced_json": lambda n, a: f"```json\n{_json({'name': n, 'arguments': a})}\n```",
    "bare_json": lambda n, a: f"I will run {_json({'name': n, 'arguments': a})} now.",
}
"""Each family's rendering of one call, as its chat template writes it."""

CODE_LINE = 'if x["k"] == "}" and y < 3: print("</tool_call>", {"a": [1, 2]}, end="\\n")  # </parameter>\n'
"""A line of code an agent writes: quotes, braces, brackets, tag-like text, a fence."""


def _fill(unit: str, size: int) -> str:
    return (unit * (size // max(len(unit), 1) + 1))[:size]


def _whole(unit: str, size: int) -> str:
    """`unit` repeated whole, at most `size` characters: an escaped value cut inside an escape sequence
    would no longer be the call put in (its closing quote escaped), at some sizes and not others."""
    return unit * (size // max(len(unit), 1))


def _split(family: str, name: str = "bash", key: str = "command") -> tuple[str, str]:
    """The family's call of `name` cut where the value of its argument `key` goes."""
    head, tail = RENDER[family](name, {"path": "a.py", key: SENTINEL} if key == "content" else {key: SENTINEL}).split(SENTINEL)
    return head, tail


def _around(family: str, size: int, value: Callable[[int], str]) -> str:
    """One `write_file` call of `family` whose `content` is `value(n)`, the whole message `size` characters."""
    head, tail = _split(family, "write_file", "content")
    return head + value(max(size - len(head) - len(tail), 0)) + tail


def _opener(family: str) -> str:
    """The family's call up to the start of an argument's value: what an unclosed call repeats."""
    return _split(family)[0]


def _closer(family: str) -> str:
    return _split(family)[1]


def _escaped(family: str, text: str) -> str:
    """`text` as the family's rendering writes a string value (escaped for JSON/Python, raw for tags)."""
    shell = RENDER[family]("x", {"v": 'a"b'})
    if 'a\\"b' in shell:
        return _json(text)[1:-1]
    return repr(text)[1:-1] if "'a\"b'" in shell else text


Shape = Callable[[str, int], str]
SHAPES: dict[str, Shape] = {
    # One call writing a big file: the common large message.
    "realistic": lambda f, n: _around(f, n, lambda k: _whole(_escaped(f, CODE_LINE), k)),
    # The same with no newline anywhere (one long line).
    "one_line": lambda f, n: _around(f, n, lambda k: _whole(_escaped(f, CODE_LINE.replace("\n", " ")), k)),
    # Many small calls (the parser reads at most 64).
    "many_calls": lambda f, n: _fill(RENDER[f]("bash", {"command": "ls"}) + "\n", n),
    # The call's text with its quotes unescaped: JSON repair's path.
    "unescaped_code": lambda f, n: _around(f, n, lambda k: _fill(CODE_LINE, k)),
    # A call cut off inside one huge argument (no closing quote, brace or tag).
    "truncated_argument": lambda f, n: _fill(_opener(f), len(_opener(f))) + _fill("x", n - len(_opener(f))),
    # The opening of a call repeated, never closed.
    "unclosed_openers": lambda f, n: _fill(_opener(f), n),
    # Half of the opening token repeated: long runs of partial tags.
    "partial_tags": lambda f, n: _fill(_opener(f)[: max(len(_opener(f)) // 2, 1)], n),
    # Closing tokens repeated after one opening.
    "closers": lambda f, n: _opener(f) + _fill(_closer(f), n - len(_opener(f))),
    # Brackets and objects nested as deep as the size allows, inside a call.
    "deep_brackets": lambda f, n: _opener(f) + _fill("[", (n - len(_opener(f))) // 2) + _fill("]", (n - len(_opener(f))) // 2),
    "deep_objects": lambda f, n: _opener(f) + _fill('{"a":', n - len(_opener(f))),
    # Every family's opening, interleaved (detection tries them all).
    "mixed_formats": lambda f, n: _fill("".join(_opener(g) for g in sorted(RENDER)) + "\n", n),
    # Reasoning markers: unclosed blocks and lone closers.
    "reasoning_openers": lambda f, n: _fill("<think>[THINK]<|channel|>analysis<|message|>", n - 200) + RENDER[f]("bash", {"command": "ls"}),
    "reasoning_closers": lambda f, n: _fill("</think>◁/think▷[/THINK]", n - 200) + RENDER[f]("bash", {"command": "ls"}),
}
"""Adversarial (and realistic) message shapes, each built for a family at a size in characters."""

EXPECTED_CALLS: dict[str, range] = {"realistic": range(1, 2), "one_line": range(1, 2), "many_calls": range(32, 65)}
"""Shapes whose calls are known, and how many the reply must hold (a family that counts a call's
inner object as a marker reads 32 of its 64 markers' calls)."""


def _run_case(family: str, shape: str, size: int, pinned: bool) -> dict[str, Any]:
    """Parse one message in this process: seconds taken and a verdict on the reply."""
    from env_server import tool_call_parser

    text = SHAPES[shape](family, size)
    started = time.perf_counter()
    try:
        calls = tool_call_parser.parse_tool_calls(text, PARAMS, family=family if pinned else None)
        reply = f"{len(calls)} calls"
    except tool_call_parser.ToolCallParseError as exc:
        calls, reply = None, f"{type(exc).__name__}"
    seconds = time.perf_counter() - started
    sane = calls is None or (
        len(calls) <= 64 and all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in calls)
    )
    expected = EXPECTED_CALLS.get(shape)
    if expected is not None and pinned:
        sane = sane and calls is not None and len(calls) in expected
        if shape in ("realistic", "one_line") and calls:
            sane = sane and len(str(calls[0].arguments.get("content", ""))) > size // 3
    return {"seconds": seconds, "reply": reply, "sane": sane}


def _child(args: argparse.Namespace, family: str, shape: str, pinned: bool, source: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", family, shape, str(args.size), "1" if pinned else "0"]
    env = {**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=source)
    except subprocess.TimeoutExpired:
        return {"seconds": float(args.timeout), "reply": f"> {args.timeout:g} s (killed)", "sane": False, "timed_out": True}
    if done.returncode != 0:
        return {"seconds": float("nan"), "reply": "crashed: " + done.stderr.strip().splitlines()[-1][:60], "sane": False}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _source(rev: str | None, scratch: Path) -> Path:
    """A directory whose `env_server` package holds the parser: the working tree's, or `rev`'s."""
    if rev is None:
        return REPO
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, *PARSER_FILES], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    return scratch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=float, default=4.0, help="message size in MiB (of characters)")
    parser.add_argument("--repeats", type=int, default=3, help="timed parses per case")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case is killed")
    parser.add_argument("--rev", help="time the parser as it was at this git revision")
    parser.add_argument("--families", help="comma-separated families (default: every registered one)")
    parser.add_argument("--shapes", help="comma-separated shapes (default: all)")
    parser.add_argument("--modes", default="detect,pinned", help="detect (family found per message), pinned, or both")
    parser.add_argument("--tiny", action="store_true", help="hermes only, 64 KiB, once: every shape and mode, in seconds")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        args.families, args.size_mib, args.repeats = "hermes", 1 / 16, 1
    if args.one:
        family, shape, size, pinned = args.one
        print(json.dumps(_run_case(family, shape, int(size), pinned == "1")))
        return
    args.size = int(args.size_mib * 1024 * 1024)
    families = args.families.split(",") if args.families else sorted(RENDER)
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    with tempfile.TemporaryDirectory() as scratch:
        source = _source(args.rev, Path(scratch))
        print(f"parser: {args.rev or 'working tree'}; {args.size_mib:g} MiB messages; {args.repeats} repeats; limit {args.timeout:g} s")
        print(f"{'family':<18} {'shape':<19} {'mode':<7} {'median s':>9} {'max s':>9}  reply")
        worst: dict[str, tuple[float, str]] = {}
        insane: list[str] = []
        for family in families:
            for shape in shapes:
                for pinned in [mode == "pinned" for mode in args.modes.split(",")]:
                    runs = []
                    for _ in range(args.repeats):
                        runs.append(_child(args, family, shape, pinned, source))
                        if runs[-1].get("timed_out"):
                            break
                    seconds = [r["seconds"] for r in runs]
                    mode = "pinned" if pinned else "detect"
                    ok = all(r["sane"] for r in runs)
                    print(f"{family:<18} {shape:<19} {mode:<7} {statistics.median(seconds):>9.3f} {max(seconds):>9.3f}  "
                          f"{runs[-1]['reply']}{'' if ok else '  NOT SANE'}", flush=True)
                    if not ok:
                        insane.append(f"{family}/{shape}/{mode}")
                    if family not in worst or max(seconds) > worst[family][0]:
                        worst[family] = (max(seconds), f"{shape} ({mode})")
        print("\nworst case per family:")
        for family, (seconds, case) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
            print(f"  {family:<18} {seconds:>8.3f} s  {case}")
        print(f"\nslowest overall: {max(s for s, _ in worst.values()):.3f} s; replies not sane: {', '.join(insane) or 'none'}")
        if insane:
            raise SystemExit(f"replies not sane: {', '.join(insane)}")


if __name__ == "__main__":
    main()
