"""Hints: templates, show_hints, and the LLM judge against a tiny OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from env_server.hints import TEMPLATES
from env_server.models import ErrorKind
from tests.service.conftest import HttpSession
from tests.service.test_hint_judge import JUDGED, Gate
from tests.traces.teacher_stub import StubOpenAI, Teacher


def test_show_hints_appends_the_hint_to_what_the_policy_sees(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz", show_hints=True)
    observation = session.step("read_file", {"path": "nope.py"})["observation"]
    assert observation["hint"] and observation["output"].endswith(f"Hint: {observation['hint']}")


def test_tool_kinds_carry_the_raw_error_text(session: HttpSession) -> None:
    session.reset(task_id="builtin/fizzbuzz")
    hint = session.step("bash", {"cmd": "ls"})["observation"]["hint"]
    assert "command" in hint and "Field required" in hint


class JudgeServer:
    """An OpenAI-compatible /v1/chat/completions endpoint with a canned answer."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                judge.requests.append({"path": self.path, "body": json.loads(self.rfile.read(int(self.headers["Content-Length"])))})
                body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": judge.answer}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    server = JudgeServer("Use python3; nosuchcmd is not installed. " + "Really. " * 200)
    yield server
    server.server.shutdown()


def test_llm_judge_writes_the_hint_clamped_and_cached(make_service: Callable[..., str], judge: JudgeServer, tmp_path: Path) -> None:
    url = make_service(pool_size=1, hints={
        "llm_url": judge.url, "llm_model": "judge-1", "cache_dir": tmp_path / "hints", "max_chars": 120,
        "judge_kinds": ["command_not_found"], "judge_wait_s": 60,  # this kind is not judged by default; wait for the answer
    })
    with httpx.Client(base_url=url, timeout=60) as client:
        hints = []
        for _ in range(2):  # two sessions, the same failure: the second answer comes from the disk cache
            session = HttpSession(client)
            session.reset(task_id="builtin/fizzbuzz")
            hints.append(session.step("bash", {"command": "nosuchcmd"})["observation"]["hint"])
            session.close()
    assert hints[0] == hints[1]
    assert hints[0].startswith("Use python3; nosuchcmd is not installed.") and len(hints[0]) <= 120
    assert len(judge.requests) == 1
    request = judge.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["body"]["model"] == "judge-1"
    assert "command_not_found" in request["body"]["messages"][1]["content"]
    assert len(list((tmp_path / "hints").glob("*.json"))) == 1


def test_a_slow_judge_does_not_hold_the_step_and_its_hint_lands_in_the_trajectory(make_service: Callable[..., str], tmp_path: Path) -> None:
    gate = Gate()
    with StubOpenAI({"slow": Teacher(gate.answer)}) as stub:
        url = make_service(pool_size=1, hints={"llm_url": stub.base_url, "llm_model": "slow", "llm_timeout_s": 60, "judge_wait_s": 0})
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                session = HttpSession(client)
                session.reset(task_id="builtin/fizzbuzz")
                # The judge holds its answer until the gate opens: the step must not wait for it.
                failed = session.step("bash", {"command": "exit 3"})["observation"]
                assert failed["error_kind"] == "nonzero_exit" and failed["hint"] == TEMPLATES[ErrorKind.NONZERO_EXIT]
                assert gate.asked.wait(60)
                assert session.step("submit")["done"] is True
                log = tmp_path / "trajectories" / "episodes.jsonl"
                assert not log.exists()  # the episode is logged once its late hint is in
                gate.open.set()
                trajectory = client.get(f"/sessions/{session.id}/trajectory").json()  # waits for the late hint
                assert trajectory["steps"][0]["observation"]["hint"] == JUDGED
                (logged,) = [json.loads(line) for line in log.read_text().splitlines()]
                assert logged["steps"][0]["observation"]["hint"] == JUDGED
                session.close()
        finally:
            gate.open.set()
