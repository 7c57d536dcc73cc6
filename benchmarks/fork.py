"""Forking a session: `POST /sessions/{id}/fork {"n": N}` against a fresh reset of N sessions.

    python benchmarks/fork.py [--n 8] [--repeats 15] [--workspace-mb 5] [--tiny]

Starts `coding-env serve` in a child process (Docker backend, warm pool of N) and measures, in
one run, each repeat starting from a full warm pool:
1. fork: one source session holding a workspace of about `--workspace-mb` MB (varied files:
   Python sources, JSON, text, a binary blob, nested folders) is forked into N; the time until
   the answer, i.e. until all N sessions hold their copy (the forks are then closed);
2. baseline: N new sessions opened and reset at once (POST /sessions + reset each, concurrently),
   until the last reset answered;
3. the copy alone, in this process: `Sandbox.copy_workspace_to` of the same workspace from one
   sandbox into N started ones (no service, no checkout), to separate copying from the rest,
   with the CPU time it took: the containers' cgroups (Docker stats), dockerd and this process.
   CPU time does not depend on how loaded the machine is; wall time does.
All three twice: with every sandbox given an inbox (`CODING_ENV_SANDBOX__INBOX_ROOT`, a temporary
directory: the archive is written once and hard-linked into each target's inbox), then without
(the archive is sent through each target's channel), each against a service of its own.
Every timed reply is checked: a refused request, a failed step, a fork answering fewer sessions than
asked or a copy whose target does not hold the source's files fails the run. `--tiny`: 2 forks of a
small workspace, once each way (CI's run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

import docker
import httpx

from samples import checked_exec, checked_step, percentile
from sandbox import Sandbox, SandboxSpec, open_sandbox
from service_latency import start_service, wait_pool

FILES_AND_BYTES = "find . -type f -printf '%s\\n' | awk '{n++; s+=$1} END {print n, s}'"
"""A bash command printing how many files the workspace holds and their bytes: what a copy must reproduce."""
TASK = {"task": {"id": "bench/fork", "prompt": "Benchmark.", "files": {"main.py": "print(1)\n"}, "limits": {"max_steps": 1000}}}


def fill_workspace_script(megabytes: float) -> str:
    """A bash command that writes about `megabytes` MB of varied files into the workspace."""
    program = f"""
import json, os, random
random.seed(0)
budget = int({megabytes} * 2**20)
words = ["def", "return", "self", "value", "index", "for", "in", "if", "else", "None", "import", "data", "result"]
os.makedirs("blobs", exist_ok=True)
with open("blobs/model.bin", "wb") as f:
    f.write(os.urandom(budget // 5))
written, i = budget // 5, 0
while written < budget:
    folder = f"src/pkg{{i % 12}}/sub{{i % 5}}"
    os.makedirs(folder, exist_ok=True)
    if i % 4 == 0:
        text = json.dumps({{f"key{{k}}": [random.random() for _ in range(8)] for k in range(60)}})
        path = f"{{folder}}/data{{i}}.json"
    else:
        lines = ["    " * random.randint(0, 3) + " ".join(random.choices(words, k=random.randint(3, 12))) for _ in range(random.randint(50, 600))]
        text = "\\n".join(lines) + "\\n"
        path = f"{{folder}}/mod{{i}}.py"
    with open(path, "w") as f:
        f.write(text)
    written += len(text)
    i += 1
print(i + 1, "files")
"""
    return f"python3 - <<'EOF'\n{program}\nEOF\ndu -sb . | cut -f1"


def summary(name: str, samples_ms: list[float]) -> float:
    p50 = percentile(samples_ms, 0.5)
    print(f"{name:<44} n={len(samples_ms):<4} p50={p50:9.1f} ms  p99={percentile(samples_ms, 0.99):9.1f} ms")
    return p50


def step(http: httpx.Client, session_id: str, tool: str, **arguments: object) -> dict:
    response = http.post(f"/sessions/{session_id}/step", json={"action": {"type": "call_tool", "tool_name": tool, "arguments": arguments}})
    response.raise_for_status()
    return checked_step(response.json())["observation"]


def time_fork(http: httpx.Client, source: str, n: int) -> float:
    started = time.perf_counter()
    response = http.post(f"/sessions/{source}/fork", json={"n": n})
    elapsed = (time.perf_counter() - started) * 1000
    forks = response.raise_for_status().json()["session_ids"]
    if len(forks) != n:
        raise RuntimeError(f"a fork into {n} answered {len(forks)} sessions: {response.text[:500]}")
    for fork in forks:
        http.delete(f"/sessions/{fork}").raise_for_status()
    return elapsed


async def time_fresh_resets(base_url: str, n: int) -> float:
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as http:

        async def one() -> str:
            opened = await http.post("/sessions")
            opened.raise_for_status()
            session_id = opened.json()["session_id"]
            (await http.post(f"/sessions/{session_id}/reset", json=TASK)).raise_for_status()
            return session_id

        started = time.perf_counter()
        sessions = await asyncio.gather(*(one() for _ in range(n)))
        elapsed = (time.perf_counter() - started) * 1000
        for closed in await asyncio.gather(*(http.delete(f"/sessions/{session_id}") for session_id in sessions)):
            closed.raise_for_status()
    return elapsed


def container_cpu_ms(sandboxes: list[Sandbox], docker_api: docker.APIClient) -> float:
    """CPU milliseconds the sandboxes' containers have used (their cgroups, via Docker stats)."""
    stats = (docker_api.stats(sandbox.deployment.container_id, stream=False) for sandbox in sandboxes)
    return sum(stat["cpu_stats"]["cpu_usage"]["total_usage"] for stat in stats) / 1e6


def host_cpu_ms(dockerd: Path) -> float:
    """CPU milliseconds dockerd and this process have used (read without asking dockerd anything)."""
    fields = dockerd.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK") + time.process_time() * 1000


def time_copies(script: str, n: int, repeats: int, inbox_root: str | None) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each copy of the workspace into `n` started sandboxes."""
    wall, cpu = [], []
    docker_api = docker.APIClient()
    dockerd = Path(f"/proc/{subprocess.check_output(['pidof', 'dockerd'], text=True).split()[0]}/stat")
    spec = SandboxSpec(inbox_root=inbox_root)
    with open_sandbox(spec, "docker") as source:
        checked_exec(source, script, timeout_s=120)
        copied = checked_exec(source, FILES_AND_BYTES).stdout
        for _ in range(repeats):
            targets = [open_sandbox(spec, "docker") for _ in range(n)]
            try:
                containers_before = container_cpu_ms([source, *targets], docker_api)
                host_before, started = host_cpu_ms(dockerd), time.perf_counter()
                source.copy_workspace_to(targets)
                wall.append((time.perf_counter() - started) * 1000)
                host = host_cpu_ms(dockerd) - host_before
                cpu.append(host + container_cpu_ms([source, *targets], docker_api) - containers_before)
                for target in targets:
                    if (held := checked_exec(target, FILES_AND_BYTES).stdout) != copied:
                        raise RuntimeError(f"a copy holds {held.strip()} (files, bytes), not the source's {copied.strip()}")
            finally:
                for target in targets:
                    target.close()
    return wall, cpu


def time_service(script: str, args: argparse.Namespace, inbox_root: str | None) -> tuple[float, float]:
    """p50 of fork into N and of a fresh reset of N, against one service."""
    settings = {"CODING_ENV_SANDBOX__INBOX_ROOT": inbox_root} if inbox_root else {}
    process, address = start_service(pool_size=args.n, max_sessions=4 * args.n, **settings)
    base_url = f"http://{address}"
    forks, resets = [], []
    try:
        with httpx.Client(base_url=base_url, timeout=300) as http:
            source = http.post("/sessions").raise_for_status().json()["session_id"]
            http.post(f"/sessions/{source}/reset", json=TASK).raise_for_status()
            filled = step(http, source, "bash", command=script, timeout_s=120)["output"].split()
            print(f"source workspace: {filled[0]} files, {int(filled[-1]) / 2**20:.2f} MiB")
            for _ in range(args.repeats):
                wait_pool(http, args.n)
                forks.append(time_fork(http, source, args.n))
                wait_pool(http, args.n)
                resets.append(asyncio.run(time_fresh_resets(base_url, args.n)))
    finally:
        process.terminate()
        process.wait(60)
    return summary(f"fork into {args.n} (POST /sessions/{{id}}/fork)", forks), summary(
        f"fresh reset of {args.n} (open + reset, concurrent)", resets
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="forks per call, and fresh sessions in the baseline")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--copy-repeats", type=int, default=5, help="repeats of the in-process copy (3.)")
    parser.add_argument("--workspace-mb", type=float, default=5.0)
    parser.add_argument("--tiny", action="store_true", help="2 forks of a 0.2 MB workspace, once: every path and check, in seconds")
    args = parser.parse_args()
    if args.tiny:
        args.n, args.repeats, args.copy_repeats, args.workspace_mb = 2, 1, 1, 0.2
    print(f"load average before: {os.getloadavg()}")
    script = fill_workspace_script(args.workspace_mb)
    with tempfile.TemporaryDirectory(prefix="coding-env-inbox-") as inbox_root:
        os.chmod(inbox_root, 0o755)
        for mode, root in (("inbox", inbox_root), ("channel", None)):
            print(f"-- workspace copies through the {mode} --")
            fork_p50, reset_p50 = time_service(script, args, root)
            print(f"fork / fresh reset (p50): {fork_p50 / reset_p50:.2f}x")
            wall, cpu = time_copies(script, args.n, args.copy_repeats, root)
            summary(f"copy_workspace_to {args.n} started sandboxes", wall)
            summary("  its CPU time (containers + dockerd + host)", cpu)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
