from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, open_sandbox
from tests.sandbox.support import BACKENDS, LOOP_KINDS, SPEC, loop_on_a_thread


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def sandbox(backend: str) -> Iterator[Sandbox]:
    with open_sandbox(SPEC, backend=backend) as sb:
        yield sb


@pytest.fixture(params=LOOP_KINDS)
def running_loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    with loop_on_a_thread(request.param) as loop:
        yield loop
