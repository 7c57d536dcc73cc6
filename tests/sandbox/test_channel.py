"""The host's reader of the supervisor channel, fed by a fake stream: bad lines fail one request,
never the reader (issue 10, item 2)."""

from __future__ import annotations

import json
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from sandbox import ArchiveTooLarge, SandboxError
from sandbox.channel import SupervisorChannel, reply_mac

REPLY_TIMEOUT_S = 30.0  # only reached if the channel lost a reply: the tests never wait for it


class FakeSupervisor:
    """Both ends of a channel: requests the host wrote, lines the test makes the 'supervisor' send."""

    def __init__(self) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.requests: queue.Queue[dict[str, Any]] = queue.Queue()
        self.channel = SupervisorChannel(self.lines.get, self._write, lambda: "")
        self.callers = ThreadPoolExecutor(4)

    def _write(self, data: bytes) -> None:
        for line in data.splitlines():
            self.requests.put(json.loads(line))

    def call(self, op: str = "ping") -> tuple[int, Future[dict[str, Any]]]:
        """Start a request on another thread; returns its id (as the supervisor sees it) and future."""
        future = self.callers.submit(self.channel.request, op, REPLY_TIMEOUT_S)
        return self.requests.get(timeout=REPLY_TIMEOUT_S)["id"], future

    def send_raw(self, line: bytes) -> None:
        self.lines.put(line + b"\n")

    def send(self, reply: object, key: bytes | None = None) -> None:
        body = json.dumps(reply).encode()
        self.send_raw(reply_mac(key or self.channel.key, body) + b" " + body)


@pytest.fixture
def fake() -> FakeSupervisor:
    return FakeSupervisor()


def test_a_signed_reply_is_delivered(fake: FakeSupervisor) -> None:
    request_id, future = fake.call()
    fake.send({"id": request_id, "ok": True, "protocol": 2})
    assert future.result(REPLY_TIMEOUT_S)["protocol"] == 2


@pytest.mark.parametrize(
    "garbage",
    [b"not json at all", b"0" * 32 + b' {"ok": true}', b"0" * 32 + b" [1, 2]", b"0" * 32 + b' {"id": "7", "ok": true}', b"", b"\xff\xfe"],
    ids=["bad-json", "no-id", "not-an-object", "id-of-wrong-type", "empty", "not-utf8"],
)
def test_a_line_naming_no_pending_request_fails_nothing_and_the_reader_lives(fake: FakeSupervisor, garbage: bytes) -> None:
    request_id, future = fake.call()
    fake.send_raw(garbage)
    fake.send({"id": request_id + 1000, "ok": True}, key=b"k" * 32)  # unknown id, wrong key
    fake.send({"id": request_id, "ok": True, "protocol": 2})
    assert future.result(REPLY_TIMEOUT_S)["protocol"] == 2
    assert fake.channel.is_open


def test_a_forged_reply_fails_only_its_own_request(fake: FakeSupervisor) -> None:
    forged_id, forged = fake.call()
    honest_id, honest = fake.call()
    fake.send({"id": forged_id, "ok": True, "stdout": "text the command never printed"}, key=b"k" * 32)
    with pytest.raises(SandboxError, match="authentication"):
        forged.result(REPLY_TIMEOUT_S)
    fake.send({"id": forged_id, "ok": True, "protocol": 2})  # the genuine reply, too late: dropped
    fake.send({"id": honest_id, "ok": True, "protocol": 2})
    assert honest.result(REPLY_TIMEOUT_S)["protocol"] == 2
    after_id, after = fake.call()
    fake.send({"id": after_id, "ok": True, "protocol": 2})
    assert after.result(REPLY_TIMEOUT_S)["protocol"] == 2


@pytest.mark.parametrize(
    "reply",
    [{"ok": "yes"}, {}, {"ok": False}, {"ok": False, "errno": "2", "message": 5}, {"ok": False, "error": ["x"], "message": None}],
    ids=["ok-not-bool", "no-ok", "failure-without-fields", "errno-of-wrong-type", "error-of-wrong-type"],
)
def test_a_signed_but_malformed_reply_is_a_sandbox_error(fake: FakeSupervisor, reply: dict[str, Any]) -> None:
    request_id, future = fake.call()
    fake.send({"id": request_id, **reply})
    with pytest.raises(SandboxError):
        future.result(REPLY_TIMEOUT_S)
    next_id, following = fake.call()
    fake.send({"id": next_id, "ok": True, "protocol": 2})
    assert following.result(REPLY_TIMEOUT_S)["protocol"] == 2


def test_named_supervisor_errors_keep_their_type(fake: FakeSupervisor) -> None:
    request_id, future = fake.call("get_archive")
    fake.send({"id": request_id, "ok": False, "error": "ArchiveTooLarge", "message": "over the bound"})
    with pytest.raises(ArchiveTooLarge, match="over the bound"):
        future.result(REPLY_TIMEOUT_S)
    request_id, future = fake.call("read_file")
    fake.send({"id": request_id, "ok": False, "error": "FileNotFoundError", "errno": 2, "message": "No such file", "filename": "x"})
    with pytest.raises(FileNotFoundError):
        future.result(REPLY_TIMEOUT_S)


def test_end_of_stream_fails_every_pending_request(fake: FakeSupervisor) -> None:
    _, future = fake.call()
    fake.lines.put(b"")
    with pytest.raises(SandboxError, match="closed"):
        future.result(REPLY_TIMEOUT_S)
    assert not fake.channel.is_open
