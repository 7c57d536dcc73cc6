"""`coding-env tasks list|show|validate|generate`: the task registry from the command line."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from env_server.tasks import TaskRegistry, default_cache_dir, default_registry
from env_server.tasks.splits import SPLITS


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


def validate_tasks(args: argparse.Namespace) -> int:
    """Grade each task's reference solution (must score 1.0) and its untouched workspace (< 1.0)."""
    from env_server.tasks.validation import validate

    registry = _registry(args)
    ids = args.task_ids or registry.ids(args.suite)
    failures = 0
    for outcome in validate(registry, ids, backend=args.backend):
        failures += not outcome.ok
        print(f"{'ok  ' if outcome.ok else 'FAIL'} {outcome.task_id}\t{outcome.detail}")
    print(f"{len(ids) - failures}/{len(ids)} valid")
    return 1 if failures else 0


def generate_tasks(args: argparse.Namespace) -> int:
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if args.generator == "codeio":
        from env_server.tasks import codeio

        generated = codeio.generate(args.n, args.seed)
        codeio.write_cache(codeio.cache_path(cache_dir, args.seed), generated)
        print(f"codeio: {len(generated)} tasks -> {codeio.cache_path(cache_dir, args.seed)}")
        return 0
    from env_server.tasks import feature_deletion
    from sandbox import SandboxSpec, open_sandbox

    if not args.project:
        print("feature-deletion needs --project NAME==VERSION or a local sdist", file=sys.stderr)
        return 2
    for requirement in args.project:
        report = feature_deletion.generate(
            requirement, args.n, args.seed, cache_dir, lambda: open_sandbox(SandboxSpec(), backend=args.backend),
            log=lambda line: print(line, file=sys.stderr),
        )
        print(report.model_dump_json())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Mount `tasks` under a parent CLI (env_server/cli.py does)."""
    tasks = subparsers.add_parser("tasks", help="list, show, validate and generate tasks")
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

    validate = commands.add_parser("validate", help="reference solution scores 1.0, untouched workspace less")
    validate.add_argument("task_ids", nargs="*", help="tasks to validate (default: all of --suite)")
    validate.add_argument("--suite", help="validate a whole suite")
    validate.add_argument("--backend", choices=["docker", "local"], default="docker")
    validate.set_defaults(func=_clear_errors(validate_tasks))

    generate = commands.add_parser("generate", help="generate tasks into the cache")
    generate.add_argument("generator", choices=["feature-deletion", "codeio"])
    generate.add_argument("--project", action="append", help="NAME==VERSION of a pure-Python sdist with tests, or a local NAME-VERSION.tar.gz (repeatable)")
    generate.add_argument("--n", type=int, default=50, help="tasks to generate per project")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--backend", choices=["docker", "local"], default="docker")
    generate.set_defaults(func=_clear_errors(generate_tasks))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coding-env")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
