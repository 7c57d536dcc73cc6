from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, open_sandbox
from tests.sandbox.support import BACKENDS, SPEC


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def sandbox(backend: str) -> Iterator[Sandbox]:
    with open_sandbox(SPEC, backend=backend) as sb:
        yield sb


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own, as the service's runs beside its worker threads."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-event-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
