"""The LLM hint judge: the last layer, never holding a step past its bound, cache atomic and
read defensively. Against a real OpenAI-compatible server on 127.0.0.1 (tests/traces' stub)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from env_server.hints import TEMPLATES, HintCache, HintGenerator, clamp
from env_server.models import ErrorKind
from env_server.settings import HintSettings
from env_server.tools import TOOLS
from tests.traces.teacher_stub import StubOpenAI, Teacher, text_answer

JUDGED = "Read the assertion that failed first; the off-by-one is in the loop bound."


class Gate:
    """Holds the judge's answer until the test opens it (a slow endpoint, without sleeping)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.open = threading.Event()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        self.asked.set()
        assert self.open.wait(60), "the test never opened the gate"
        return text_answer(JUDGED)


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def stub(gate: Gate) -> Iterator[StubOpenAI]:
    teachers = {
        "prompt": Teacher(lambda body: text_answer(JUDGED)),
        "slow": Teacher(gate.answer),
        "not-json": Teacher(lambda body: text_answer(JUDGED), malformed=True),
        "no-text": Teacher(lambda body: {"role": "assistant", "content": None}),
        "http-500": Teacher(lambda body: text_answer(JUDGED), failures_before_answer=[500]),
    }
    with StubOpenAI(teachers) as server:
        yield server
    gate.open.set()


def _generator(stub: StubOpenAI, model: str, **settings: Any) -> HintGenerator:
    return HintGenerator(HintSettings(llm_url=stub.base_url, llm_model=model, llm_timeout_s=60, **settings), list(TOOLS))


def _test_failure_hint(generator: HintGenerator, output: str = "1 failed, 2 passed"):
    return generator.hint(ErrorKind.TEST_FAILURE, output=output, call={"tool_name": "run_tests", "arguments": {}}, task_prompt="fix median")


TEMPLATE = TEMPLATES[ErrorKind.TEST_FAILURE]


def test_a_slow_judge_never_holds_the_step_and_its_hint_arrives_later(stub: StubOpenAI, gate: Gate) -> None:
    generator = _generator(stub, "slow", judge_wait_s=0)
    try:
        hint = _test_failure_hint(generator)  # returns although the judge has not answered
        assert hint.text == TEMPLATE and hint.later is not None
        assert gate.asked.wait(60)
        gate.open.set()
        assert hint.later.result(timeout=60) == JUDGED
    finally:
        generator.close()


def test_the_step_takes_the_judges_hint_when_it_comes_within_the_bound(stub: StubOpenAI) -> None:
    generator = _generator(stub, "prompt", judge_wait_s=60)
    try:
        hint = _test_failure_hint(generator)
        assert hint.text == JUDGED and hint.later is None
    finally:
        generator.close()


@pytest.mark.parametrize("model", ["not-json", "no-text", "http-500"])
def test_a_judge_answering_garbage_leaves_the_template(stub: StubOpenAI, model: str, tmp_path: Path) -> None:
    generator = _generator(stub, model, judge_wait_s=60, cache_dir=tmp_path)
    try:
        assert _test_failure_hint(generator).text == TEMPLATE
    finally:
        generator.close()
    assert len(stub.requests) == 1
    assert not list(tmp_path.iterdir())  # nothing cached from a failed answer


def test_only_configured_kinds_reach_the_judge(stub: StubOpenAI) -> None:
    generator = _generator(stub, "prompt", judge_wait_s=60)
    try:
        hint = generator.hint(ErrorKind.TYPE_ERROR, output="bash: command: Field required", call=None, task_prompt="t")
        assert hint.text.startswith(TEMPLATES[ErrorKind.TYPE_ERROR]) and "Field required" in hint.text
        assert generator.hint(ErrorKind.SANDBOX_ERROR, output="", call=None, task_prompt="t").text == TEMPLATES[ErrorKind.SANDBOX_ERROR]
    finally:
        generator.close()
    assert stub.requests == []
    generator = _generator(stub, "prompt", judge_wait_s=60, judge_kinds=["type_error"])
    try:
        assert generator.hint(ErrorKind.TYPE_ERROR, output="bad", call=None, task_prompt="t").text == JUDGED
    finally:
        generator.close()


def test_a_judge_that_falls_behind_is_not_queued_without_bound(stub: StubOpenAI, gate: Gate) -> None:
    generator = _generator(stub, "slow", judge_wait_s=0, judge_max_pending=1)
    try:
        first = _test_failure_hint(generator, "1 failed")
        second = _test_failure_hint(generator, "2 failed")
        assert second.text == TEMPLATE and second.later is None  # the judge is busy: no second request
        gate.open.set()
        assert first.later.result(timeout=60) == JUDGED
    finally:
        generator.close()
    assert len(stub.requests) == 1


def test_a_damaged_cache_entry_is_a_miss_and_is_rewritten(stub: StubOpenAI, tmp_path: Path) -> None:
    generator = _generator(stub, "prompt", judge_wait_s=60, cache_dir=tmp_path)
    try:
        assert _test_failure_hint(generator).text == JUDGED
        (entry,) = list(tmp_path.iterdir())
        assert entry.read_text() == '{"hint": "' + JUDGED + '"}'  # no temp file left beside it
        assert _test_failure_hint(generator).text == JUDGED and len(stub.requests) == 1  # from the cache
        for damage in ('{"hint": "Read the asser', "", '["not", "a", "dict"]', '{"hint": 3}'):
            entry.write_text(damage)
            assert _test_failure_hint(generator).text == JUDGED
        assert len(stub.requests) == 5  # every damaged read was a miss, answered again
        assert entry.read_text() == '{"hint": "' + JUDGED + '"}'
    finally:
        generator.close()


def test_the_cache_never_shows_half_a_file(tmp_path: Path) -> None:
    cache = HintCache(tmp_path)
    request = {"model": "m", "messages": []}
    long_hint = "x" * 1_000_000
    stop = threading.Event()
    seen: list[str | None] = []

    def read_while_written() -> None:
        while not stop.is_set():
            seen.append(cache.get(request))

    reader = threading.Thread(target=read_while_written)
    reader.start()
    try:
        for hint in (long_hint, "short", long_hint):
            cache.put(request, hint)
    finally:
        stop.set()
        reader.join()
    assert set(seen) <= {None, long_hint, "short"}  # a read gets a whole entry or none
    assert [p.name for p in tmp_path.iterdir()] == [cache.path(request).name]


def test_clamp_keeps_hints_short() -> None:
    assert clamp("a  b\n c", 40) == "a b c"
    assert len(clamp("word " * 100, 40)) == 40
