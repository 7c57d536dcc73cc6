"""Real-repository task yield: valid tasks per project and per generator, and what each costs.

    python benchmarks/task_generation_yield.py [--generator feature-deletion|bug-injection ...] [--n 5]
                                               [--max-tries 15] [--jobs 2] [--seed 0] [--cache-dir DIR]
                                               [--project NAME==VERSION ...] [--report-only] [--tiny]

What `coding-env tasks generate` runs (`repo_generation.generate_projects`), over the curated
default projects unless `--project` names others: pip downloads each sdist, its tests run in a
Docker sandbox, and up to `--max-tries` candidates are tried in seeded order until `--n` tasks pass
the validity gate (reference 1.0 through the real grader; untouched, emptied and "delete the body"
0). A project whose tests do not run in the sandbox is refused, and its row says why.

After each generator's table, one row of difficulty over the tasks the cache holds (medians of
`metadata["difficulty"]`, the call-depth spread, and bug injection's mutations by kind).

Resumable: the generator's own cache (`--cache-dir`, default out/task-generation-cache) holds every
tried candidate; a rerun continues, and the tables cover every run so far. `--report-only` prints the
tables of what the cache holds without generating (a long run stopped, or still going elsewhere).

`--tiny` (CI's run, offline): one task per generator from small projects packed here as sdists
(`tests/support/sdists.py`), into a scratch cache; they are known to give tasks, so a refusal or a
missing task fails the run.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from env_server.models import TaskSpec
from env_server.tasks.bug_injection import BugInjection
from env_server.tasks.feature_deletion import FeatureDeletion
from env_server.tasks.projects import DEFAULT_PROJECTS
from env_server.tasks.repo_generation import cached_reports, generate_projects, summary_table
from sandbox import SandboxSpec, open_sandbox

# The tiny run's sdists are test helpers (tests/support/sdists.py), imported from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.sdists import RANGES, local_sdist  # noqa: E402

GENERATORS = {"feature-deletion": FeatureDeletion, "bug-injection": BugInjection}
DIFFICULTY_HEADER = (
    "| suite | tasks | projects | lines changed | tests failing | hidden files | call depth (count) | mutations |\n"
    "|---|---|---|---|---|---|---|---|"
)


def difficulty_row(specs: list[TaskSpec]) -> str:
    """One Markdown row: medians of the tasks' difficulty, their call depths counted (None: no call
    path found), and their mutations by kind (bug injection)."""
    difficulties = [spec.metadata["difficulty"] for spec in specs if spec.metadata.get("difficulty")]
    if not difficulties:
        return "| - | 0 | 0 | - | - | - | - | - |"
    suite = specs[0].id.split("/", 1)[0]
    projects = len({spec.id.split("/")[1] for spec in specs})
    medians = [f"{statistics.median(d[key] for d in difficulties):g}" for key in ("lines_changed", "tests_failing", "hidden_files")]
    depths = collections.Counter(d["call_depth"] for d in difficulties)
    depth_text = ", ".join(f"{'none found' if depth is None else depth}: {count}" for depth, count in sorted(depths.items(), key=lambda item: (item[0] is None, item[0] or 0)))
    mutations = collections.Counter(spec.metadata["mutation"] for spec in specs if spec.metadata.get("mutation"))
    mutation_text = ", ".join(f"{kind}: {count}" for kind, count in mutations.most_common()) or "-"
    return f"| {suite} | {len(specs)} | {projects} | {' | '.join(medians)} | {depth_text} | {mutation_text} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generator", action="append", choices=sorted(GENERATORS), help="repeatable (default: both)")
    parser.add_argument("--project", action="append", help="NAME==VERSION or a local sdist (repeatable; default: the curated list)")
    parser.add_argument("--n", type=int, default=5, help="valid tasks wanted per project")
    parser.add_argument("--max-tries", type=int, default=15, help="candidates tried at most per project")
    parser.add_argument("--jobs", type=int, default=2, help="projects generated at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default="out/task-generation-cache", help="the generators' cache (resumable)")
    parser.add_argument("--report-only", action="store_true", help="the tables of what --cache-dir holds; nothing generated")
    parser.add_argument("--tiny", action="store_true", help="one task per generator from local sdists, offline")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, commit {commit or '?'}; "
          f"n={args.n}, max tries {args.max_tries}, seed {args.seed}, {args.jobs} jobs")
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            projects = {
                "feature-deletion": [str(local_sdist(Path(scratch)))],
                "bug-injection": [str(local_sdist(Path(scratch), "ranges-1.0", RANGES))],
            }
            args.n, args.max_tries, cache = 1, 10, Path(scratch) / "cache"
        else:
            projects = {name: args.project or list(DEFAULT_PROJECTS) for name in GENERATORS}
            cache = Path(args.cache_dir)
        for name in args.generator or sorted(GENERATORS):
            if args.report_only:
                reports = cached_reports(GENERATORS[name](), cache, args.seed)
            else:
                reports = generate_projects(
                    GENERATORS[name](), projects[name], args.n, args.seed, cache, lambda: open_sandbox(SandboxSpec()),
                    jobs=args.jobs, max_tries=args.max_tries, log=lambda line: print(line, flush=True),
                )
            print(f"\n{name}:\n\n{summary_table(reports)}\n", flush=True)
            print(f"{DIFFICULTY_HEADER}\n{difficulty_row(GENERATORS[name]().cached_tasks(cache))}\n", flush=True)
            if args.tiny and any(report.valid < args.n for report in reports):
                raise SystemExit(f"a tiny project gave no {name} task: {[report.model_dump() for report in reports]}")
            if args.tiny and cached_reports(GENERATORS[name](), cache, args.seed) != reports:
                raise SystemExit(f"the {name} cache does not say what the run reported")


if __name__ == "__main__":
    main()
