"""`coding-env serve --fd` serves an inherited TCP listener as TCP: its connections get TCP_NODELAY, as on a bound
port. Taken for a unix socket (uvicorn's own `fd=`), they did not, and each HTTP response's body waited on the
client's delayed ACK."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import uvloop

from env_server.cli import inherited_listener


async def _nodelay_of_an_accepted_connection(listener: socket.socket) -> int:
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    address = listener.getsockname()
    with socket.create_connection(address[:2]):
        nodelay = await asyncio.wait_for(accepted, 60)
    server.close()
    return nodelay


def test_an_inherited_tcp_listener_serves_its_connections_without_nagle() -> None:
    with socket.create_server(("127.0.0.1", 0)) as bound:
        listener = inherited_listener(os.dup(bound.fileno()))  # what the child of a supervisor inherits
        assert listener.family == socket.AF_INET
        assert uvloop.run(_nodelay_of_an_accepted_connection(listener)) != 0


def test_an_inherited_unix_listener_stays_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "service.sock")
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(path)
        bound.listen()
        with inherited_listener(os.dup(bound.fileno())) as listener:
            assert listener.family == socket.AF_UNIX
            assert listener.getsockname() == path
