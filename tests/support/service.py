"""The one way the tests run the service: the real app under a real uvicorn on 127.0.0.1.

The listening socket is bound before uvicorn starts and handed to it (`Server.run(sockets=...)`),
so no other process can take the port in between, and start-up is awaited on an event set when
uvicorn's own start-up (the app's lifespan: warm pools) has finished, not by polling `/health`.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from env_server.app import create_app
from env_server.cli import uvicorn_options
from env_server.settings import ServiceSettings
from env_server.tasks import TaskRegistry, builtin

START_TIMEOUT_S = 300.0
"""Longest wait for start-up (warm pools of real sandboxes on a loaded machine)."""

TEST_DEFAULTS: dict[str, object] = {"pool_size": 2, "max_sessions": 16, "reap_orphans_on_start": False}
"""Small warm pools; no orphan reaping at start, because other test runs share the engine."""


def builtin_registry() -> TaskRegistry:
    """The builtin suite only: small, fast tasks with known solutions."""
    registry = TaskRegistry()
    registry.register(builtin.SUITE, builtin.BuiltinSuite)
    return registry


def service_settings(directory: Path, **overrides: object) -> ServiceSettings:
    """`TEST_DEFAULTS` plus `overrides`; finished episodes are logged under `directory/trajectories`."""
    return ServiceSettings(**{**TEST_DEFAULTS, "trajectory_dir": directory / "trajectories", **overrides})


class _ReadyServer(uvicorn.Server):
    """A uvicorn server that says when its start-up is over (an event, not a poll)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextmanager
def running_service(settings: ServiceSettings, app: FastAPI | None = None) -> Iterator[str]:
    """Serve `app` (default: `create_app(settings)` on the builtin tasks) in a thread; yields its
    base URL once start-up is complete; shuts it down gracefully (every session closed) on exit."""
    app = app or create_app(settings, tasks=builtin_registry())
    # lifespan="on": a failing start-up ends the server instead of serving without its state.
    config = uvicorn.Config(app, lifespan="on", **{**uvicorn_options(settings), "log_level": "warning"})
    server = _ReadyServer(config)
    with socket.create_server(("127.0.0.1", 0)) as sock:

        def serve() -> None:
            try:
                server.run(sockets=[sock])
            finally:
                server.ready.set()  # a start-up that failed wakes the waiter too

        thread = threading.Thread(target=serve, name="test-service", daemon=True)
        thread.start()
        if not server.ready.wait(START_TIMEOUT_S) or not server.started:
            server.should_exit = True
            thread.join(START_TIMEOUT_S)
            raise RuntimeError("the service did not start (see the log above)")
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            thread.join(START_TIMEOUT_S)


@dataclass(frozen=True)
class RunningService:
    """A started service: where to reach it and what it was told (its trajectory log, its token)."""

    url: str
    settings: ServiceSettings


class SharedServices:
    """The test session's long-lived services: one per distinct settings overrides, started on
    first use and all stopped when the session ends, so tests asking for the same settings
    share one server (and its warm pools)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._running: dict[str, RunningService] = {}
        self._stack = ExitStack()

    def get(self, **overrides: object) -> RunningService:
        """The service with `service_settings(..., **overrides)`, started if it is not running yet."""
        key = json.dumps(overrides, sort_keys=True, default=str)
        if key not in self._running:
            settings = service_settings(self._directory / f"service-{len(self._running)}", **overrides)
            url = self._stack.enter_context(running_service(settings))
            self._running[key] = RunningService(url, settings)
        return self._running[key]

    def close(self) -> None:
        self._stack.close()
