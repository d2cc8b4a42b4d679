"""The ops port over a real socket: a flood of scrapes, heads it refuses, absolute-form
targets, Accept-Encoding, and no file path in what it shows of the model."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator

import orjson
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from worker.io import http
from worker.stream.health import WorkerHealth
from worker.stream.observer import MetricsObserver

SCRAPES = 200


class SlowCollector:
    """A collector taking ~10 ms of CPU per collect, counting its calls. With ``hold`` set,
    the next collect first waits (off the GIL) until ``release`` is set, or 5 s, then sets
    ``held``."""

    def __init__(self) -> None:
        self.calls = 0
        self.hold = False
        self.release = threading.Event()
        self.held = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        if self.hold:
            self.hold = False
            self.release.wait(5)
            self.held.set()
        until = time.thread_time() + 0.01
        while time.thread_time() < until:
            pass
        yield GaugeMetricFamily("kp_slow", "a slow collector", value=1)


@pytest.fixture
def slow() -> SlowCollector:
    return SlowCollector()


@pytest.fixture
def port(slow: SlowCollector) -> Iterator[int]:
    registry = CollectorRegistry()
    registry.register(slow)
    server = http.OpsServer(http.listen(0, "127.0.0.1"), WorkerHealth(60.0), registry).start()
    try:
        yield server.port
    finally:
        server.shutdown()


def _send(port: int, request: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(request)
    return sock


def _answer(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    with sock:
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (x.partition(":") for x in lines)}
    return status, headers, body


def _exchange(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    return _answer(_send(port, request))


def test_a_flood_of_scrapes_is_rendered_once_and_probes_do_not_wait(
    port: int, slow: SlowCollector
) -> None:
    """200 concurrent scrapes rendered one after another (~10 ms each) kept /healthz waiting
    2.1-2.4 s; now they share a render and /healthz answers meanwhile. The render is held
    until /healthz has answered, so a probe that waited for it would take the 5 s hold."""
    slow.hold = True
    scrapes = [_send(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(SCRAPES)]
    status, _, _ = _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answered_during_render = not slow.held.is_set()
    slow.release.set()
    answers = [_answer(sock) for sock in scrapes]
    assert status == "HTTP/1.1 200 OK"
    assert answered_during_render, "/healthz waited for the /metrics render"
    assert {status for status, _, _ in answers} == {"HTTP/1.1 200 OK"}
    assert len({body for _, _, body in answers}) == 1, "the same rendered bytes"
    assert b"kp_slow 1.0" in answers[0][2]
    assert slow.calls <= 3, f"{slow.calls} renders for {SCRAPES} scrapes"


def test_scrapes_a_second_apart_are_rendered_anew(port: int, slow: SlowCollector) -> None:
    for _ in range(3):
        assert _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 200 OK"
    assert slow.calls == 1
    time.sleep(http.METRICS_MAX_AGE_SECONDS + 0.1)
    _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert slow.calls == 2


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"hello\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET /metrics HTTP/2.0\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\n folded: x\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET /" + b"a" * http.MAX_REQUEST_HEAD_BYTES + b" HTTP/1.1\r\n\r\n", "HTTP/1.1 414"),
        (
            b"GET / HTTP/1.1\r\nX: " + b"a" * http.MAX_REQUEST_HEAD_BYTES + b"\r\n\r\n",
            "HTTP/1.1 431",
        ),
        (b"GET / HTTP/1.1\r\n" + b"X: aaaaaaaaaa\r\n" * 2000 + b"\r\n", "HTTP/1.1 431"),
    ],
)
def test_malformed_and_oversized_heads_get_an_answer(
    port: int, request_head: bytes, status: str
) -> None:
    assert _exchange(port, request_head)[0].startswith(status)


def test_bare_lf_line_ends_are_accepted(port: int) -> None:
    assert _exchange(port, b"GET /healthz HTTP/1.0\n\n")[0] == "HTTP/1.1 200 OK"


def test_an_absolute_form_target_is_its_path(port: int) -> None:
    status, _, body = _exchange(port, b"GET http://x:9464/metrics?a=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == "HTTP/1.1 200 OK" and b"kp_slow 1.0" in body
    assert _exchange(port, b"GET http://x/healthz HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 200 OK"
    assert _exchange(port, b"GET http://x/nope HTTP/1.1\r\n\r\n")[0].startswith("HTTP/1.1 404")


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("br, GZIP;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("*;q=1, gzip;q=0", False),
        ("deflate, br", False),
        ("identity", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding_is_parsed_and_the_answer_varies_with_it(
    port: int, accept_encoding: str, gzipped: bool
) -> None:
    _, headers, body = _exchange(
        port, f"GET /metrics HTTP/1.1\r\nAccept-Encoding: {accept_encoding}\r\n\r\n".encode()
    )
    assert ("content-encoding" in headers) == gzipped, headers
    assert b"kp_slow 1.0" in (gzip.decompress(body) if gzipped else body)
    assert "accept-encoding" in headers["vary"].lower()


def test_no_file_path_in_readiness_or_the_embedder_label() -> None:
    """A path tells whoever reads the port where the operator keeps the model files."""
    observer = MetricsObserver()
    observer.embedder_loaded(
        None, "model /srv/secret-models/minilm/model.onnx cannot be loaded: bad file"
    )
    observer.health.assignment_received()
    server = http.OpsServer(http.listen(0, "127.0.0.1"), observer.health).start()
    try:
        _, _, ready = _exchange(server.port, b"GET /readyz HTTP/1.1\r\n\r\n")
        _, _, scraped = _exchange(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
    finally:
        server.shutdown()
    scorer = orjson.loads(ready)["checks"]["scorer"]
    assert scorer == "none (model model.onnx cannot be loaded: bad file)", scorer
    info = next(
        line for line in scraped.decode().splitlines() if line.startswith("kp_embedder_info")
    )
    assert "model.onnx cannot be loaded" in info and "/srv" not in info, info
    observer.embedder_loaded("minilm-int8", None)  # the id, a name, where a model loaded
    assert observer.health.readiness().checks["scorer"] == "loaded: minilm-int8"
