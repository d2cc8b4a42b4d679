"""The worker's HTTP port: /metrics for Prometheus, /healthz and /readyz for probes.

Served by one thread of its own running its own event loop, so a hung worker loop still gets
an answer (a failing one), and however many connections are open the port costs that one
thread: a connection is a coroutine, and it is closed when its request has not arrived within
:data:`READ_TIMEOUT_SECONDS` (or its answer was not taken within it). One request per
connection; answers say ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import logging
import socket
import threading
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus

import orjson
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from worker.stream.health import Verdict, WorkerHealth

log = logging.getLogger(__name__)

# An idle connection, or one that sends its request head slower than this, is closed: a
# scraper or a probe sends its request at once. Also the time an answer may wait to be taken.
READ_TIMEOUT_SECONDS = 5.0
# A request head (request line and headers) longer than this is refused.
MAX_REQUEST_HEAD_BYTES = 16 * 1024
NOT_FOUND = b"not found: try /metrics, /healthz or /readyz\n"


class MetricsPortUnavailable(OSError):
    """The port for /metrics, /healthz and /readyz cannot be bound (in use, or not allowed)."""

    def __init__(self, port: int, error: OSError) -> None:
        self.port = port
        reason = error.strerror or str(error)
        super().__init__(
            f"metrics port {port} is not available ({reason}): set KP_METRICS_PORT to a free "
            "port, or to 0 to serve no metrics and no health endpoints"
        )


def listen(port: int, host: str = "") -> socket.socket:
    """Bind the port now, so that a busy one stops the start with a clear error. On every
    address, IPv6 ones too where the machine has IPv6: a cluster whose pods have IPv6
    addresses probes and scrapes them there."""
    if not host and socket.has_dualstack_ipv6():
        try:
            return socket.create_server(
                ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128
            )
        except OSError as exc:  # IPv6 switched off in the container: IPv4 alone, as before
            if exc.errno == errno.EADDRINUSE:
                raise MetricsPortUnavailable(port, exc) from None
    try:
        return socket.create_server((host, port), backlog=128)
    except OSError as exc:
        raise MetricsPortUnavailable(port, exc) from None


def respond(
    method: str, target: str, headers: dict[str, str], health: WorkerHealth
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of the answer to one request."""
    if method not in ("GET", "HEAD"):
        return 405, [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")], b"GET only\n"
    path = target.split("?", 1)[0]
    if path in ("/healthz", "/readyz"):
        verdict: Verdict = health.liveness() if path == "/healthz" else health.readiness()
        body = orjson.dumps(verdict.to_json()) + b"\n"
        return (200 if verdict.ok else 503), [("Content-Type", "application/json")], body
    if path in ("/metrics", "/"):
        encoder, content_type = _encoder(headers.get("accept", ""))
        body = encoder(REGISTRY)
        extra = [("Content-Type", content_type)]
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            extra.append(("Content-Encoding", "gzip"))
        return 200, extra, body
    return 404, [("Content-Type", "text/plain")], NOT_FOUND


def _encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus-client's content negotiation. It raises on an OpenMetrics ``version`` it
    cannot compare (quoted, as HTTP allows: ``version="1.0.0"``, or ``1.0.0-rc1``): such a
    scrape gets the text format, as one without an Accept header does, not a 500."""
    try:
        return choose_encoder(accept)
    except (TypeError, ValueError):
        return choose_encoder("")


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


class OpsServer:
    """The endpoints on an already bound socket, from a thread of their own."""

    def __init__(self, listener: socket.socket, health: WorkerHealth) -> None:
        self.listener = listener
        self.port = int(listener.getsockname()[1])
        self._health = health
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kp-http", daemon=True)

    def start(self) -> OpsServer:
        self._thread.start()
        self._started.wait(10)
        return self

    def shutdown(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5)
        self.listener.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            log.exception("the metrics port stopped answering", extra={"port": self.port})
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self.listener, limit=MAX_REQUEST_HEAD_BYTES
        )
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()  # open connections are cancelled when the loop ends

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_SECONDS)
            request = _parse_head(head)
            if request is None:
                status, headers, body = 400, [("Content-Type", "text/plain")], b"bad request\n"
                method = "GET"
            else:
                method, target, request_headers = request
                try:
                    status, headers, body = respond(method, target, request_headers, self._health)
                except Exception:
                    log.exception("answering a request failed", extra={"path": target[:100]})
                    status, headers, body = 500, [("Content-Type", "text/plain")], b"failed\n"
            lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
            lines += [f"{name}: {value}" for name, value in headers]
            lines += [
                f"Content-Length: {len(body)}",
                f"Date: {formatdate(usegmt=True)}",
                "Connection: close",
            ]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT_SECONDS)
            writer.close()
        except (
            TimeoutError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            writer.transport.abort()  # idle, too slow, gone, or a head too long: no answer
        except BaseException:
            writer.transport.abort()
            raise


def serve(port: int, health: WorkerHealth, host: str = "") -> OpsServer | None:
    """Bind ``port`` and start serving (port 0 = not at all)."""
    if not port:
        return None
    return OpsServer(listen(port, host), health).start()
