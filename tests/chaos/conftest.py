"""Fixtures of the chaos tests: a broker of their own, reached through a proxy they control."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from worker.dev.process import free_loopback_port

from support.fixtures import dedicated_broker
from support.tcp_proxy import TcpProxy


@pytest.fixture(scope="module")
def proxied() -> Iterator[tuple[TcpProxy, str]]:
    """A dedicated broker reachable only through a proxy: (proxy, bootstrap via the proxy)."""
    proxy_port = free_loopback_port()
    with (
        dedicated_broker(advertised_port=proxy_port) as broker,
        TcpProxy(broker.port, port=proxy_port) as proxy,
    ):
        yield proxy, f"127.0.0.1:{proxy_port}"
