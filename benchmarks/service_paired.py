"""Two trees' services side by side: what a change does to the service's overhead, measured in one run.

    git worktree add /tmp/base main~1
    python benchmarks/service_paired.py --against /tmp/base [--rounds 13] [--steps 40] [--tiny]

Starts `coding-env serve` twice: one on this checkout's code, one on `--against`'s (another checkout, whose
`env_server` and `sandbox` come first on the service's `PYTHONPATH`). Opens a session on each and a sandbox of this
process's own, then times, in turns (`samples.timed_in_turns`), a raw `sandbox.exec("true")` and one `bash true`
step over WebSocket and over an HTTP session on each service, through `service_latency.py`'s thin clients. This
VM's speed drifts by the minute by more than most changes move a step; taken in turns, both trees see the same
minutes. Each round begins a fresh episode on every session, and the first round is dropped. Prints, per round and
as medians of the rounds' p50s: each step's overhead over the raw exec, each service's CPU per step, and this tree
minus the other per round (negative: this tree is faster). Every timed reply is checked.
`--tiny`: two rounds of two steps against this checkout itself (CI's run).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NamedTuple

import httpx

from samples import timed_in_turns
from service_latency import MAX_STEPS, TASK, exec_baseline, http_step, start_service, wait_pool, websocket_step

REPO = Path(__file__).resolve().parents[1]
TRANSPORTS = ("WebSocket", "HTTP")


class RunningTree(NamedTuple):
    """One tree's service, and an HTTP session on it."""

    name: str
    pid: int
    address: str
    http: httpx.Client
    session_id: str


@contextmanager
def tree_service(name: str, tree: Path) -> Iterator[RunningTree]:
    """`coding-env serve` running `tree`'s code (this checkout's when `tree` is it), with an open HTTP session."""
    settings = {} if tree.resolve() == REPO else {"PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    process, address = start_service(2, 8, **settings)
    try:
        with httpx.Client(base_url=f"http://{address}", timeout=300) as http:
            wait_pool(http, 2)
            session_id = http.post("/sessions").raise_for_status().json()["session_id"]
            yield RunningTree(name, process.pid, address, http, session_id)
    finally:
        process.terminate()
        process.wait(120)


def one_round(trees: list[RunningTree], steps: int, warm_up: int) -> dict[str, tuple[list[float], float]]:
    """Every series timed `steps` times in turns, after `warm_up` untimed turns, on fresh episodes."""
    for tree in trees:
        tree.http.post(f"/sessions/{tree.session_id}/reset", json=TASK).raise_for_status()
    with ExitStack() as stack:
        series = {"raw exec": (stack.enter_context(exec_baseline()), os.getpid())}
        for tree in trees:
            series[f"{tree.name} WebSocket"] = (stack.enter_context(websocket_step(tree.address)), tree.pid)
            series[f"{tree.name} HTTP"] = (stack.enter_context(http_step(tree.address, tree.session_id)), tree.pid)
        timed_in_turns(series, warm_up)
        return timed_in_turns(series, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="the other checkout (required unless --tiny)")
    parser.add_argument("--rounds", type=int, default=13, help="rounds, the first dropped")
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each series per round")
    parser.add_argument("--warm-up", type=int, default=5, help="untimed turns before each round's timed ones")
    parser.add_argument("--tiny", action="store_true", help="two rounds of two steps against this checkout itself")
    args = parser.parse_args()
    if args.tiny:
        args.against, args.rounds, args.steps, args.warm_up = args.against or REPO, 2, 2, 1
    if args.against is None or not (args.against / "env_server").is_dir():
        parser.error("--against: a checkout of this project (a folder holding env_server/)")
    if args.steps + args.warm_up > MAX_STEPS or args.rounds < 2:
        parser.error(f"--steps + --warm-up: at most {MAX_STEPS} (one episode a round); --rounds: at least 2")

    p50s: dict[str, list[float]] = {}
    cpu_ms: dict[str, list[float]] = {}
    with tree_service("this", REPO) as this, tree_service("other", args.against) as other:
        for round_ in range(args.rounds):
            timed = one_round([this, other], args.steps, args.warm_up)
            if round_ == 0:
                continue  # the first round warms what the warm-up did not
            for name, (samples, cpu) in timed.items():
                p50s.setdefault(name, []).append(statistics.median(samples))
                cpu_ms.setdefault(name, []).append(cpu)
            raw = p50s["raw exec"][-1]
            overheads = "  ".join(f"{name} {p50s[name][-1] - raw:+.2f}" for name in timed if name != "raw exec")
            print(f"round {round_:>2}: raw exec {raw:.2f} ms; overhead (ms) {overheads}", flush=True)

    raw = statistics.median(p50s["raw exec"])
    print(f"\nmedians of the rounds' p50s ({args.rounds - 1} rounds of {args.steps} steps; `other` = {args.against}):")
    for name, rounds in p50s.items():
        p50 = statistics.median(rounds)
        overhead = "" if name == "raw exec" else f"  overhead {p50 - raw:+.3f} ms ({p50 / raw:.2f}x)"
        print(f"  {name:<16} p50 {p50:.3f} ms{overhead}  CPU {statistics.median(cpu_ms[name]):.2f} ms per call")
    for transport in TRANSPORTS:
        deltas = [a - b for a, b in zip(p50s[f"this {transport}"], p50s[f"other {transport}"])]
        print(f"this - other, {transport}: {statistics.median(deltas):+.3f} ms per step (median over rounds; min {min(deltas):+.3f}, max {max(deltas):+.3f})")


if __name__ == "__main__":
    main()
