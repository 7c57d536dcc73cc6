"""Grading latency per suite, and feature-deletion generation throughput and yield.

    python benchmarks/grading_latency.py                      # grading, every suite
    python benchmarks/grading_latency.py --generate inflection==0.5.1 --generate cachetools==5.5.0 --n 10
    python benchmarks/grading_latency.py --tiny               # both, one task each (offline)

Grading: for each suite, the reference solution of `--tasks` tasks is graded three times: with a
cold fresh sandbox per grade (`grade`'s default); with the grading sandbox taken from a warm pool
and closed before `grade` returns; and as the service grades, from that pool and handed to
`WarmPool.retire`, which closes it in the background (decision 013). Baseline in the same run:
opening and closing one cold sandbox, the floor of cold grading. Generation:
`generate_project(FeatureDeletion(), ...)` into a scratch cache; tasks per minute and the share of
tried candidates that became tasks. Every reference solution must earn 1.0, cold and warm (else the
grader timed a failure) and every generation must give a task.
`--tiny` (CI's run, offline): one builtin task, and one task generated from a small local sdist
(`tests/support/sdists.py`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from env_server.grading.grader import grade, prepare_workspace
from env_server.tasks import default_registry
from env_server.tasks.feature_deletion import FeatureDeletion
from env_server.tasks.repo_generation import generate_project
from env_server.tasks.validation import solve
from samples import checked_exec, checked_grade, percentile
from sandbox import SandboxSpec, WarmPool, open_sandbox

# The tiny run's sdist is a test helper (tests/support/sdists.py), imported from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.sdists import local_sdist  # noqa: E402


def row(name: str, values: list[float], baseline: float) -> str:
    p50 = statistics.median(values)
    return f"| {name} | {p50:.0f} | {percentile(values, 0.99):.0f} | {len(values)} | {p50 / baseline:.2f}x |"


def bench_grading(tasks_per_suite: int, suites: list[str] | None, baseline_starts: int) -> None:
    spec = SandboxSpec()
    registry = default_registry()
    starts = []
    for _ in range(baseline_starts):
        began = time.perf_counter()
        open_sandbox(spec).close()
        starts.append((time.perf_counter() - began) * 1000)
    baseline = statistics.median(starts)
    print(f"baseline: cold sandbox open+close p50 {baseline:.0f} ms (n={len(starts)})\n")
    print("| suite / grading sandbox | p50 ms | p99 ms | n | p50 / cold open+close |")
    print("|---|---|---|---|---|")
    with open_sandbox(spec) as agent, WarmPool(spec, size=2) as pool:
        pool.wait_ready()
        for suite in suites or registry.suites():
            ids = registry.ids(suite)
            step = max(1, len(ids) // tasks_per_suite)
            chosen = ids[::step][:tasks_per_suite]
            if not chosen:
                print(f"| {suite} | (no tasks in the cache) | | | |")
                continue
            cold: list[float] = []
            warm: list[float] = []
            retired: list[float] = []
            for task_id in chosen:
                task = registry.get(task_id)
                checked_exec(agent, "find . /tmp -mindepth 1 -delete")
                prepare_workspace(agent, task)
                solve(agent, task.metadata)
                cold.append(checked_grade(grade(agent, task), task_id).grading_ms)
                pool.wait_ready()  # each warm grade checks out a ready sandbox, not one still starting
                warm.append(checked_grade(grade(agent, task, fresh_sandbox=pool.checkout), task_id).grading_ms)
                pool.wait_ready()
                retired.append(checked_grade(grade(agent, task, fresh_sandbox=pool.checkout, retire=pool.retire), task_id).grading_ms)
            print(row(f"{suite} / cold", cold, baseline))
            print(row(f"{suite} / warm pool", warm, baseline))
            print(row(f"{suite} / warm pool, retired (the service's)", retired, baseline))


def bench_generation(projects: list[str], n: int) -> None:
    print("\n| project | candidates | tried | tasks | yield | seconds | tasks/min |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        for requirement in projects:
            report = generate_project(FeatureDeletion(), requirement, n, 0, Path(cache), lambda: open_sandbox(SandboxSpec()))
            if not report.valid:
                raise RuntimeError(f"{requirement} gave no task: {report.model_dump_json()[:500]}")
            print(
                f"| {report.project} | {report.candidates} | {report.tried} | {report.valid} | "
                f"{report.valid / max(report.tried, 1):.0%} | {report.seconds:.0f} | {60 * report.valid / report.seconds:.1f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10, help="tasks graded per suite")
    parser.add_argument("--generate", action="append", default=[], help="NAME==VERSION to generate from (repeatable)")
    parser.add_argument("--n", type=int, default=10, help="feature-deletion tasks per project")
    parser.add_argument("--suites", nargs="+", help="suites to grade (default: every registered one)")
    parser.add_argument("--tiny", action="store_true", help="one builtin task, and one task from a local sdist: every path and check, offline")
    args = parser.parse_args()
    if args.tiny:
        bench_grading(1, ["builtin"], baseline_starts=1)
        with tempfile.TemporaryDirectory() as scratch:
            bench_generation([str(local_sdist(Path(scratch)))], 1)
    elif args.generate:
        bench_generation(args.generate, args.n)
    else:
        bench_grading(args.tasks, args.suites, baseline_starts=5)


if __name__ == "__main__":
    main()
