from __future__ import annotations

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
