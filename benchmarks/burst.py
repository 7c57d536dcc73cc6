"""A burst of clients against the session cap: the admission queue instead of 503s.

    python benchmarks/burst.py [--clients 256] [--max-sessions 32] [--steps 3] [--admission-timeout-s 1800] [--tiny]

Starts `coding-env serve` (Docker backend, real sandboxes) with `--max-sessions`, then lets
`--clients` clients arrive at once over HTTP sessions. Each runs a short episode: open a session
(this is where it queues), reset onto `builtin/fizzbuzz`, `--steps` bash steps, close. Reports
completed episodes, errors by kind, the admission wait (time to `201` of `POST /sessions`,
p50/p99), total time, and leaked containers: the service's own (by its owner label) after every
episode closed, and after the service stopped (must be 0). A refused or failed request, an episode
left incomplete or a leaked container fails the run after the report. `--tiny`: 3 clients against a
cap of 2 (CI's run).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import time

import httpx

from samples import percentile
from service_latency import service_container_ids, start_service

TASK_ID = "builtin/fizzbuzz"


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise KeyError(name)


async def episode(http: httpx.AsyncClient, steps: int, waits: list[float], errors: collections.Counter[str]) -> bool:
    """One client: open (queued at the cap), reset, `steps` bash steps, close. True if all succeeded."""
    arrived = time.perf_counter()
    opened = await http.post("/sessions")
    if opened.status_code != 201:
        errors[f"open {opened.status_code} {opened.json().get('code')}"] += 1
        return False
    waits.append(time.perf_counter() - arrived)
    session = f"/sessions/{opened.json()['session_id']}"
    try:
        reset = await http.post(f"{session}/reset", json={"task_id": TASK_ID})
        if reset.status_code != 200:
            errors[f"reset {reset.status_code} {reset.json().get('code')}"] += 1
            return False
        for index in range(steps):
            action = {"type": "call_tool", "tool_name": "bash", "arguments": {"command": f"echo step-{index}"}}
            step = await http.post(f"{session}/step", json={"action": action})
            if step.status_code != 200 or step.json()["observation"]["error_kind"] is not None:
                errors[f"step {step.status_code}"] += 1
                return False
        return True
    finally:
        closed = await http.delete(session)
        if closed.status_code != 204:
            errors[f"close {closed.status_code}"] += 1


async def burst(base_url: str, clients: int, steps: int, timeout_s: float) -> tuple[int, list[float], collections.Counter[str], float]:
    waits: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout_s), limits=limits) as http:
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(episode(http, steps, waits, errors) for _ in range(clients)), return_exceptions=True)
        total_s = time.perf_counter() - started
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            errors[type(outcome).__name__] += 1
    return sum(1 for o in outcomes if o is True), waits, errors, total_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--max-sessions", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--admission-timeout-s", type=float, default=1800)
    parser.add_argument("--tiny", action="store_true", help="3 clients, a cap of 2, 1 step each: every path and check, in seconds")
    args = parser.parse_args()
    if args.tiny:
        args.clients, args.max_sessions, args.steps, args.pool_size = 3, 2, 1, 1

    process, address = start_service(
        args.pool_size, args.max_sessions, CODING_ENV_ADMISSION_TIMEOUT_S=str(args.admission_timeout_s), CODING_ENV_GRADING_POOL_SIZE="0"
    )
    base_url = f"http://{address}"
    try:
        completed, waits, errors, total_s = asyncio.run(burst(base_url, args.clients, args.steps, args.admission_timeout_s + 300))
        metrics = httpx.get(f"{base_url}/metrics").text
        left_open = metric(metrics, "coding_env_active_sessions")
        server_waits = metric(metrics, "coding_env_admission_wait_seconds_count")
        during = len(service_container_ids(process.pid))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=300)
    leaked = len(service_container_ids(process.pid))
    print(f"clients={args.clients} max_sessions={args.max_sessions} steps={args.steps} pool_size={args.pool_size}")
    print(f"completed        {completed}/{args.clients}")
    print(f"errors           {sum(errors.values())} {dict(errors)}")
    print(f"total time       {total_s:.1f} s  ({completed / total_s:.2f} episodes/s)")
    if waits:
        print(f"admission wait   p50={percentile(waits, 0.5):.2f} s  p99={percentile(waits, 0.99):.2f} s  max={max(waits):.2f} s")
    print(f"server side      {server_waits:.0f} admissions observed; sessions left open: {left_open:.0f}")
    print(f"containers       {during} after the burst (warm pool), {leaked} after the service stopped (leaked)")
    if errors or completed < args.clients or leaked:
        raise SystemExit(f"burst failed: {args.clients - completed} episodes incomplete, errors {dict(errors)}, {leaked} containers leaked")


if __name__ == "__main__":
    main()
