"""A loopback TCP proxy for fault injection: forward, cut every connection, refuse, restore.

It runs its own asyncio loop in a daemon thread, so synchronous tests (and the worker
subprocesses they start) can use it. ``cut()`` aborts every open connection (the peers see
a reset) and stops listening, so new connections are refused until ``restore()`` listens
again on the same port. ``hold(api_key)`` keeps client requests of one Kafka API (produce,
say) from the broker, each connection's later requests queued behind them, until
``release()``; held requests of a connection cut meanwhile are dropped, never sent.

Kafka clients connect to the address a broker advertises, not to the bootstrap address, so
to put a proxy between a client and a broker the broker must advertise the proxy's address
(see ``EmbeddedBroker(advertised_port=...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from worker.dev.process import free_loopback_port

T = TypeVar("T")
LOOPBACK = "127.0.0.1"
CHUNK = 65_536
PRODUCE = 0  # Kafka API key of a produce request


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port``; with ``tls`` (a server
    context), clients connect with TLS and the proxy forwards the plain bytes."""

    def __init__(
        self, target_port: int, port: int | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.target_port = target_port
        self.tls = tls
        self.port = port if port is not None else free_loopback_port()
        self.accepted = 0
        self.refused_since: float | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._held_api_keys: frozenset[int] = frozenset()
        self._released: asyncio.Event | None = None
        self.held_requests = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    # -- synchronous API ---------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def cut(self) -> int:
        """Abort every connection and refuse new ones; returns how many were cut."""
        return self._call(self._cut())

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self._call(self._listen())

    def outage(self, seconds: float) -> int:
        """Cut, wait ``seconds``, restore; returns how many connections were cut."""
        cut = self.cut()
        time.sleep(seconds)
        self.restore()
        return cut

    def hold(self, *api_keys: int) -> None:
        """Keep requests of these Kafka APIs from the broker until :meth:`release`;
        ``held_requests`` counts from 0 again."""
        self.held_requests = 0
        self._call(self._hold(frozenset(api_keys)))

    def release(self) -> None:
        """Send the held requests (of connections still open) and hold nothing more."""
        self._call(self._hold(frozenset()))

    @property
    def open_connections(self) -> int:
        return len(self._writers) // 2

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inside the proxy's loop ---------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        deadline = time.monotonic() + 5
        while True:
            try:
                self._server = await asyncio.start_server(
                    self._handle, LOOPBACK, self.port, reuse_address=True, ssl=self.tls
                )
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        self.refused_since = None

    async def _hold(self, api_keys: frozenset[int]) -> None:
        if self._released is None:
            self._released = asyncio.Event()
        self._held_api_keys = api_keys
        if api_keys:
            self._released.clear()
        else:
            self._released.set()

    async def _cut(self) -> int:
        if self._server is not None:
            self._server.close()
            self._server = None
            self.refused_since = time.monotonic()
        writers, self._writers = list(self._writers), set()
        for writer in writers:
            writer.transport.abort()
        return len(writers) // 2

    async def _handle(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter):
        self.accepted += 1
        try:
            upstream_reader, upstream = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:
            client.transport.abort()
            return
        if self._server is None:  # cut while connecting
            client.transport.abort()
            upstream.transport.abort()
            return
        self._writers.update((client, upstream))
        await asyncio.gather(
            self._requests(client_reader, upstream), self._pipe(upstream_reader, client)
        )

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client to broker, one Kafka request (int32 size, then int16 API key ...) at a time."""
        try:
            while True:
                size = await reader.readexactly(4)
                request = await reader.readexactly(int.from_bytes(size, "big", signed=True))
                api_key = int.from_bytes(request[:2], "big", signed=True)
                if api_key in self._held_api_keys and self._released is not None:
                    self.held_requests += 1
                    await self._released.wait()
                if writer.transport.is_closing():  # cut while held: dropped, never sent
                    return
                writer.write(size + request)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.transport.abort()
