"""Waiting for any Kafka-protocol broker (the embedded one, a container, or the cluster named
by KAFKA_BOOTSTRAP_SERVERS) before the broker tests use it, so that a missing or unreachable
cluster is reported as such instead of as a client timeout deep inside Kafka code."""

from __future__ import annotations

import socket
import time

from worker.dev.embedded_broker import kafka_answers
from worker.retry import backoff

PROBE_BACKOFF_SECONDS = (0.05, 0.1, 0.2, 0.4, 0.5)


class KafkaUnreachableError(ConnectionError):
    """No Kafka broker answered at the configured bootstrap servers within the timeout."""


def wait_for_kafka(bootstrap_servers: str, timeout: float) -> None:
    """Return once any of ``bootstrap_servers`` answers a Kafka client's connection, retrying
    until ``timeout`` seconds have passed; then raise naming each server and its last error."""
    servers = _parse_bootstrap(bootstrap_servers)
    deadline = time.monotonic() + timeout
    last_errors: dict[str, str] = {}
    delays = backoff(PROBE_BACKOFF_SECONDS)
    while True:
        for host, port in servers:
            remaining = deadline - time.monotonic()
            try:
                kafka_answers(host, port, timeout=max(0.05, min(2.0, remaining)))
                return
            except OSError as exc:
                last_errors[f"{host}:{port}"] = _describe_os_error(exc)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            details = "; ".join(f"{server}: {error}" for server, error in last_errors.items())
            raise KafkaUnreachableError(
                f"no Kafka broker answered at {bootstrap_servers!r} within {timeout:g} s "
                f"({details}). Check KAFKA_BOOTSTRAP_SERVERS and that the broker is running."
            )
        time.sleep(min(next(delays), remaining))


def _parse_bootstrap(bootstrap_servers: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]``, optionally with faust's ``kafka://`` scheme."""
    servers: list[tuple[str, int]] = []
    for raw in bootstrap_servers.split(","):
        server = raw.strip()
        for scheme in ("kafka://", "tcp://"):
            server = server.removeprefix(scheme)
        host, _, port = server.rpartition(":")
        host = host.strip("[]")  # IPv6 literals are written [::1]:9092
        if not host or not port.isdigit():
            raise ValueError(f"expected host:port[,host:port...], got {raw.strip()!r}")
        servers.append((host, int(port)))
    return servers


def _describe_os_error(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host ({exc.strerror})"
    return str(exc) or type(exc).__name__
