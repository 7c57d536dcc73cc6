"""Feature-deletion yield per project: how many candidates each real PyPI project gives to get
gate-valid tasks, and what each valid task costs (decision 057).

    python benchmarks/feature_deletion_yield.py [--out out/feature_deletion_yield.json] [--n 5] [--max-tries 15]
                                                [--seed 0] [--project NAME==VERSION ...] [--tiny]

For each project, `feature_deletion.generate` (what `coding-env tasks generate feature-deletion`
runs): pip downloads the sdist, runs its tests in a Docker sandbox, and tries up to `--max-tries`
candidates in seeded order until `--n` tasks pass the validity gate (reference 1.0 through the
real grader; untouched, emptied and "delete the body" 0). A project whose tests do not run in the
sandbox is refused, and its row says why.

Resumable: every project's result is written to `--out` as soon as it is done, and projects
already there are skipped; the table is printed from the whole file at the end.

`--tiny` (CI's run, offline): one task from a small project packed here as an sdist
(`tests/support/sdists.py`), into a scratch results file unless `--out` is given; that project is
known to give tasks, so a refusal or no valid task fails the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import sys
import time
from pathlib import Path

from env_server.tasks import feature_deletion
from sandbox import SandboxSpec, open_sandbox

# The tiny run's sdist is a test helper (tests/support/sdists.py), imported from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.sdists import local_sdist  # noqa: E402

# Pure-Python sdists with tests, pinned. Flat packages (toolz, idna, inflection, boltons, ...),
# src layouts with files beside src/ (cachetools, isodate, text-unidecode), single modules
# (six, parse, xmltodict), tests inside the package (toolz, pyflakes). The last three are refused:
# docopt's sdist ships no tests, mccabe's need hypothesis and funcy's `whatever`, which the
# sandbox image lacks.
DEFAULT_PROJECTS = [
    "toolz==1.0.0", "cachetools==5.3.3", "idna==3.7", "inflection==0.5.1", "six==1.16.0", "isodate==0.7.2",
    "text-unidecode==1.3", "jmespath==1.0.1", "parse==1.20.2", "xmltodict==0.13.0", "tabulate==0.9.0",
    "boltons==24.0.0", "pyflakes==3.2.0", "docopt==0.6.2", "mccabe==0.7.0", "funcy==2.0",
]


def run_project(requirement: str, n: int, max_tries: int, seed: int) -> dict:
    """One project's row: the generation report, or why the project was refused."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        try:
            report = feature_deletion.generate(
                requirement, n, seed, Path(cache), lambda: open_sandbox(SandboxSpec()),
                log=lambda line: print(line, flush=True), max_tries=max_tries,
            )
        except feature_deletion.ProjectRefused as error:
            return {"requirement": requirement, "refused": str(error), "seconds": time.perf_counter() - started}
    return {"requirement": requirement, **report.model_dump()}


def table(results: dict[str, dict]) -> str:
    lines = [
        "| project | baseline tests | candidates | tried | valid | valid / tried | s / valid task | rejected (reason: count) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    totals = {"tried": 0, "valid": 0, "seconds": 0.0}
    for requirement, row in results.items():
        totals["seconds"] += row["seconds"]
        if "refused" in row:
            lines.append(f"| {requirement} | refused: {row['refused'].split(': ', 1)[-1]} | | | | | | |")
            continue
        totals["tried"] += row["tried"]
        totals["valid"] += row["valid"]
        per_valid = f"{row['seconds_per_valid']:.1f}" if row["seconds_per_valid"] else "-"
        rejected = ", ".join(f"{reason}: {count}" for reason, count in row["rejected"].items()) or "-"
        lines.append(
            f"| {row['project']} | {row['baseline_tests']} | {row['candidates']} | {row['tried']} | {row['valid']} | "
            f"{row['valid'] / max(row['tried'], 1):.0%} | {per_valid} | {rejected} |"
        )
    per_valid = f"{totals['seconds'] / totals['valid']:.1f}" if totals["valid"] else "-"
    lines.append(
        f"| all ({len(results)} projects) | | | {totals['tried']} | {totals['valid']} | "
        f"{totals['valid'] / max(totals['tried'], 1):.0%} | {per_valid} (refusals' time included) | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="results file (resumable; default out/feature_deletion_yield.json, with --tiny a scratch file)")
    parser.add_argument("--project", action="append", help="NAME==VERSION (repeatable; default: the pinned list)")
    parser.add_argument("--n", type=int, default=5, help="valid tasks wanted per project")
    parser.add_argument("--max-tries", type=int, default=15, help="candidates tried at most per project")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="one task from a local sdist, offline: every path and check, in seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            args.project, args.n, args.max_tries = [str(local_sdist(Path(scratch)))], 1, 2
        out = Path(args.out or (Path(scratch) / "results.json" if args.tiny else "out/feature_deletion_yield.json"))
        run(args, out)


def run(args: argparse.Namespace, out: Path) -> None:
    """Every project not yet in `out` generated into it, then the table of all of them."""
    results: dict[str, dict] = json.loads(out.read_text()) if out.exists() else {}
    for requirement in args.project or DEFAULT_PROJECTS:
        if requirement in results:
            print(f"{requirement}: already in {out}, skipped", flush=True)
            continue
        row = run_project(requirement, args.n, args.max_tries, args.seed)
        row["date"] = datetime.date.today().isoformat()
        results[requirement] = row
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = out.with_suffix(".tmp")
        scratch.write_text(json.dumps(results, indent=1))
        scratch.replace(out)
        print(json.dumps(row), flush=True)
    print(f"\nn={args.n} valid tasks wanted per project, at most {args.max_tries} candidates tried, seed {args.seed}\n")
    print(table(results))
    if args.tiny and any("refused" in row or row["valid"] < args.n for row in results.values()):
        raise SystemExit(f"the tiny project gave no task: {json.dumps(results)[:1000]}")


if __name__ == "__main__":
    main()
