"""Makes `cpu_smoke_pairs.jsonl`, the DPO pairs of the CPU smoke config, with the trace pipeline.

1. A real service (Docker sandboxes, builtin tasks) records a scripted student's episodes on the
   smoke config's tasks: a realistic bad first move (`python`, a misspelt path), the tests, submit.
2. `coding-train ingest --format coding_env` turns its trajectory files into states.
3. `coding-train replay` asks two teachers (the local OpenAI-compatible stub of tests/traces, both
   answering "run the tests") at each state and keeps the pairs they agree on.

Run from the repository root with the dev extra installed and Docker running:
    python trainer_client/configs/data/make_cpu_smoke_pairs.py
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import uvicorn
import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "traces"))

from teacher_stub import StubOpenAI, Teacher, tool_answer  # noqa: E402

from env_server.app import create_app  # noqa: E402
from env_server.settings import ServiceSettings  # noqa: E402
from env_server.tasks import TaskRegistry, builtin  # noqa: E402
from trainer_client.cli import main as coding_train  # noqa: E402
from trainer_client.client import ClientSettings, CodingEnvClient  # noqa: E402

TASKS = ["builtin/fizzbuzz", "builtin/reverse_words", "builtin/fix_median", "builtin/word_count"]
STUDENT = [("bash", {"command": "python solution.py"}), ("read_file", {"path": "soluton.py"}), ("submit", {})]
OUT = Path(__file__).with_name("cpu_smoke_pairs.jsonl")


def record_episodes(trajectory_dir: Path) -> None:
    registry = TaskRegistry()
    registry.register(builtin.SUITE, builtin.BuiltinSuite)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ServiceSettings(port=port, pool_size=1, trajectory_dir=trajectory_dir)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, tasks=registry), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            thread.join(timeout=0.2)
    try:
        for task in TASKS:
            with CodingEnvClient(ClientSettings(base_url=url)) as client:
                client.reset(task)
                for tool, arguments in STUDENT:
                    client.step(tool, arguments)
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        record_episodes(work / "trajectories")
        states = work / "states.jsonl"
        if coding_train(["ingest", "--format", "coding_env", str(work / "trajectories"), "--out", str(states)]):
            return 1
        teachers = {name: Teacher(answer=lambda body: tool_answer("run_tests", {})) for name in ("teacher-a", "teacher-b")}
        with StubOpenAI(teachers) as stub:
            config = {
                "teachers": [
                    {"name": name, "base_url": stub.base_url, "model": name, "family": f"lab-{name}",
                     "input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0, "max_tokens": 64}
                    for name in teachers
                ],
                "cache_dir": str(work / "cache"),
                "concurrency": 1,
            }
            (work / "teachers.yaml").write_text(yaml.safe_dump(config))
            OUT.unlink(missing_ok=True)
            return coding_train(["replay", "--teachers", str(work / "teachers.yaml"), "--states", str(states),
                                 "--out", str(OUT), "--budget-usd", "1"])


if __name__ == "__main__":
    raise SystemExit(main())
