"""The worker's HTTP port: /metrics for Prometheus, /healthz and /readyz for probes.

Served from a thread of its own, so a hung event loop still gets an answer (a failing one).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import make_wsgi_app

from worker.stream.health import Verdict, WorkerHealth

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes every few seconds are not worth a log line each."""


def ops_app(health: WorkerHealth) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics = make_wsgi_app()

    def answer(verdict: Verdict, start_response: StartResponse) -> list[bytes]:
        status = "200 OK" if verdict.ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json")])
        return [orjson.dumps(verdict.to_json()) + b"\n"]

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return answer(health.liveness(), start_response)
        if path == "/readyz":
            return answer(health.readiness(), start_response)
        if path in ("/metrics", "/"):
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    return app


def serve(port: int, health: WorkerHealth, host: str = "") -> WSGIServer | None:
    """Start serving in a daemon thread (port 0 = not at all)."""
    if not port:
        return None
    server = make_server(
        host, port, ops_app(health), server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="kp-http", daemon=True).start()
    return server
