"""`coding-env tasks list|show|validate|generate|export`: the task registry from the command line."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from pathlib import Path

from env_server.tasks import TaskRegistry, default_cache_dir, default_registry
from env_server.tasks.export import FORMATS, export_suite
from env_server.tasks.splits import SPLITS

if TYPE_CHECKING:  # the gate's module imports the grader; only `validate` needs it
    from env_server.tasks.validation import Validity


def _clear_errors(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Unknown ids and bad arguments end with one line on stderr and exit status 2; a closed pipe quietly."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (KeyError, ValueError) as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            print(f"coding-env tasks: {message}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            # The reader left early (`tasks list | head`): that is not an error. Point stdout at
            # /dev/null so the interpreter's final flush does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return run


def _registry(args: argparse.Namespace) -> TaskRegistry:
    return default_registry(Path(args.cache_dir) if args.cache_dir else None)


def list_tasks(args: argparse.Namespace) -> int:
    registry = _registry(args)
    if args.counts:
        for suite in registry.suites():
            print(f"{suite}\t{len(registry.ids(suite))}")
        print(f"total\t{len(registry.ids())}")
        return 0
    for task_id in registry.ids(args.suite, split=args.split):
        print(task_id)
    return 0


def show_task(args: argparse.Namespace) -> int:
    task = _registry(args).get(args.task_id)
    shown = task.model_dump(exclude={"metadata"} if not args.with_metadata else set())
    if not args.with_hidden:
        shown["hidden_tests"] = sorted(task.hidden_tests)  # names only
        shown["hidden_calls"] = [f"{call.module}.{call.function}" for call in task.hidden_calls]  # no values
    print(json.dumps(shown, indent=2))
    return 0


def _sample(ids: list[str], size: str) -> list[str]:
    """`size` ids spread evenly over `ids` (every one for `all`), the same on every run."""
    if size == "all":
        return ids
    count = int(size)
    if count < 0:
        raise ValueError(f"--sample must be a count >= 0 or 'all', not {size!r}")
    step = len(ids) / count if count else 0
    return [ids[int(index * step)] for index in range(min(count, len(ids)))]


def _verdict_line(verdict: Validity, served: bool) -> str:
    shown = " ".join(f"{score.name}={score.reward:.2f}" for score in verdict.baselines)
    reference = "" if verdict.reference is None else f" reference={verdict.reference:.2f}"
    status = "ok  " if verdict.valid else "FAIL"
    problems = f"\t{'; '.join(verdict.problems)}" if verdict.problems else ""
    return f"{status} {verdict.task_id}{'' if served else ' (not served)'}\t{shown}{reference}{problems}"


def validate_tasks(args: argparse.Namespace) -> int:
    """The validity gate over tasks: the host-side baselines of every task (call tables), and the real
    grader (reference 1.0; untouched, emptied and delete-the-body 0) on a sample or on every task."""
    from env_server.tasks import StaticSuite
    from env_server.tasks.validation import host_validity, validate
    from sandbox import SandboxSpec, open_sandbox

    registry = _registry(args)
    if args.task_ids:
        groups = {"(given)": (list(args.task_ids), {})}
        sample = "all" if args.sample is None else args.sample
    else:
        suites = [args.suite] if args.suite else registry.suites()
        groups = {}
        for name in suites:
            suite = registry.suite(name)
            if isinstance(suite, StaticSuite) and not suite.gated:
                print(f"suite {name}: not gated (its tasks must not be solvable), skipped")
                continue
            groups[name] = (registry.ids(name), suite.rejected if isinstance(suite, StaticSuite) else {})
        sample = args.sample or "10"
    invalid_served = 0
    for name, (ids, rejected) in groups.items():
        for verdict in rejected.values():
            print(_verdict_line(verdict, served=False))
        host = {task_id: host_validity(registry.get(task_id)) for task_id in ids}
        rewarded = [task_id for task_id, verdict in host.items() if any(score.reward > 0 for score in verdict.baselines)]
        for task_id, verdict in host.items():
            if args.verbose or not verdict.valid:
                print(_verdict_line(verdict, served=True))
        graded_ids = _sample(ids, sample)
        graded_invalid = 0
        if graded_ids:
            with open_sandbox(SandboxSpec(), backend=args.backend) as sandbox:
                for verdict in validate((registry.get(task_id) for task_id in graded_ids), sandbox):
                    graded_invalid += not verdict.valid
                    print(_verdict_line(verdict, served=True), flush=True)
        invalid_served += sum(not verdict.valid for verdict in host.values()) + graded_invalid
        built = len(ids) + len(rejected)
        print(
            f"suite {name}: {built} tasks built, {len(rejected)} rejected by the gate, {len(ids)} served; "
            f"trivially rewarded among served: {len(rewarded)} ({len(rewarded) / max(len(ids), 1):.1%}); "
            f"graded through the real grader: {len(graded_ids) - graded_invalid}/{len(graded_ids)} valid",
            flush=True,
        )
    return 1 if invalid_served else 0


def generate_tasks(args: argparse.Namespace) -> int:
    from sandbox import SandboxSpec, open_sandbox

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if args.generator == "codeio":
        from env_server.tasks import codeio
        from env_server.tasks.validation import validate_task

        # Every candidate through the whole gate, the real grader included (a few seconds each).
        with open_sandbox(SandboxSpec(), backend=args.backend) as sandbox:
            generated = codeio.generate(args.n, args.seed, accept=lambda task: validate_task(task, sandbox).valid)
        codeio.write_cache(codeio.cache_path(cache_dir, args.seed), generated)
        print(f"codeio: {len(generated)} tasks -> {codeio.cache_path(cache_dir, args.seed)}")
        return 0
    from env_server.tasks.repo_generation import generate_projects, summary_table
    from env_server.tasks.projects import DEFAULT_PROJECTS

    if args.generator == "bug-injection":
        from env_server.tasks.bug_injection import BugInjection as Generator
    else:
        from env_server.tasks.feature_deletion import FeatureDeletion as Generator
    requirements = list(args.project or [])
    if args.projects_file:
        if not Path(args.projects_file).is_file():
            raise ValueError(f"no projects file {args.projects_file}")
        lines = Path(args.projects_file).read_text().splitlines()
        requirements += [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    # Every candidate goes through the validity gate; only valid tasks are written (decision 057).
    reports = generate_projects(
        Generator(), requirements or list(DEFAULT_PROJECTS), args.n, args.seed, cache_dir,
        lambda: open_sandbox(SandboxSpec(), backend=args.backend), jobs=args.jobs, max_tries=args.max_tries,
        log=lambda line: print(line, file=sys.stderr, flush=True), progress={"auto": None, "always": True, "never": False}[args.progress],
    )
    for report in reports:
        print(report.model_dump_json(), flush=True)
    print(summary_table(reports), file=sys.stderr, flush=True)
    return 0 if any(not report.refused for report in reports) else 1


def export_tasks(args: argparse.Namespace) -> int:
    path, count = export_suite(_registry(args), args.suite, Path(args.out), args.format, args.split)
    print(f"{count} rows -> {path} (dataset card: {path.parent / 'README.md'})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Mount `tasks` under a parent CLI (env_server/cli.py does)."""
    tasks = subparsers.add_parser("tasks", help="list, show, validate, generate and export tasks")
    tasks.add_argument("--cache-dir", help="generated-task cache (default: $CODING_ENV_TASK_CACHE_DIR or ~/.cache/coding-env/tasks)")
    commands = tasks.add_subparsers(dest="tasks_command", required=True)

    listing = commands.add_parser("list", help="task ids, one per line")
    listing.add_argument("--suite", help="only this suite")
    listing.add_argument("--counts", action="store_true", help="tasks per suite instead of ids")
    listing.add_argument("--split", choices=SPLITS, help="only the fixed train or held-out split (a hash of each id)")
    listing.set_defaults(func=_clear_errors(list_tasks))

    show = commands.add_parser("show", help="one task spec as JSON")
    show.add_argument("task_id")
    show.add_argument("--with-hidden", action="store_true", help="include hidden test contents and hidden calls' values")
    show.add_argument("--with-metadata", action="store_true", help="include metadata (reference solutions)")
    show.set_defaults(func=_clear_errors(show_task))

    validate = commands.add_parser(
        "validate", help="the validity gate: no trivial baseline earns reward, the reference scores 1.0 (docs/decisions/053)"
    )
    validate.add_argument("task_ids", nargs="*", help="tasks to validate, every one graded (default: every suite, or --suite)")
    validate.add_argument("--suite", help="validate one suite")
    validate.add_argument(
        "--sample", help="tasks per suite that also go through the real grader: a count (default 10) or 'all'; "
        "the host-side baselines always cover every task"
    )
    validate.add_argument("--verbose", "-v", action="store_true", help="a line for every task, not only the invalid and the graded")
    validate.add_argument("--backend", choices=["docker", "local"], default="docker")
    validate.set_defaults(func=_clear_errors(validate_tasks))

    generate = commands.add_parser("generate", help="generate tasks into the cache")
    generate.add_argument("generator", choices=["feature-deletion", "bug-injection", "codeio"])
    generate.add_argument(
        "--project", action="append", help="feature-deletion, bug-injection: NAME==VERSION of a pure-Python sdist with tests, "
        "or a local NAME-VERSION.tar.gz (repeatable; default: the curated list, env_server/tasks/projects.py)",
    )
    generate.add_argument("--projects-file", help="a file of such projects, one per line (# comments)")
    generate.add_argument("--n", type=int, default=50, help="tasks to generate (per project: valid ones, each through the gate)")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--max-tries", type=int, help="candidates to try at most per project, earlier runs' included (default: all)")
    generate.add_argument("--jobs", type=int, default=1, help="projects generated at once, each in its own sandbox")
    generate.add_argument("--progress", choices=["auto", "always", "never"], default="auto", help="a progress bar of kept tasks on stderr (auto: on a terminal)")
    generate.add_argument("--backend", choices=["docker", "local"], default="docker")
    generate.set_defaults(func=_clear_errors(generate_tasks))

    export = commands.add_parser("export", help="a suite as dataset rows for TRL, verl and SkyRL, with a dataset card (hidden parts never exported)")
    export.add_argument("--suite", required=True, help="the suite to export (`tasks list --counts` names them)")
    export.add_argument("--format", choices=FORMATS, default="jsonl", help="parquet needs pyarrow (the train extra has it)")
    export.add_argument("--out", required=True, help="directory for the data file and its README.md (created if missing)")
    export.add_argument("--split", choices=SPLITS, help="only the fixed train or held-out split")
    export.set_defaults(func=_clear_errors(export_tasks))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coding-env")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
