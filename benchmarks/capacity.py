"""Capacity model inputs: what one session costs a host, and how fast the engine starts sandboxes.

    python benchmarks/capacity.py [--sessions 32] [--rounds 2] [--test-concurrency 4] [--starts 16] [--concurrency 1,4,8] [--tiny]

Starts `coding-env serve` in a child process (Docker backend, no warm pools, so every figure is
the sessions' own) and measures, in one run:
1. service memory: RSS of the service process at 0 sessions, at half of `--sessions` and at
   `--sessions` (each reset onto `builtin/fizzbuzz`); per session = the slope between the two;
2. sandbox memory, from each session's container memory cgroup: idle (after reset: supervisor,
   workspace; and the CPU idle sessions use, over 10 s) and busy (the cgroup's peak after the step mix below, `run_tests` included);
3. CPU time per step, summed over the service process, the engine (dockerd, containerd) and
   the sandboxes (each container's cgroup and its containerd shim, with the runc processes the
   shim reaped), for
   a light mix (`bash`, `read_file`, `write_file`: `--rounds` of each per session, all sessions
   at once) and for `run_tests` (once per session, `--test-concurrency` at a time); and per
   reset (a cold container start);
4. the engine's sandbox start rate: `--starts` hardened sandboxes opened (supervisor answering)
   at each `--concurrency`, starts/s and the CPU per start (engine, and the new sandboxes').

The engine is shared with whatever else runs on the host: its whole CPU over a phase counts in the
totals (an upper bound), and its CPU net of its rate in an idle window just before the phase is
printed beside it (noisy, even negative, when other jobs use the engine in bursts). CPU time does
not depend on the machine's load; wall times and start rates do. Every request must succeed and every
step come back without an error kind (the kinds are printed, then an error fails the run). `--tiny`:
2 sessions, one round, one start, short idle windows (CI's run).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from sandbox import DockerSpec, Sandbox, open_sandbox
from samples import process_cpu_s
from service_latency import service_container_ids, start_service

TASK_ID = "builtin/fizzbuzz"
SOLUTION = "def fizzbuzz(n: int) -> str:\n    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)\n"
LIGHT_MIX: list[tuple[str, dict[str, object]]] = [
    ("bash", {"command": "ls -la && python3 -c 'print(sum(range(10**5)))'"}),
    ("read_file", {"path": "solution.py"}),
    ("write_file", {"path": "solution.py", "content": SOLUTION}),
]
MIB = 1024 * 1024


# --- CPU and memory of processes and containers -----------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def pids_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def shims_of(container_ids: set[str]) -> dict[str, int]:
    """The containerd shim of each container (named by `-id` on its command line), by container id."""
    found = {}
    for pid in pids_named("containerd-shim"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "-id" in argv and argv[argv.index("-id") + 1] in container_ids:
            found[argv[argv.index("-id") + 1]] = pid
    return found


class ContainerCgroup:
    """One container's cgroup files, on cgroup v1 (cgroupfs driver) or v2 (cgroupfs or systemd)."""

    def __init__(self, container_id: str):
        v1_memory = Path("/sys/fs/cgroup/memory/docker") / container_id
        if v1_memory.is_dir():
            self.version = 1
            self.memory_dir, self.cpu_dir = v1_memory, Path("/sys/fs/cgroup/cpuacct/docker") / container_id
        else:
            candidates = [Path("/sys/fs/cgroup/docker") / container_id, Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope")]
            unified = next((path for path in candidates if path.is_dir()), None)
            if unified is None:
                raise RuntimeError(f"no cgroup found for container {container_id}")
            self.version = 2
            self.memory_dir = self.cpu_dir = unified

    def _read(self, directory: Path, name: str) -> str:
        return (directory / name).read_text()

    def _stat(self) -> dict[str, int]:
        return {key: int(value) for key, value in (line.split() for line in self._read(self.memory_dir, "memory.stat").splitlines())}

    def usage_mib(self) -> float:
        """Memory charged against the limit now: processes, tmpfs (workspace, /tmp) and page cache."""
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        return int(self._read(self.memory_dir, name)) / MIB

    def anon_mib(self) -> float:
        """The processes' own memory (anonymous pages), without tmpfs and page cache."""
        return self._stat()["rss" if self.version == 1 else "anon"] / MIB

    def peak_mib(self) -> float:
        """The highest usage since the container started."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return int(self._read(self.memory_dir, name)) / MIB

    def cpu_s(self) -> float:
        if self.version == 1:
            return int(self._read(self.cpu_dir, "cpuacct.usage")) / 1e9
        usage = next(line for line in self._read(self.cpu_dir, "cpu.stat").splitlines() if line.startswith("usage_usec"))
        return int(usage.split()[1]) / 1e6



@dataclass
class CpuSplit:
    """CPU seconds spent in one phase, by where they were spent."""

    service: float
    engine: float
    """dockerd and containerd."""
    engine_net: float
    """`engine` less the engine's rate in the idle window before the phase, times the phase's length."""
    sandboxes: float
    """The containers' cgroups and their shims (with the runc processes those reaped)."""
    wall_s: float

    @property
    def total(self) -> float:
        """An upper bound: the engine's whole CPU counts (the net figure is noisy on a shared host)."""
        return self.service + self.engine + self.sandboxes


def engine_cpu_s() -> float:
    return sum(process_cpu_s(pid) for pid in pids_named("dockerd") + pids_named("containerd"))


def engine_idle_rate(window_s: float) -> float:
    """The engine's CPU seconds per second while this benchmark does nothing (other jobs' share)."""
    before = engine_cpu_s()
    time.sleep(window_s)
    return (engine_cpu_s() - before) / window_s


def containers_cpu_s(ids: set[str]) -> dict[str, float]:
    """CPU seconds so far of each container: its cgroup (supervisor and commands) and its shim."""
    shims = shims_of(ids)
    return {cid: ContainerCgroup(cid).cpu_s() + (process_cpu_s(shims[cid]) if cid in shims else 0.0) for cid in ids}


def measure_phase(service_pid: int, container_ids: Callable[[], set[str]], phase: Callable[[], None], idle_window_s: float) -> CpuSplit:
    """Run `phase` and split its CPU time. A container alive before and after counts with its
    growth, one the phase started with all it used (its start included)."""
    idle_rate = engine_idle_rate(idle_window_s)
    containers_0 = containers_cpu_s(container_ids())
    service_0, engine_0 = process_cpu_s(service_pid), engine_cpu_s()
    started = time.monotonic()
    phase()
    wall_s = time.monotonic() - started
    engine = engine_cpu_s() - engine_0
    containers = containers_cpu_s(container_ids())
    return CpuSplit(
        service=process_cpu_s(service_pid) - service_0,
        engine=engine,
        engine_net=engine - idle_rate * wall_s,
        sandboxes=sum(cpu - containers_0.get(cid, 0.0) for cid, cpu in containers.items()),
        wall_s=wall_s,
    )


# --- sessions through the service ---------------------------------------------------------------


def http_client(address: str, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=f"http://{address}", timeout=600, limits=limits)


async def open_sessions(address: str, count: int, concurrency: int = 8) -> list[str]:
    """`count` HTTP sessions reset onto the task, at most `concurrency` resets at a time."""
    gate = asyncio.Semaphore(concurrency)
    async with http_client(address, concurrency) as http:

        async def one() -> str:
            async with gate:
                session_id = (await http.post("/sessions")).raise_for_status().json()["session_id"]
                (await http.post(f"/sessions/{session_id}/reset", json={"task_id": TASK_ID})).raise_for_status()
                return session_id

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def run_steps(address: str, session_ids: list[str], steps: list[tuple[str, dict[str, object]]], concurrency: int) -> collections.Counter[str]:
    """Each session plays `steps` in order, `concurrency` sessions at a time; returns the
    observations' error kinds ("none" for a clean step)."""
    gate = asyncio.Semaphore(concurrency)
    kinds: collections.Counter[str] = collections.Counter()
    async with http_client(address, concurrency) as http:

        async def play(session_id: str) -> None:
            async with gate:
                for tool_name, arguments in steps:
                    action = {"type": "call_tool", "tool_name": tool_name, "arguments": arguments}
                    reply = (await http.post(f"/sessions/{session_id}/step", json={"action": action})).raise_for_status().json()
                    kinds[reply["observation"]["error_kind"] or "none"] += 1  # errors fail the run after the figures

        await asyncio.gather(*(play(session_id) for session_id in session_ids))
    return kinds


async def close_sessions(address: str, session_ids: list[str]) -> None:
    async with http_client(address, 8) as http:
        for closed in await asyncio.gather(*(http.delete(f"/sessions/{session_id}") for session_id in session_ids)):
            closed.raise_for_status()


def per(value: float, count: int) -> str:
    return f"{1000 * value / count:7.1f} ms"


def print_cpu(name: str, split: CpuSplit, count: int) -> None:
    print(
        f"{name:<20} n={count:<4} CPU/op <= {per(split.total, count)}  (service {per(split.service, count)}, engine {per(split.engine, count)}"
        f" [net of its idle rate {per(split.engine_net, count)}], sandboxes {per(split.sandboxes, count)})  wall {split.wall_s:.1f} s"
    )


def bench_sessions(sessions: int, rounds: int, test_concurrency: int, idle_window_s: float, idle_s: float) -> None:
    process, address = start_service(0, sessions + 8, CODING_ENV_GRADING_POOL_SIZE="0")
    pid = process.pid
    half = sessions // 2
    light_steps = LIGHT_MIX * rounds
    opened: list[str] = []
    kinds: collections.Counter[str] = collections.Counter()

    def ids() -> set[str]:
        return service_container_ids(pid)

    def open_more(count: int) -> Callable[[], None]:
        return lambda: opened.extend(asyncio.run(open_sessions(address, count)))

    def play(steps: list[tuple[str, dict[str, object]]], concurrency: int) -> Callable[[], None]:
        return lambda: kinds.update(asyncio.run(run_steps(address, opened, steps, concurrency)))

    try:
        httpx.get(f"http://{address}/tasks", timeout=600).raise_for_status()  # the task registry loads on first use
        rss: dict[int | str, float] = {0: rss_mib(pid)}
        resets = measure_phase(pid, ids, open_more(half), idle_window_s)
        rss[half] = rss_mib(pid)
        open_more(sessions - half)()
        rss[sessions] = rss_mib(pid)
        cgroups = [ContainerCgroup(cid) for cid in ids()]
        idle = [(c.usage_mib(), c.anon_mib()) for c in cgroups]
        resting = measure_phase(pid, ids, lambda: time.sleep(idle_s), idle_window_s)
        light = measure_phase(pid, ids, play(light_steps, sessions), idle_window_s)
        # A few at a time: on a loaded host, all at once would run into the step timeout.
        tests = measure_phase(pid, ids, play([("run_tests", {})], test_concurrency), idle_window_s)
        busy = [(c.usage_mib(), c.peak_mib()) for c in cgroups]
        rss["after the steps"] = rss_mib(pid)
        asyncio.run(close_sessions(address, opened))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=300)

    print(f"sessions={sessions}, light mix {len(light_steps)} steps/session; error kinds of the steps: {dict(kinds)}")
    print_cpu("reset (cold start)", resets, half)
    print(f"idle session         CPU {1000 * (resting.service + resting.sandboxes) / (sessions * idle_s):.3f} ms per session-second (service and sandboxes, {idle_s:.0f} s of {sessions} idle sessions)")
    print_cpu("light step", light, sessions * len(light_steps))
    print_cpu("run_tests step", tests, sessions)
    slope = (rss[sessions] - rss[half]) / (sessions - half)
    print(f"service RSS          0: {rss[0]:.1f} MiB, {half}: {rss[half]:.1f} MiB, {sessions}: {rss[sessions]:.1f} MiB -> {slope:.2f} MiB/session; after the steps {rss['after the steps']:.1f} MiB")
    print(f"sandbox idle         usage p50 {statistics.median(u for u, _ in idle):.1f} MiB (max {max(u for u, _ in idle):.1f}), processes' anon p50 {statistics.median(a for _, a in idle):.1f} MiB")
    print(f"sandbox busy         usage after the mix p50 {statistics.median(u for u, _ in busy):.1f} MiB, peak p50 {statistics.median(p for _, p in busy):.1f} MiB (max {max(p for _, p in busy):.1f})")
    print(f"containers left by the service after it stopped: {len(ids())}")
    if set(kinds) != {"none"} or ids():
        raise SystemExit(f"capacity failed: steps with error kinds {dict(kinds)}, {len(ids())} containers left: the figures above are not a session's")


# --- the engine's start rate ------------------------------------------------------------------


@contextmanager
def opened_sandboxes() -> Iterator[list[Sandbox]]:
    sandboxes: list[Sandbox] = []
    try:
        yield sandboxes
    finally:
        with ThreadPoolExecutor(8) as closer:
            list(closer.map(Sandbox.close, sandboxes))


def bench_starts(starts: int, concurrencies: list[int], idle_window_s: float) -> None:
    spec = DockerSpec()
    for concurrency in concurrencies:
        with opened_sandboxes() as sandboxes, ThreadPoolExecutor(concurrency) as starter:
            idle_rate = engine_idle_rate(idle_window_s)
            engine_0 = engine_cpu_s()
            started = time.monotonic()
            sandboxes.extend(starter.map(lambda _: open_sandbox(spec), range(starts)))
            wall_s = time.monotonic() - started
            engine = engine_cpu_s() - engine_0
            # This process started them, so they carry its owner label.
            sandboxes_cpu = sum(containers_cpu_s(service_container_ids(os.getpid())).values())
        net = engine - idle_rate * wall_s
        print(
            f"start concurrency={concurrency:<2} n={starts:<3} {starts / wall_s:5.2f} starts/s  wall {wall_s:5.1f} s  CPU/start"
            f" <= {per(engine + sandboxes_cpu, starts)} (engine {per(engine, starts)} [net of its idle rate {per(net, starts)}], sandboxes {per(sandboxes_cpu, starts)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the light mix per session")
    parser.add_argument("--test-concurrency", type=int, default=4, help="sessions running run_tests at once")
    parser.add_argument("--starts", type=int, default=16)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--idle-window-s", type=float, default=5.0, help="length of the idle window that measures the engine's background rate")
    parser.add_argument("--idle-s", type=float, default=10.0, help="how long the idle sessions' CPU is measured")
    parser.add_argument("--tiny", action="store_true", help="2 sessions, 1 round, 1 start, short windows: every path and check, in seconds")
    args = parser.parse_args()
    if args.tiny:
        args.sessions, args.rounds, args.test_concurrency, args.starts, args.concurrency = 2, 1, 1, 1, "1"
        args.idle_window_s, args.idle_s = 0.2, 0.2
    bench_sessions(args.sessions, args.rounds, args.test_concurrency, args.idle_window_s, args.idle_s)
    bench_starts(args.starts, [int(c) for c in args.concurrency.split(",")], args.idle_window_s)


if __name__ == "__main__":
    main()
