"""The service outlasts its clients' idle connections, so none is reset under a request the service never read."""

from __future__ import annotations

import httpx

from env_server.cli import KEEP_ALIVE_S, uvicorn_options
from env_server.settings import ServiceSettings

NGINX_UPSTREAM_KEEPALIVE_TIMEOUT_S = 60  # nginx's default for the upstream connections deploy/nginx keeps


def test_the_service_keeps_an_idle_connection_longer_than_its_clients_and_proxy() -> None:
    served = uvicorn_options(ServiceSettings())["timeout_keep_alive"]
    assert served == KEEP_ALIVE_S
    assert served > httpx.Limits().keepalive_expiry  # the trainer client's pool (httpx defaults)
    assert served > NGINX_UPSTREAM_KEEPALIVE_TIMEOUT_S
