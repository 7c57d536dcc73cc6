"""One real service on 127.0.0.1 for the whole red-team module, with real Docker sandboxes.

Its registry serves builtin tasks only; canary and HumanEval tasks are sent inline (`play(...,
inline=True)`), exactly as the registry would build them.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.service.conftest import running_service, service_settings


@pytest.fixture(scope="session")
def redteam_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    settings = service_settings(tmp_path_factory.mktemp("redteam"), pool_size=2, grading_pool_size=2, max_sessions=8)
    with running_service(settings) as url, httpx.Client(base_url=url, timeout=300) as client:
        yield client
