"""The metrics port of a real worker process whose bootstrap address has no broker behind it.

- ``kp_broker_reachable`` reads 0 from the first scrape and stays 0, and /readyz says the
  broker was never reached (/healthz stays 200: restarting does not fix an address);
- idle connections cost no thread each, an idle one is closed after the read timeout, and
  /metrics answers meanwhile;
- a busy port ends the start in one line naming it and KP_METRICS_PORT, exit code 2.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from worker.dev.process import WorkerProcess, free_loopback_port
from worker.io import http
from worker.io.http import READ_TIMEOUT_SECONDS

from support.workers import metric_total

IDLE_CONNECTIONS = 200


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture(scope="module")
def lonely_worker() -> Iterator[WorkerProcess]:
    """A worker told to use a loopback port where nothing listens."""
    worker = WorkerProcess(f"127.0.0.1:{free_loopback_port()}", KP_EMBED_CONCURRENCY="1")
    with worker:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                _get(worker.metrics_port, "/metrics")
                break
            except OSError:
                assert worker.alive(), worker.tail()
                time.sleep(0.2)
        worker.wait_for_event("Kafka unreachable; retrying", timeout=30)
        yield worker


def test_a_broker_never_reached_reads_unreachable_and_not_ready(lonely_worker) -> None:
    port = lonely_worker.metrics_port
    readings = []
    for _ in range(10):
        readings.append(metric_total(port, "kp_broker_reachable"))
        time.sleep(0.5)
    assert readings == [0.0] * 10, readings
    status, body = _get(port, "/readyz")
    assert status == 503
    broker = orjson.loads(body)["checks"]["broker"]
    assert broker.startswith("never reached") and "Connect" in broker, broker
    assert _get(port, "/healthz")[0] == 200, "alive: a restart would not find the broker either"


def test_a_worker_waiting_for_the_broker_exports_its_configured_thresholds(
    lonely_worker,
) -> None:
    """A threshold of 0 from a replica still waiting would read, to KpScorerThresholdsDiffer
    and the dashboard, as a replica that accepts everything."""
    port = lonely_worker.metrics_port
    assert metric_total(port, "kp_accept_threshold") == 0.75
    assert metric_total(port, "kp_latency_budget_seconds") == 0.1


def test_idle_connections_cost_no_thread_and_are_closed(lonely_worker) -> None:
    pid, port = lonely_worker.pid, lonely_worker.metrics_port
    assert pid is not None
    before = _threads(pid)
    idle = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the end of the head
        idle.append(slow)
        opened = time.monotonic()
        time.sleep(0.5)
        during = _threads(pid)
        status, body = _get(port, "/metrics")
        assert status == 200 and b"kp_broker_reachable" in body, "answers meanwhile"
        assert during <= before + 2, f"{before} threads before, {during} with {len(idle)} open"
        for sock in idle:
            sock.settimeout(READ_TIMEOUT_SECONDS + 10 - (time.monotonic() - opened))
            with contextlib.suppress(ConnectionResetError):  # an abort closes it too
                assert sock.recv(1024) == b"", "closed without an answer"
        closed_after = time.monotonic() - opened
    finally:
        for sock in idle:
            sock.close()
    assert READ_TIMEOUT_SECONDS - 1 <= closed_after <= READ_TIMEOUT_SECONDS + 5, closed_after
    print(f"\nthreads: {before} before, {during} with {len(idle)} idle connections open")


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="this machine has no IPv6")
def test_the_port_answers_over_ipv6_too(lonely_worker) -> None:
    """A cluster of IPv6 pod addresses probes and scrapes the worker over IPv6."""
    url = f"http://[::1]:{lonely_worker.metrics_port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
    assert _get(lonely_worker.metrics_port, "/healthz")[0] == 200, "and over IPv4"


def test_a_busy_metrics_port_ends_the_start_in_one_line() -> None:
    with socket.create_server(("", 0)) as held:
        port = held.getsockname()[1]
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_loopback_port()}",
            "KP_METRICS_PORT": str(port),
        }
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", "worker"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    named = [line for line in output.splitlines() if "KP_METRICS_PORT" in line]
    assert len(named) == 1 and str(port) in named[0], output
    assert orjson.loads(named[0])["level"] == "error"


def test_a_machine_without_ipv6_listens_on_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    """IPv6 switched off in a container (the family is there, binding it fails): the port is
    served on IPv4 as before, not refused as unavailable."""
    create_server = socket.create_server

    def no_ipv6(address: tuple[str, int], **kwargs: object) -> socket.socket:
        if kwargs.get("family") == socket.AF_INET6:
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        return create_server(address, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(http.socket, "has_dualstack_ipv6", lambda: True)
    monkeypatch.setattr(http.socket, "create_server", no_ipv6)
    server = http.listen(0)
    with contextlib.closing(server):
        assert server.family == socket.AF_INET
        with socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=5):
            pass
