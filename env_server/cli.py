"""`coding-env`: serve the environment; the sandbox and task commands mount their own subcommands."""

from __future__ import annotations

import argparse
import logging
import socket
from collections.abc import Sequence
from typing import Any

from env_server.settings import ServiceSettings


KEEP_ALIVE_S = 75
"""Seconds the service keeps an idle HTTP connection open: longer than any client or proxy in front of it keeps one
(httpx 5 s, nginx's upstream connections 60 s), so that they, not the service, close it."""


def uvicorn_options(settings: ServiceSettings) -> dict[str, Any]:
    """How uvicorn serves the app, wherever it runs (`coding-env serve`, the tests' in-process server)."""
    return {
        "log_level": settings.log_level,
        # A line per request is debugging material at hundreds of steps a second (the metrics
        # count requests); nginx in front of replicas logs none either.
        "access_log": settings.log_level == "debug",
        "ws_max_size": settings.max_body_bytes,
        # Compressing every frame cost about 0.15 ms of the service's CPU per step (docs/benchmarks.md):
        # frames travel between a trainer and a service on one network, where bytes are cheap.
        "ws_per_message_deflate": False,
        # An idle keep-alive connection is the client's to close: a client that reuses one just as the server
        # drops it gets "connection reset" on a request the service never read, and a step lost that way
        # ends its episode ungraded. uvicorn's default (5 s) equals httpx's pool expiry and is under nginx's
        # upstream keepalive_timeout (60 s), so both raced it, most often when a turn's generation paused a
        # session for about 5 s.
        "timeout_keep_alive": KEEP_ALIVE_S,
    }


def serve(args: argparse.Namespace) -> int:
    """Run the service with uvicorn until SIGINT/SIGTERM (which close every session first)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from env_server.app import create_app

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = ServiceSettings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, **uvicorn_options(settings), timeout_graceful_shutdown=30
    )
    server = uvicorn.Server(config)
    # With --fd the socket is already bound (by a process supervisor, or a test that holds the port
    # across restarts), so no other process can take the port between choosing and binding it.
    server.run(sockets=[inherited_listener(args.fd)] if args.fd is not None else None)
    return 0 if server.started else STARTUP_FAILURE


def inherited_listener(fd: int) -> socket.socket:
    """The listening socket behind an inherited descriptor, as the family it is. uvicorn's own `fd=` takes every
    descriptor for a unix socket, and a TCP listener taken so serves its connections without TCP_NODELAY: each HTTP
    response's body then waited on the client's delayed ACK, about 40 ms (docs/benchmarks.md)."""
    return socket.socket(fileno=fd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coding-env", description="Agentic coding environment service.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the HTTP/WebSocket service (settings: CODING_ENV_* variables)")
    serve_parser.add_argument("--host", help="interface to bind (default: CODING_ENV_HOST or 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, help="TCP port (default: CODING_ENV_PORT or 8000)")
    serve_parser.add_argument("--fd", type=int, help="serve on an inherited, already bound and listening socket (host and port are then ignored)")
    serve_parser.set_defaults(func=serve)
    _mount_optional(commands)
    return parser


def _mount_optional(commands: argparse._SubParsersAction) -> None:
    """Subcommands of the sandbox and task packages (skipped where those extras are not installed)."""
    try:
        from sandbox.cli import register as register_sandbox_cli
    except ImportError:
        pass
    else:
        register_sandbox_cli(commands)
    try:
        from env_server.tasks.cli import register as register_tasks_cli
    except ImportError:
        pass
    else:
        register_tasks_cli(commands)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
