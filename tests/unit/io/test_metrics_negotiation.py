"""What a scraper's Accept header gets from /metrics, over a real socket of the metrics port.

prometheus-client chooses the format (text, or OpenMetrics when asked for); an Accept header
it cannot parse must still get the metrics, in the text format, and write no error line.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from worker.io import http
from worker.stream.health import WorkerHealth


@pytest.fixture
def port() -> Iterator[int]:
    server = http.OpsServer(http.listen(0, "127.0.0.1"), WorkerHealth(60.0)).start()
    try:
        yield server.port
    finally:
        server.shutdown()


def _scrape(port: int, accept: str) -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (x.partition(":") for x in lines)}
    return status, headers, body


def test_openmetrics_is_served_when_asked_for(port: int) -> None:
    status, headers, body = _scrape(port, "application/openmetrics-text; version=1.0.0")
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")


@pytest.mark.parametrize(
    "accept",
    [
        'application/openmetrics-text; version="1.0.0"',  # a quoted parameter, as HTTP allows
        "application/openmetrics-text; version=1.0.0-rc1",
        "text/plain; version=latest",
    ],
)
def test_an_accept_header_the_library_cannot_parse_gets_the_text_format(
    port: int, accept: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="worker"):
        status, headers, body = _scrape(port, accept)
    assert status == "HTTP/1.1 200 OK", (status, body[:200])
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# TYPE " in body and not body.endswith(b"# EOF\n")
    assert not caplog.records, [r.getMessage() for r in caplog.records]
