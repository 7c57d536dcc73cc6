"""`ingest` and `replay` subcommands; mounted by `coding-train`, runnable as `python -m trainer_client.traces`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from tqdm import tqdm

from trainer_client.records import TraceState
from trainer_client.traces.config import ReplayConfig, ReplayConfigError
from trainer_client.traces.ingest import INGESTERS, make_ingester
from trainer_client.traces.jsonl import read_models, write_models
from trainer_client.traces.progress import report_path
from trainer_client.traces.replay import TeacherReplay


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ingest` and `replay` to a parser's subcommands; each sets `func(args) -> exit code`."""
    ingest = subparsers.add_parser("ingest", help="turn agent traces into a states JSONL file")
    ingest.add_argument("--format", required=True, choices=sorted(INGESTERS), help="trace format")
    ingest.add_argument("path", type=Path, help="a trace file, or a directory searched recursively")
    ingest.add_argument("--out", required=True, type=Path, help="states JSONL to write")
    ingest.set_defaults(func=run_ingest)

    replay = subparsers.add_parser("replay", help="ask teachers at each state; write DPO pairs")
    replay.add_argument("--teachers", required=True, type=Path, help="teachers YAML (see docs/traces.md)")
    replay.add_argument("--states", required=True, type=Path, help="states JSONL from `ingest`")
    replay.add_argument("--out", required=True, type=Path, help="pairs JSONL (appended to; resumable)")
    replay.add_argument("--budget-usd", required=True, type=float, help="hard limit on money spent, all runs of --out")
    replay.add_argument("--cache-dir", type=Path, help="override the teachers file's cache_dir")
    replay.add_argument("--concurrency", type=int, help="override the teachers file's concurrency")
    replay.set_defaults(func=run_replay)


def run_ingest(args: argparse.Namespace) -> int:
    ingester = make_ingester(args.format)
    try:
        write_models(args.out, ingester.iter_states(args.path))
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(ingester.counts.model_dump(), indent=2))
    return 0


def run_replay(args: argparse.Namespace) -> int:
    try:
        config = ReplayConfig.load(args.teachers)
    except ReplayConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    overrides = {"cache_dir": args.cache_dir, "concurrency": args.concurrency}
    config = config.model_copy(update={key: value for key, value in overrides.items() if value is not None})
    if not args.states.is_file():
        print(f"error: no states file at {args.states}", file=sys.stderr)
        return 2
    with args.states.open(encoding="utf-8") as lines:
        total = sum(1 for line in lines if line.strip())
    with tqdm(total=total, unit="state", desc="replay") as bar:
        replay = TeacherReplay(config, args.out, args.budget_usd, on_state_done=bar.update)

        def count_invalid(number: int, why: str) -> None:
            replay.report.states_invalid += 1
            logging.warning("%s:%d is not a TraceState: %s", args.states, number, why)

        try:
            report = replay.run(read_models(args.states, TraceState, on_invalid=count_invalid))
        except ReplayConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    report_path(args.out).write_text(report.model_dump_json(indent=2), encoding="utf-8")
    print(
        f"pairs {report.pairs}, calls {report.calls}, cache hits {report.cache_hits}, "
        f"errors {sum(report.errors.values())}, spent ${report.spent_usd:.4f} "
        f"(total ${report.spent_total_usd:.4f} of ${report.budget_usd:.2f})"
        + (", stopped by budget" if report.stopped_by_budget else "")
    )
    print(f"report: {report_path(args.out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_client.traces", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)
