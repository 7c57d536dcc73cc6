"""Fixtures for the task and grading tests: one hardened Docker sandbox per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxSpec, open_sandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with open_sandbox(SandboxSpec(), backend="docker") as opened:
        yield opened


@pytest.fixture
def workspace(sandbox: Sandbox) -> Sandbox:
    """The module's sandbox with an empty workspace (and /tmp) for this test."""
    result = sandbox.exec("find . /tmp -mindepth 1 -delete")
    assert result.exit_code == 0, result.stderr
    return sandbox
