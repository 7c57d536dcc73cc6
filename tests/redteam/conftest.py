"""One real service on 127.0.0.1 for the whole red-team run, with real Docker sandboxes.

Its registry serves builtin tasks only; canary and HumanEval tasks are sent inline (`play(...,
inline=True)`), exactly as the registry would build them.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.service import SharedServices


@pytest.fixture(scope="session")
def redteam_client(services: SharedServices) -> Iterator[httpx.Client]:
    service = services.get(pool_size=2, grading_pool_size=2, max_sessions=8)
    with httpx.Client(base_url=service.url, timeout=300) as client:
        yield client
