"""The worker's HTTP port: /metrics for Prometheus, /healthz and /readyz for probes.

Served by one thread of its own running its own event loop, so a hung worker loop still gets
an answer (a failing one), and however many connections are open the port costs that one
thread: a connection is a coroutine, and it is closed when its request has not arrived within
:data:`READ_TIMEOUT_SECONDS` (or its answer was not taken within it). One request per
connection; answers say ``Connection: close``. A head that is not HTTP/1.x gets 400, a request
line or a head over :data:`MAX_REQUEST_HEAD_BYTES` 414 or 431.

/metrics is rendered off this loop, at most once per :data:`METRICS_MAX_AGE_SECONDS` and
format, and the probes never wait for a render.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import logging
import socket
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import urlsplit

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
# Scrapes within this of a render get its bytes: 200 concurrent scrapes, each rendered
# (~10 ms of CPU) in turn on this loop, kept /healthz waiting 2.1-2.4 s
# (tests/unit/io/test_ops_requests.py).
METRICS_MAX_AGE_SECONDS = 1.0
NOT_FOUND = b"not found: try /metrics, /healthz or /readyz\n"
TEXT = ("Content-Type", "text/plain")


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


class Refused(Exception):
    """A request answered with ``status`` and ``reason`` before it is read any further."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class RenderedMetrics:
    """The /metrics body of each format, rendered in a thread at most once per
    :data:`METRICS_MAX_AGE_SECONDS`: concurrent and repeated scrapes share a render."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._renders: dict[tuple[str, bool], tuple[float, asyncio.Future[bytes]]] = {}

    async def body(self, accept: str, gzipped: bool) -> tuple[str, bytes]:
        encoder, content_type = _encoder(accept)
        started, render = self._renders.get((content_type, gzipped), (0.0, None))
        now = time.monotonic()
        if render is None or (render.done() and now - started >= METRICS_MAX_AGE_SECONDS):
            render = asyncio.ensure_future(asyncio.to_thread(self._render, encoder, gzipped))
            self._renders[content_type, gzipped] = now, render
        # Shielded: a scraper that goes away does not cancel the others' render.
        return content_type, await asyncio.shield(render)

    def _render(self, encoder: Callable[[CollectorRegistry], bytes], gzipped: bool) -> bytes:
        body = encoder(self._registry)
        return gzip.compress(body, compresslevel=6) if gzipped else body


def _encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus-client's content negotiation. It raises on an OpenMetrics ``version`` it
    cannot compare (quoted, as HTTP allows: ``version="1.0.0"``, or ``1.0.0-rc1``): such a
    scrape gets the text format, as one without an Accept header does, not a 500."""
    try:
        return choose_encoder(accept)
    except (TypeError, ValueError):
        return choose_encoder("")


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether ``Accept-Encoding`` takes gzip: named (or ``*``, gzip unnamed) with q above 0."""
    weights = {}
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        weights[coding.strip().lower()] = weight
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


async def _line(reader: asyncio.StreamReader, too_long: Refused) -> bytes:
    """One line of the head; ``too_long`` when over the reader's limit (the head's)."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise too_long from None


def _path(target: str) -> str:
    """The path of an origin-form target (``/metrics?x``) or of an absolute-form one
    (``http://host:9464/metrics``), which HTTP/1.1 servers must accept."""
    if target.startswith("/"):
        return target.partition("?")[0]
    return urlsplit(target).path or "/"


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """Method, target and headers (names in lower case, repeats joined by commas). A line may
    end in a bare LF, as RFC 9112 lets a server accept."""
    line = await _line(reader, Refused(414, "request line too long"))
    size = len(line)
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "not an HTTP/1.x request line")
    headers: dict[str, str] = {}
    while (line := await _line(reader, Refused(431, "request head too large"))).rstrip(b"\r\n"):
        size += len(line)
        if size > MAX_REQUEST_HEAD_BYTES:
            raise Refused(431, "request head too large")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or name.split() != [name]:  # no name, or space in or around it
            raise Refused(400, "malformed header line")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return parts[0], parts[1], headers


class OpsServer:
    """The endpoints on an already bound socket, from a thread of their own."""

    def __init__(
        self, listener: socket.socket, health: WorkerHealth, registry: CollectorRegistry = REGISTRY
    ) -> None:
        self.listener = listener
        self.port = int(listener.getsockname()[1])
        self._health = health
        self._metrics = RenderedMetrics(registry)
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

    async def respond(
        self, method: str, target: str, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Status, headers and body of the answer to one request."""
        if method not in ("GET", "HEAD"):
            return 405, [TEXT, ("Allow", "GET, HEAD")], b"GET only\n"
        path = _path(target)
        if path in ("/healthz", "/readyz"):
            health = self._health
            verdict: Verdict = health.liveness() if path == "/healthz" else health.readiness()
            body = orjson.dumps(verdict.to_json()) + b"\n"
            return (200 if verdict.ok else 503), [("Content-Type", "application/json")], body
        if path in ("/metrics", "/"):
            gzipped = _accepts_gzip(headers.get("accept-encoding", ""))
            content_type, body = await self._metrics.body(headers.get("accept", ""), gzipped)
            extra = [("Content-Type", content_type), ("Vary", "Accept, Accept-Encoding")]
            return 200, extra + ([("Content-Encoding", "gzip")] if gzipped else []), body
        return 404, [TEXT], NOT_FOUND

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT_SECONDS)
            except Refused as refused:
                method, answer = "GET", (refused.status, [TEXT], f"{refused}\n".encode())
            else:
                method, target, headers = request
                try:
                    answer = await self.respond(method, target, headers)
                except Exception:
                    log.exception("answering a request failed", extra={"path": target[:100]})
                    answer = 500, [TEXT], b"failed\n"
            status, extra, body = answer
            lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
            lines += [f"{name}: {value}" for name, value in extra]
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
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            writer.transport.abort()  # idle, too slow or gone: no answer
        except BaseException:
            writer.transport.abort()
            raise


def serve(port: int, health: WorkerHealth, host: str = "") -> OpsServer | None:
    """Bind ``port`` and start serving (port 0 = not at all)."""
    if not port:
        return None
    return OpsServer(listen(port, host), health).start()
