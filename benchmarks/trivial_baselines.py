"""Trivial-baseline reward per suite: what a constant, an echo, a shown output, the most common hidden
output, a lookup of the shown examples or a raising stub earns, scored on the host against every
call-table task's hidden calls (the validity gate's host side, `env_server.tasks.baselines`).

    python benchmarks/trivial_baselines.py [--suites builtin humaneval warmup codeio] [--before REV] [--tiny]

For each suite: tasks built, tasks the gate refused, tasks served, and among the served the share that
any baseline earns reward on (the goal is 0) and the mean of the best baseline's reward. `--before REV`
also scores the suites as revision REV built them (a git worktree, each task dumped by that revision's
own code, then scored here without the gate), for a before/after table in one run. `--tiny` (CI's run):
the builtin suite only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from env_server.models import TaskSpec
from env_server.tasks import StaticSuite, default_registry
from env_server.tasks.baselines import call_table_baselines

DEFAULT_SUITES = ["builtin", "humaneval", "warmup", "codeio"]
_DUMP = """
import json, sys
from env_server.tasks import default_registry
registry = default_registry()
with open(sys.argv[1], "w") as out:
    for suite in sys.argv[2:]:
        for task_id in registry.ids(suite):
            out.write(json.dumps([suite, registry.get(task_id).model_dump(mode="json")]) + "\\n")
"""


def row(name: str, served: Iterable[TaskSpec], rejected: int) -> str:
    tasks = list(served)
    best = [max((score.reward for score in call_table_baselines(task)), default=0.0) for task in tasks if task.hidden_calls]
    paid = sum(reward > 0 for reward in best)
    mean = sum(best) / len(best) if best else 0.0
    return (f"| {name} | {len(tasks) + rejected} | {rejected} | {len(tasks)} | {paid} ({paid / max(len(best), 1):.1%}) "
            f"| {sum(reward >= 1.0 for reward in best)} | {mean:.3f} |")


def before_rows(revision: str, suites: list[str]) -> list[str]:
    """The suites as `revision` built them, scored here without the gate."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as scratch:
        tree, dump = Path(scratch) / "tree", Path(scratch) / "tasks.jsonl"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), revision], check=True, capture_output=True)
        try:
            subprocess.run([sys.executable, "-c", _DUMP, str(dump), *suites], cwd=tree, check=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=True, capture_output=True)
        by_suite: dict[str, list[TaskSpec]] = {suite: [] for suite in suites}
        for line in dump.read_text().splitlines():
            suite, spec = json.loads(line)
            by_suite[suite].append(TaskSpec.model_validate(spec))
    return [row(f"{suite} (at {revision})", tasks, 0) for suite, tasks in by_suite.items()]


HEADER = ("| suite | tasks built | refused by the gate | served | served tasks a baseline earns reward on "
          "| ... earns 1.0 on | mean best-baseline reward |\n|---|---|---|---|---|---|---|")


def after_rows(suites: list[str]) -> list[str]:
    registry = default_registry()
    rows = []
    for suite in suites:
        loaded = registry.suite(suite)
        rejected = len(loaded.rejected) if isinstance(loaded, StaticSuite) else 0
        rows.append(row(suite, (registry.get(task_id) for task_id in registry.ids(suite)), rejected))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", nargs="+", default=DEFAULT_SUITES)
    parser.add_argument("--before", help="also score the suites as this git revision built them")
    parser.add_argument("--tiny", action="store_true", help="the builtin suite only, in seconds")
    args = parser.parse_args()
    if args.tiny:
        args.suites = ["builtin"]
    print(HEADER)
    if args.before:
        print("\n".join(before_rows(args.before, args.suites)))
    print("\n".join(after_rows(args.suites)))


if __name__ == "__main__":
    main()
