"""`python -m trainer_client.traces replay` as a process: killed mid-run, then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from trace_builders import COST_PER_ANSWER, USD_PER_MTOK, bash, make_state
from teacher_stub import StubOpenAI, Teacher, tool_answer

from trainer_client.records import PreferencePair
from trainer_client.traces.cli import main
from trainer_client.traces.jsonl import write_models
from trainer_client.traces.progress import report_path

REPO = Path(__file__).resolve().parents[2]


def write_teachers(path: Path, base_url: str, names: list[str], cache_dir: Path, **extra: object) -> Path:
    teachers = [
        {
            "name": name,
            "base_url": base_url,
            "model": name,
            "input_usd_per_mtok": USD_PER_MTOK,
            "output_usd_per_mtok": USD_PER_MTOK,
            "family": f"lab-{name}",
            "max_tokens": 16,
            **extra,
        }
        for name in names
    ]
    path.write_text(yaml.safe_dump({"teachers": teachers, "cache_dir": str(cache_dir), "concurrency": 1}))
    return path


def replay_process(teachers: Path, states: Path, out: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "trainer_client.traces", "replay", "--teachers", str(teachers),
               "--states", str(states), "--out", str(out), "--budget-usd", "100"]
    with log.open("ab") as sink:
        return subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)


def test_killed_run_resumes_without_paying_twice(tmp_path: Path) -> None:
    states = tmp_path / "states.jsonl"
    write_models(states, [make_state(f"s{i}", bash("ls")) for i in range(5)])
    out, log = tmp_path / "pairs.jsonl", tmp_path / "replay.log"
    teachers = {name: Teacher(answer=lambda body: tool_answer("bash", {"command": "pytest"})) for name in ("a", "b")}

    # Request 4 is the second teacher's question about the second state: hold it, then kill.
    with StubOpenAI(teachers, block_at_request=4) as server:
        config = write_teachers(tmp_path / "teachers.yaml", server.base_url, ["a", "b"], tmp_path / "cache")
        first = replay_process(config, states, out, log)
        try:
            assert server.blocked.wait(timeout=120), log.read_text()
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        server.block_at_request = None
        server.release()
        paid_before_kill = len(server.answered())

        second = replay_process(config, states, out, log)
        assert second.wait(timeout=120) == 0, log.read_text()
        digests = [request.digest for request in server.answered()]

    assert paid_before_kill == 3
    assert len(digests) == len(set(digests)) == 10, "a question was paid for twice"
    pairs = [PreferencePair.model_validate_json(line) for line in out.read_text().splitlines()]
    assert sorted(pair.state_id for pair in pairs) == [f"test:s{i}" for i in range(5)]
    report = json.loads(report_path(out).read_text())
    assert report["states_resumed"] == 1
    assert report["cache_hits"] == 1  # the answer paid just before the kill
    assert report["calls"] == 7
    assert report["spent_total_usd"] == pytest.approx(10 * COST_PER_ANSWER)


def test_replay_cli_rejects_a_missing_api_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    teachers = write_teachers(
        tmp_path / "teachers.yaml", "http://127.0.0.1:9/v1", ["a"], tmp_path / "cache",
        api_key_env="CODING_ENV_TEST_KEY_THAT_IS_NOT_SET",
    )
    states = tmp_path / "states.jsonl"
    write_models(states, [make_state("s", bash("ls"))])
    code = main(["replay", "--teachers", str(teachers), "--states", str(states),
                 "--out", str(tmp_path / "pairs.jsonl"), "--budget-usd", "1"])
    assert code == 2
    assert "CODING_ENV_TEST_KEY_THAT_IS_NOT_SET is not set" in capsys.readouterr().err


def test_replay_cli_rejects_a_malformed_teachers_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    teachers = tmp_path / "teachers.yaml"
    teachers.write_text("teachers:\n  - name: a\n    model: [unclosed\n")
    code = main(["replay", "--teachers", str(teachers), "--states", str(tmp_path / "s.jsonl"),
                 "--out", str(tmp_path / "p.jsonl"), "--budget-usd", "1"])
    assert code == 2
    assert "invalid teachers file" in capsys.readouterr().err


def test_trace_package_imports_no_training_stack() -> None:
    probe = (
        "import sys, trainer_client.traces.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'trl', 'fastapi'}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
