"""The FastAPI application: `create_app` puts the request guard, the error handlers and the routes
of each protocol (`env_server.routes`) in front of one `env_server.service.Service`, which the
lifespan opens at start-up and closes at shutdown.

One `SessionManager` serves every transport: a WebSocket connection, an HTTP session
(`/sessions/...`) and an MCP session (`openenv/session/create`) are the same kind of session.
Why the routes are ours rather than `openenv.create_app`'s: docs/decisions/020-own-routes-over-openenv-types.md.
Why one module per protocol: docs/decisions/027-routes-by-protocol.md.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from env_server.http_errors import add_error_handlers
from env_server.metrics import ServiceMetrics
from env_server.middleware import RequestGuard
from env_server.routes import episodes, http, mcp, sessions, ws
from env_server.routes.session_step import SessionStepLane
from env_server.service import open_service
from env_server.settings import ServiceSettings
from env_server.tasks import TaskRegistry, default_registry


NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def create_app(settings: ServiceSettings | None = None, *, tasks: TaskRegistry | None = None) -> FastAPI:
    """The service, configured by `settings` (default: from `CODING_ENV_*`)."""
    settings = settings or ServiceSettings()
    tasks = tasks or default_registry()
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_service(settings, tasks, metrics) as service:
            app.state.service = service
            yield

    app = FastAPI(
        title="coding-env",
        version="0.1.0",
        description="OpenEnv-compatible agentic coding environment. Protocol: docs/api.md.",
        lifespan=lifespan,
        # FastAPI's own OpenTelemetry hooks look up three global providers on every request to see whether any
        # is configured; the service reports through /metrics (Prometheus) and configures none.
        telemetry=NO_TELEMETRY,
    )
    token = settings.api_token.get_secret_value() if settings.api_token else None
    # The last added runs first: the guard, then the session step's lane (decision 143), then FastAPI's routes.
    app.add_middleware(SessionStepLane)
    app.add_middleware(RequestGuard, token=token, max_body_bytes=settings.max_body_bytes)
    add_error_handlers(app)
    # A request is matched against the routes in this order: the session routes, which carry most steps,
    # go first (each route passed over cost a step about 5 us; docs/benchmarks.md).
    app.include_router(sessions.router)
    app.include_router(mcp.router)
    app.include_router(http.router)
    app.include_router(ws.router)
    app.include_router(episodes.router)
    return app
