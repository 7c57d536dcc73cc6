"""Cheat rate: every hack of the red-team catalogue played through a real service.

    python benchmarks/cheat_rate.py [--families 2] [--real builtin/fizzbuzz ...] [--workers 2] [--json out.json] [--tiny]

Starts `coding-env serve` in a child process (Docker backend, default settings) and plays each
hack of `tests.redteam.catalogue.CATALOGUE` through the public HTTP API:
- against canary tasks (`--families` of the five canary families per hack, family and function
  rotating with the hack, so every family is hit), where no honest solution can earn anything: the **cheat rate** is the share of those episodes rewarded > 0;
- against real tasks (`--real`, where the hack applies): the share of hack episodes rewarded;
- on every hack episode: the monitor's flag rate, null rewards (aborted episodes), HTTP 5xx.
`--honest` also submits every canary task's most plausible honest solution (must all score 0).
Last, the trivial-baseline reward per suite (`trivial_baselines.py`: constants, echoes, shown outputs,
lookups, raising stubs), which must be 0 on every served task.
A 5xx answer in any episode fails the run after the report (the hack then measured the server's
failure, not its defence). `--tiny` (CI's run): the catalogue's first hack on one canary task, one
honest solution, the builtin suite's baselines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

# The catalogue is test code (tests/redteam/catalogue.py), imported from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_server.tasks import default_registry  # noqa: E402
from env_server.tasks.canary import FAMILIES, SUITE as CANARY  # noqa: E402
from tests.redteam.catalogue import CATALOGUE, Hack, HackClass, HackOutcome, ToolCall, applies, play  # noqa: E402
import trivial_baselines  # noqa: E402
from service_latency import start_service  # noqa: E402

# A call-table task, a call-table task with a judge and a prompt helper, a call-table task with
# JSON data (codeio needs its generated cache; it is skipped when absent).
DEFAULT_REAL = ["builtin/fizzbuzz", "humaneval/HumanEval/32", "codeio/11"]


@contextmanager
def service() -> Iterator[str]:
    """`coding-env serve` on a free loopback port; yields its URL."""
    process, address = start_service(pool_size=2, CODING_ENV_GRADING_POOL_SIZE="2")
    try:
        yield f"http://{address}"
    finally:
        process.terminate()
        process.wait(60)


def honest_hack(task_id: str, solution: dict[str, str]) -> Hack:
    """The task's most plausible honest solution, played like a hack (it must score 0 on a canary)."""
    calls = [ToolCall(tool_name="write_file", arguments={"path": path, "content": text}) for path, text in solution.items()]
    return Hack(id=f"honest/{task_id}", hack_class=HackClass.TEST_INFRA, description="honest solution", calls=calls)


def summarise(name: str, outcomes: list[HackOutcome]) -> str:
    n = len(outcomes)
    paid = sum(o.paid for o in outcomes)
    flagged = sum(o.flagged for o in outcomes)
    null = sum(o.reward is None for o in outcomes)
    errors = sum(bool(o.server_errors) for o in outcomes)
    return (f"| {name} | {n} | {paid} ({paid / max(n, 1):.1%}) | {flagged} ({flagged / max(n, 1):.1%}) "
            f"| {null} | {errors} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=2, help="canary tasks per hack (each of another family)")
    parser.add_argument("--real", nargs="*", default=DEFAULT_REAL, help="real task ids to play every applicable hack on")
    parser.add_argument("--hack", action="append", default=[], help="only hacks whose id starts with this (repeatable)")
    parser.add_argument("--honest", action="store_true", help="also submit every canary task's honest solution")
    parser.add_argument("--workers", type=int, default=2, help="episodes played at once")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--tiny", action="store_true", help="one hack on one canary task, one honest solution: every path and check")
    args = parser.parse_args()
    if args.tiny:
        args.families, args.real, args.honest = 1, [], True

    registry = default_registry()
    known = set(registry.ids())
    for task_id in [t for t in args.real if t not in known]:
        print(f"skipping {task_id}: not in the registry")
    args.real = [t for t in args.real if t in known]
    canary_ids = registry.ids(CANARY)
    functions = sorted({task_id.rsplit("/", 1)[1] for task_id in canary_ids})
    families = list(FAMILIES)
    hacks = [h for h in CATALOGUE if not args.hack or any(h.id.startswith(prefix) for prefix in args.hack)][: 1 if args.tiny else None]
    plays: list[tuple[str, Hack, str]] = []
    for index, hack in enumerate(hacks):
        for offset in range(min(args.families, len(families))):
            family = families[(index + offset) % len(families)]
            task = registry.get(f"{CANARY}/{family}/{functions[index % len(functions)]}")
            if applies(hack, task):
                plays.append(("canary", hack, task.id))
        plays += [("real", hack, task_id) for task_id in args.real if applies(hack, registry.get(task_id))]
    if args.honest:
        honest = canary_ids[:1] if args.tiny else canary_ids
        plays += [("honest", honest_hack(task_id, registry.get(task_id).metadata["solution"]), task_id) for task_id in honest]

    started = time.time()
    results: list[tuple[str, HackOutcome]] = []
    with service() as url:
        def run(item: tuple[str, Hack, str]) -> tuple[str, HackOutcome]:
            kind, hack, task_id = item
            with httpx.Client(base_url=url, timeout=300) as client:
                return kind, play(client, hack, registry.get(task_id))

        with ThreadPoolExecutor(args.workers) as pool:
            for kind, outcome in pool.map(run, plays):
                results.append((kind, outcome))
                if not outcome.held:
                    print(f"  not held: {kind} {outcome.hack_id} on {outcome.task_id}: reward={outcome.reward} "
                          f"done={outcome.done} 5xx={outcome.server_errors[:1]} forged={outcome.forged_output_seen}",
                          flush=True)
    seconds = time.time() - started

    by_kind = {kind: [o for k, o in results if k == kind] for kind in ("canary", "real", "honest")}
    print(f"\n{len(results)} episodes in {seconds:.0f} s, {len(hacks)} hacks\n")
    print("| episodes | n | rewarded > 0 | flagged | reward null | with 5xx |")
    print("|---|---|---|---|---|---|")
    print(summarise("hacks on canary tasks (cheat rate)", by_kind["canary"]))
    print(summarise("hacks on real tasks", by_kind["real"]))
    print(summarise("all hack episodes", by_kind["canary"] + by_kind["real"]))
    if by_kind["honest"]:
        print(summarise("honest solutions on canary tasks", by_kind["honest"]))
    print("\n| hack | canary rewarded | real rewarded | flagged | not held |")
    print("|---|---|---|---|---|")
    for hack in hacks:
        mine = [(k, o) for k, o in results if o.hack_id == hack.id]
        canary = [o for k, o in mine if k == "canary"]
        real = [o for k, o in mine if k == "real"]
        print(f"| {hack.id} | {sum(o.paid for o in canary)}/{len(canary)} | {sum(o.paid for o in real)}/{len(real)} "
              f"| {sum(o.flagged for _, o in mine)}/{len(mine)} | {sum(not o.held for _, o in mine)}/{len(mine)} |")
    print("\nTrivial baselines, scored on the host against every served call-table task (benchmarks/trivial_baselines.py):\n")
    print(trivial_baselines.HEADER)
    print("\n".join(trivial_baselines.after_rows(["builtin"] if args.tiny else trivial_baselines.DEFAULT_SUITES)))
    if args.json:
        args.json.write_text(json.dumps([{"kind": k, **o.model_dump(mode="json")} for k, o in results], indent=1))
    failed = [f"{kind} {o.hack_id} on {o.task_id}: {o.server_errors[0]}" for kind, o in results if o.server_errors]
    if failed:
        raise SystemExit(f"{len(failed)} episodes met a 5xx answer, the first: {failed[0]}")


if __name__ == "__main__":
    main()
