"""Every script in benchmarks/ runs in its tiny mode (`--tiny`: every code path it times and every check of
a reply, in seconds), so that none can rot between the runs that record docs/benchmarks.md; and a reply
that fails makes a benchmark exit non-zero instead of timing the failure.

The tiny runs are subprocesses, as a person runs them (`python benchmarks/X.py --tiny`). Most of their time
is spent waiting (for sandboxes, a service's start, grading), so the selected runs start together at the
first test, `CONCURRENT` at a time, and each test waits for its own (under pytest-xdist, whose workers
already run tests side by side, each test starts its own run).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONCURRENT = 3
"""Tiny runs at once: enough to overlap their waits, few enough for a 2-core machine."""
TIMEOUT_S = 300


@dataclass(frozen=True)
class Tiny:
    """One benchmark's tiny run: its script, further arguments (`{tmp}`: a scratch folder of the test's),
    and what its output must show (the figures it prints)."""

    script: str
    shows: tuple[str, ...]
    args: tuple[str, ...] = ()
    writes: str | None = None
    """A file the run must leave in `{tmp}`."""

    def argv(self, tmp: Path) -> list[str]:
        return [sys.executable, f"benchmarks/{self.script}.py", "--tiny", *(arg.format(tmp=tmp) for arg in self.args)]


DOCKER = (pytest.mark.docker,)
TINY_RUNS = [
    # The longest first: they set the wall time of the whole file.
    pytest.param(Tiny("trainer_tool_rounds", ("tool loop serial / concurrent",)), marks=DOCKER, id="trainer_tool_rounds"),
    pytest.param(Tiny("fork", ("fork into 2", "fresh reset of 2", "copy_workspace_to 2 started sandboxes")), marks=DOCKER, id="fork"),
    pytest.param(Tiny("grading_latency", ("| builtin / cold |", "| builtin / warm pool |", "| ministats-0.1 |")),
                 marks=DOCKER, id="grading_latency"),
    pytest.param(Tiny("cheat_rate", ("hacks on canary tasks (cheat rate)", "honest solutions on canary tasks", "| builtin | 4 |"),
                      ("--json", "{tmp}/outcomes.json"), writes="outcomes.json"), marks=DOCKER, id="cheat_rate"),
    pytest.param(Tiny("capacity", ("light step", "run_tests step", "service RSS", "start concurrency=1")), marks=DOCKER, id="capacity"),
    pytest.param(Tiny("service_latency", ("step `bash true` via WebSocket", "reset from the warm pool", "2 sessions x 2 steps")),
                 marks=DOCKER, id="service_latency"),
    pytest.param(Tiny("service_paired", ("this - other, WebSocket", "this - other, HTTP")), marks=DOCKER, id="service_paired"),
    pytest.param(Tiny("grading_modes", ("call table p50",)), marks=DOCKER, id="grading_modes"),
    pytest.param(Tiny("task_generation_yield", ("| ministats-0.1 | 3 |", "| ranges-1.0 | 8 |")),
                 marks=DOCKER, id="task_generation_yield"),
    pytest.param(Tiny("sandbox_latency", ("| exec round trip `true` |", "| 2 | 2 |")), marks=DOCKER, id="sandbox_latency"),
    pytest.param(Tiny("burst", ("completed        3/3", "errors           0")), marks=DOCKER, id="burst"),
    pytest.param(Tiny("dpo_batch_tokens", ("prefix tree, context chains, head read",)), id="dpo_batch_tokens"),
    pytest.param(Tiny("cpu_logprob_tiles", ("narrow+kept",)), id="cpu_logprob_tiles"),
    pytest.param(Tiny("parser_worst_case", ("worst case per family", "replies not sane: none")), id="parser_worst_case"),
    pytest.param(Tiny("trivial_baselines", ("| builtin | 4 |",)), id="trivial_baselines"),
    pytest.param(Tiny("gpu_bundle", ("part1",), ("--out", "{tmp}/bundle"), writes="bundle/part1/bundle.json"),
                 marks=(pytest.mark.bwrap,), id="gpu_bundle"),
]
RUN_ELSEWHERE = {
    # The GPU check's dry run is their tiny run (gpu_check.py --tiny runs trainer_step.py --tiny and
    # learning_curve.py --tiny among its stages); it takes minutes, so it is tested once, there.
    "gpu_check": "tests/trainer/test_gpu_check.py",
    "trainer_step": "tests/trainer/test_gpu_check.py",
    "learning_curve": "tests/trainer/test_gpu_check.py",
}


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str
    tmp: Path
    seconds: float


def run_tiny(tiny: Tiny, tmp: Path) -> Ran:
    started = time.monotonic()
    done = subprocess.run(tiny.argv(tmp), cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    return Ran(done.returncode, done.stdout + done.stderr, tmp, time.monotonic() - started)


class TinyRuns:
    """Tiny runs, each started once, `CONCURRENT` at a time."""

    def __init__(self, pool: ThreadPoolExecutor, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._pool, self._tmp_path_factory = pool, tmp_path_factory
        self._started: dict[str, Future[Ran]] = {}

    def start(self, tiny: Tiny) -> Future[Ran]:
        if tiny.script not in self._started:
            self._started[tiny.script] = self._pool.submit(run_tiny, tiny, self._tmp_path_factory.mktemp(tiny.script))
        return self._started[tiny.script]

    def result(self, tiny: Tiny) -> Ran:
        return self.start(tiny).result()


@pytest.fixture(scope="session")
def tiny_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyRuns]:
    """The tiny runs, those of the selected tests started at once (in `TINY_RUNS`' order) unless pytest-xdist
    shares the tests out among workers (then each worker would start every run)."""
    selected = {item.callspec.params["tiny"].script for item in request.session.items
                if getattr(item, "originalname", None) == "test_runs_in_its_tiny_mode"}
    with ThreadPoolExecutor(CONCURRENT) as pool:
        runs = TinyRuns(pool, tmp_path_factory)
        if not hasattr(request.config, "workerinput"):  # xdist's workers have it
            for tiny in (param.values[0] for param in TINY_RUNS):
                if tiny.script in selected:
                    runs.start(tiny)
        yield runs


@pytest.mark.parametrize("tiny", TINY_RUNS)
def test_runs_in_its_tiny_mode(tiny: Tiny, tiny_runs: TinyRuns) -> None:
    ran = tiny_runs.result(tiny)
    print(f"{tiny.script} --tiny: {ran.seconds:.0f} s")  # beside the others' (pytest -rP): what CI's time goes to

    assert ran.returncode == 0, ran.output[-4000:]
    missing = [shown for shown in tiny.shows if shown not in ran.output]
    assert not missing, f"{tiny.script} did not print {missing}:\n{ran.output[-4000:]}"
    assert tiny.writes is None or (ran.tmp / tiny.writes).is_file()


def test_every_benchmark_has_a_tiny_run() -> None:
    scripts = {path.stem for path in (REPO / "benchmarks").glob("*.py")} - {"samples"}
    tested = {param.values[0].script for param in TINY_RUNS}
    assert scripts == tested | set(RUN_ELSEWHERE), scripts ^ (tested | set(RUN_ELSEWHERE))
    assert not tested & set(RUN_ELSEWHERE)
    for script in scripts:
        assert "--tiny" in (REPO / "benchmarks" / f"{script}.py").read_text(), script


def failing(argv: list[str]) -> str:
    """The output of a benchmark run that must fail: its exit status is not 0."""
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0, done.stdout[-3000:]
    return done.stdout + done.stderr


def test_a_reply_that_is_not_sane_fails_the_parser_benchmark() -> None:
    # Every case is killed at its limit: no parse can answer within 10 ms of a child's start.
    output = failing(["benchmarks/parser_worst_case.py", "--tiny", "--shapes", "realistic", "--modes", "pinned", "--timeout", "0.01"])

    assert "NOT SANE" in output and "replies not sane: hermes/realistic/pinned" in output


@pytest.mark.docker
def test_a_refused_session_fails_the_burst_benchmark() -> None:
    # A service that refuses at once at the cap (no admission queue): 3 clients against 2 sessions.
    output = failing(["benchmarks/burst.py", "--tiny", "--admission-timeout-s", "0"])

    assert "burst failed" in output and "capacity_reached" in output
