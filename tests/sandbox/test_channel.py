"""The host's reader of the supervisor channel, fed by a fake supervisor over a socket pair: bad lines fail
one request, never the reader (issue 10, item 2). Every test runs with the replies read on the channel's own
thread and on an event loop (decision 138)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import socket
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from sandbox import ArchiveTooLarge, SandboxError
from sandbox.base import FailureReport
from sandbox.channel import SupervisorChannel, SupervisorStreams, reply_mac
from tests.sandbox.support import LOOP_KINDS, loop_on_a_thread, next_turn, run_on

REPLY_TIMEOUT_S = 30.0  # only reached if the channel lost a reply: the tests never wait for it
READ_BYTES = 5
"""The host reads the stream 5 bytes at a time: lines and payloads arrive split, as a real stream's can."""

T = TypeVar("T")


class FakeSupervisor:
    """Both ends of a channel: requests the host wrote, lines the test makes the 'supervisor' send."""

    def __init__(self, replies_on: asyncio.AbstractEventLoop | None) -> None:
        self.host_end, self.supervisor_end = socket.socketpair()
        self.requests: queue.Queue[dict[str, Any]] = queue.Queue()
        self.payloads: queue.Queue[bytes] = queue.Queue()
        self._payload_left = 0
        self.loop = replies_on
        streams = SupervisorStreams(self._read, self._write, self.host_end.fileno(), lambda: FailureReport(""))
        self.channel = SupervisorChannel(streams, replies_on)
        self.callers = ThreadPoolExecutor(4)

    def _read(self) -> bytes | None:
        return self.host_end.recv(READ_BYTES) or None

    def _write(self, data: bytes) -> None:
        """A request line, or the raw payload that follows one (kept as the last request's)."""
        if self._payload_left:
            self._payload_left -= len(data)
            self.payloads.put(data)
            return
        request = json.loads(data)
        self._payload_left = request.get("payload_bytes", 0)
        self.requests.put(request)

    def call(self, op: str = "ping", payload: bytes = b"") -> tuple[int, Future[dict[str, Any]]]:
        """Start a request on another thread; returns its id (as the supervisor sees it) and future."""
        future = self.callers.submit(self.channel.request, op, REPLY_TIMEOUT_S, payload)
        return self.requests.get(timeout=REPLY_TIMEOUT_S)["id"], future

    def send_raw(self, line: bytes) -> None:
        self.supervisor_end.sendall(line + b"\n")

    def send(self, reply: object, key: bytes | None = None, payload: bytes = b"", payload_key: bytes | None = None) -> None:
        """A reply line signed with `key` (default: the channel's), then `payload` announced in it
        and signed with `payload_key` (default: `key`)."""
        key = key or self.channel.key
        if payload:
            assert isinstance(reply, dict)
            reply = {**reply, "payload_bytes": len(payload), "payload_mac": reply_mac(payload_key or key, payload).decode()}
        body = json.dumps(reply).encode()
        self.supervisor_end.sendall(reply_mac(key, body) + b" " + body + b"\n" + payload)

    def end_stream(self) -> None:
        self.supervisor_end.shutdown(socket.SHUT_WR)

    def run(self, scenario: Callable[[], Awaitable[T]]) -> T:
        """Run `scenario` on the loop that reads the replies, or on a loop of its own when a thread reads them."""
        if self.loop is None:
            return asyncio.run(scenario())
        return run_on(self.loop, scenario, REPLY_TIMEOUT_S)

    def close(self) -> None:
        self.channel.close()
        self.callers.shutdown()
        self.host_end.close()
        self.supervisor_end.close()


@pytest.fixture(params=["thread", *LOOP_KINDS])
def fake(request: pytest.FixtureRequest) -> Iterator[FakeSupervisor]:
    """A fake supervisor whose replies a thread of the channel's reads, or an event loop of each kind."""
    with contextlib.ExitStack() as stack:
        loop = None if request.param == "thread" else stack.enter_context(loop_on_a_thread(request.param))
        supervisor = FakeSupervisor(loop)
        yield supervisor
        supervisor.close()


def test_a_signed_reply_is_delivered(fake: FakeSupervisor) -> None:
    request_id, future = fake.call()
    fake.send({"id": request_id, "ok": True, "protocol": 3})
    assert future.result(REPLY_TIMEOUT_S)["protocol"] == 3


@pytest.mark.parametrize(
    "garbage",
    [b"not json at all", b"0" * 32 + b' {"ok": true}', b"0" * 32 + b" [1, 2]", b"0" * 32 + b' {"id": "7", "ok": true}', b"", b"\xff\xfe"],
    ids=["bad-json", "no-id", "not-an-object", "id-of-wrong-type", "empty", "not-utf8"],
)
def test_a_line_naming_no_pending_request_fails_nothing_and_the_reader_lives(fake: FakeSupervisor, garbage: bytes) -> None:
    request_id, future = fake.call()
    fake.send_raw(garbage)
    fake.send({"id": request_id + 1000, "ok": True}, key=b"k" * 32)  # unknown id, wrong key
    fake.send({"id": request_id, "ok": True, "protocol": 3})
    assert future.result(REPLY_TIMEOUT_S)["protocol"] == 3
    assert fake.channel.is_open


def test_a_forged_reply_fails_only_its_own_request(fake: FakeSupervisor) -> None:
    forged_id, forged = fake.call()
    honest_id, honest = fake.call()
    fake.send({"id": forged_id, "ok": True, "stdout": "text the command never printed"}, key=b"k" * 32)
    with pytest.raises(SandboxError, match="authentication"):
        forged.result(REPLY_TIMEOUT_S)
    fake.send({"id": forged_id, "ok": True, "protocol": 3})  # the genuine reply, too late: dropped
    fake.send({"id": honest_id, "ok": True, "protocol": 3})
    assert honest.result(REPLY_TIMEOUT_S)["protocol"] == 3
    after_id, after = fake.call()
    fake.send({"id": after_id, "ok": True, "protocol": 3})
    assert after.result(REPLY_TIMEOUT_S)["protocol"] == 3


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
    fake.send({"id": next_id, "ok": True, "protocol": 3})
    assert following.result(REPLY_TIMEOUT_S)["protocol"] == 3


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
    fake.end_stream()
    with pytest.raises(SandboxError, match="closed"):
        future.result(REPLY_TIMEOUT_S)
    assert not fake.channel.is_open


def test_payloads_travel_raw_after_their_line(fake: FakeSupervisor) -> None:
    data = bytes(range(256)) * 40 + b"\n\n{}\n"  # newlines and JSON-looking bytes inside
    request_id, future = fake.call("put_archive", payload=data)
    assert fake.payloads.get(timeout=REPLY_TIMEOUT_S) == data
    fake.send({"id": request_id, "ok": True})
    assert "payload" not in future.result(REPLY_TIMEOUT_S)
    request_id, future = fake.call("read_file")
    fake.send({"id": request_id, "ok": True}, payload=data)
    assert future.result(REPLY_TIMEOUT_S)["payload"] == data


def test_a_forged_line_announcing_a_payload_swallows_nothing(fake: FakeSupervisor) -> None:
    # Unauthenticated: the reader must not read the honest reply that follows as its payload.
    request_id, future = fake.call("read_file")
    fake.send({"id": request_id, "ok": True, "payload_bytes": 10**6, "payload_mac": "0" * 32}, key=b"k" * 32)
    with pytest.raises(SandboxError, match="authentication"):
        future.result(REPLY_TIMEOUT_S)
    next_id, following = fake.call("read_file")
    fake.send({"id": next_id, "ok": True}, payload=b"honest bytes")
    assert following.result(REPLY_TIMEOUT_S)["payload"] == b"honest bytes"


def test_a_corrupted_payload_fails_only_its_own_request(fake: FakeSupervisor) -> None:
    request_id, future = fake.call("get_archive")
    fake.send({"id": request_id, "ok": True}, payload=b"tampered archive", payload_key=b"k" * 32)
    with pytest.raises(SandboxError, match="payload .* failed authentication"):
        future.result(REPLY_TIMEOUT_S)
    next_id, following = fake.call("get_archive")
    fake.send({"id": next_id, "ok": True}, payload=b"genuine archive")
    assert following.result(REPLY_TIMEOUT_S)["payload"] == b"genuine archive"
    assert fake.channel.is_open


def test_a_signed_line_announcing_an_impossible_payload_breaks_the_channel(fake: FakeSupervisor) -> None:
    request_id, future = fake.call("read_file")
    fake.send({"id": request_id, "ok": True, "payload_bytes": -5, "payload_mac": "0" * 32})
    with pytest.raises(SandboxError, match="malformed payload"):
        future.result(REPLY_TIMEOUT_S)
    assert not fake.channel.is_open


async def _awaited(fake: FakeSupervisor, op: str = "ping", reply_timeout_s: float = REPLY_TIMEOUT_S) -> tuple[int, asyncio.Task[dict[str, Any]]]:
    """Start a request awaited on this loop; returns its id (as the supervisor sees it) and its task."""
    task = asyncio.create_task(fake.channel.request_async(op, reply_timeout_s))
    request_id = (await asyncio.to_thread(fake.requests.get, timeout=REPLY_TIMEOUT_S))["id"]
    return request_id, task


def test_an_awaited_request_gets_its_own_reply_beside_a_blocking_one(fake: FakeSupervisor) -> None:
    async def scenario() -> None:
        awaited_id, awaited = await _awaited(fake)
        blocking_id, blocking = fake.call()
        fake.send({"id": blocking_id, "ok": True, "protocol": 1})
        fake.send({"id": awaited_id, "ok": True, "protocol": 2})
        assert (await awaited)["protocol"] == 2
        assert blocking.result(REPLY_TIMEOUT_S)["protocol"] == 1

    fake.run(scenario)


def test_an_awaited_request_raises_its_failure_and_the_channels_death(fake: FakeSupervisor) -> None:
    async def scenario() -> None:
        request_id, task = await _awaited(fake)
        fake.send({"id": request_id, "ok": False, "error": "ArchiveTooLarge", "message": "over the limit"})
        with pytest.raises(ArchiveTooLarge):
            await task
        _, task = await _awaited(fake)
        fake.end_stream()
        with pytest.raises(SandboxError, match="closed"):
            await task

    fake.run(scenario)


def test_an_awaited_request_without_a_reply_times_out_and_its_late_reply_fails_nothing(fake: FakeSupervisor) -> None:
    async def scenario() -> None:
        late_id, task = await _awaited(fake, reply_timeout_s=0.01)
        with pytest.raises(SandboxError, match="no reply"):
            await task
        request_id, task = await _awaited(fake)
        fake.send({"id": late_id, "ok": True, "protocol": 1})
        fake.send({"id": request_id, "ok": True, "protocol": 2})
        assert (await task)["protocol"] == 2

    fake.run(scenario)


def test_closing_fails_what_waits_and_every_request_after(fake: FakeSupervisor) -> None:
    _, future = fake.call()
    fake.channel.close()
    with pytest.raises(SandboxError, match="closed"):
        future.result(REPLY_TIMEOUT_S)
    with pytest.raises(SandboxError, match="closed"):
        fake.channel.request("ping", REPLY_TIMEOUT_S)


def test_a_closed_channel_leaves_no_descriptor_open(running_loop: asyncio.AbstractEventLoop) -> None:
    # The loop watches a copy of the stream's descriptor, closed only once the loop has let it go.
    open_before = _open_descriptors()
    fake = FakeSupervisor(running_loop)
    request_id, future = fake.call()
    fake.send({"id": request_id, "ok": True, "protocol": 3})
    assert future.result(REPLY_TIMEOUT_S)["protocol"] == 3
    fake.close()
    fake.run(next_turn)  # the loop's turn after the close: it has let the stream go by then
    assert _open_descriptors() == open_before


def test_a_channel_closed_before_its_loop_watched_the_stream_never_watches_it(running_loop: asyncio.AbstractEventLoop) -> None:
    open_before = _open_descriptors()

    async def open_and_close_on_the_loop() -> None:
        fake = FakeSupervisor(running_loop)  # its watch is queued behind this coroutine
        fake.close()

    run_on(running_loop, open_and_close_on_the_loop, REPLY_TIMEOUT_S)
    run_on(running_loop, next_turn, REPLY_TIMEOUT_S)
    assert _open_descriptors() == open_before


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_blocking_request_on_the_loop_that_reads_its_reply_is_refused(running_loop: asyncio.AbstractEventLoop) -> None:
    fake = FakeSupervisor(running_loop)

    async def blocking_on_the_loop() -> None:
        fake.channel.request("ping", REPLY_TIMEOUT_S)

    with pytest.raises(RuntimeError, match="wait forever"):
        fake.run(blocking_on_the_loop)
    assert fake.requests.empty()  # refused before anything was sent
    request_id, future = fake.call()  # from another thread it is served
    fake.send({"id": request_id, "ok": True, "protocol": 3})
    assert future.result(REPLY_TIMEOUT_S)["protocol"] == 3
    fake.close()


def test_a_request_awaited_on_another_loop_than_the_reading_one_gets_its_reply(running_loop: asyncio.AbstractEventLoop) -> None:
    fake = FakeSupervisor(running_loop)

    async def scenario() -> None:
        request_id, task = await _awaited(fake)
        fake.send({"id": request_id, "ok": True, "protocol": 3})
        assert (await task)["protocol"] == 3

    asyncio.run(scenario())
    fake.close()
