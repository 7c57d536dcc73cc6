"""Sandbox latency: cold start, warm checkout, exec round trips, file transfer, concurrency.

Baseline in the same run: the docker SDK's `exec_run` (one `docker exec` per call) for the
same commands in the same container. Prints a markdown table for docs/benchmarks.md. Every timed
exec (the baseline's too) must exit 0 and every file round trip return what was written; an error
under concurrency is counted in the table and then fails the run.

    python benchmarks/sandbox_latency.py [--backend docker|local] [--quick | --tiny]
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from docker.models.containers import Container

from samples import checked_exec, percentile, timed_ms
from sandbox import BackendSpec, DockerSpec, LocalSpec, Sandbox, WarmPool, open_sandbox

SPEC: BackendSpec = DockerSpec()


def row(name: str, samples: list[float], baseline: list[float] | None = None) -> str:
    p50 = percentile(samples, 0.5)
    cells = [name, f"{p50:.2f}", f"{percentile(samples, 0.99):.2f}", str(len(samples))]
    if baseline:
        base50 = percentile(baseline, 0.5)
        cells += [f"{base50:.2f}", f"{percentile(baseline, 0.99):.2f}", f"{base50 / p50:.1f}x"]
    else:
        cells += ["", "", ""]
    return "| " + " | ".join(cells) + " |"


def checked_exec_run(container: Container, command: str) -> None:
    """The baseline's `docker exec`, or a loud failure when the command did not exit 0."""
    result = container.exec_run(["bash", "-c", command])
    if result.exit_code != 0:
        raise RuntimeError(f"exec_run {command!r} failed: {result}")


def cold_start(backend: str, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        sandbox = open_sandbox(SPEC, backend)  # returns once the supervisor answers a ping
        samples.append((time.perf_counter() - start) * 1000)
        sandbox.close()
    return samples


def warm_checkout(backend: str, repeat: int) -> list[float]:
    samples = []
    with WarmPool(SPEC, size=4, backend=backend) as pool:
        for _ in range(repeat):
            pool.wait_ready()  # measure a warm pool, not the refill rate
            start = time.perf_counter()
            sandbox = pool.checkout()
            samples.append((time.perf_counter() - start) * 1000)
            sandbox.close()
    return samples


def concurrency(backend: str, sandboxes: int, execs_each: int) -> tuple[str, int]:
    """`sandboxes` sandboxes each run `true` `execs_each` times, all at once: the table's row, and the errors."""
    with ThreadPoolExecutor(max_workers=8) as starter:
        opened = list(starter.map(lambda _: open_sandbox(SPEC, backend), range(sandboxes)))
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    barrier = threading.Barrier(sandboxes)

    def drive(sandbox: Sandbox) -> None:
        nonlocal errors
        barrier.wait()
        for _ in range(execs_each):
            start = time.perf_counter()
            try:
                checked_exec(sandbox, "true")
            except Exception:
                with lock:
                    errors += 1
                continue
            with lock:
                latencies.append((time.perf_counter() - start) * 1000)

    try:
        threads = [threading.Thread(target=drive, args=(sb,)) for sb in opened]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
    finally:
        with ThreadPoolExecutor(max_workers=8) as closer:
            list(closer.map(lambda sb: sb.close(), opened))
    rate = len(latencies) / wall
    if not latencies:
        return f"| {sandboxes} | {execs_each} | 0 | | | {errors} |", errors
    return f"| {sandboxes} | {execs_each} | {rate:.0f} | {percentile(latencies, 0.5):.1f} | {percentile(latencies, 0.99):.1f} | {errors} |", errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["docker", "local"], default="docker")
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc", help="OCI runtime (Docker backend; runsc = gVisor)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    parser.add_argument("--tiny", action="store_true", help="2 of each, 2 sandboxes at once: every path and check, in seconds (CI)")
    args = parser.parse_args()
    global SPEC
    SPEC = DockerSpec(runtime=args.runtime) if args.backend == "docker" else LocalSpec()
    n = 4 if args.tiny else 20 if args.quick else 200
    starts, checkouts = (2, 2) if args.tiny else (max(10, n // 10), max(10, n // 5))
    concurrent, execs_each = ((2,), 2) if args.tiny else ((32, 64), 5 if args.quick else 20)
    payload = bytes(range(256)) * 400  # 100 KiB

    print(f"backend: {args.backend}, runtime: {args.runtime}")
    print("| measurement | p50 ms | p99 ms | n | exec_run p50 ms | exec_run p99 ms | speed-up |")
    print("|---|---|---|---|---|---|---|")
    print(row("cold start (create until first exec possible)", cold_start(args.backend, starts)))
    print(row("warm checkout (pool of 4)", warm_checkout(args.backend, checkouts)))

    with open_sandbox(SPEC, args.backend) as sandbox:
        baseline_container = None
        if args.backend == "docker":
            from sandbox.docker_backend import default_client

            baseline_container = default_client().containers.get(sandbox.deployment.container_id)
        for command, repeat in (("true", n), ("python3 -c pass", n // 2)):
            ours = timed_ms(lambda: checked_exec(sandbox, command), repeat)
            baseline = None
            if baseline_container is not None:
                baseline = timed_ms(lambda: checked_exec_run(baseline_container, command), repeat)
            print(row(f"exec round trip `{command}`", ours, baseline))

        def write_then_read() -> None:
            sandbox.write_file("bench.bin", payload)
            if sandbox.read_file("bench.bin") != payload:
                raise RuntimeError("file round trip corrupted the payload")

        print(row("write then read 100 KiB", timed_ms(write_then_read, n // 2)))

    print()
    print("| sandboxes | execs each | execs/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    errors = 0
    for sandboxes in concurrent:
        line, failed = concurrency(args.backend, sandboxes, execs_each)
        print(line)
        errors += failed
    if errors:
        raise SystemExit(f"{errors} execs under concurrency failed: the figures above are not the sandbox's")


if __name__ == "__main__":
    main()
