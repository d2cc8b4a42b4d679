"""The embedded broker starts, answers Kafka requests, stops cleanly, and carries records."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from worker.dev import embedded_broker
from worker.dev.embedded_broker import BrokerStartError, EmbeddedBroker, kafka_answers
from worker.dev.process import free_loopback_port

from support.broker_probe import KafkaUnreachableError, wait_for_kafka
from support.kafka_helpers import consume_all, create_topics, produce


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.broker
def test_start_answers_a_kafka_client_and_stop_leaves_no_process(tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    broker = EmbeddedBroker(log_path=log_path)
    broker.start()
    try:
        assert broker.is_running()
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        kafka_answers("127.0.0.1", broker.port, timeout=2.0)
        wait_for_kafka(broker.bootstrap_servers, timeout=2.0)
        assert "ready in" in log_path.read_text()
        pid = broker.pid
        assert pid is not None
    finally:
        broker.stop()
    assert not broker.is_running()
    assert not _process_exists(pid)
    with pytest.raises(OSError):
        kafka_answers("127.0.0.1", broker.port, timeout=0.5)
    broker.stop()  # idempotent
    broker.stop(timeout=0.1)
    assert broker.pid is None


@pytest.mark.broker
def test_it_starts_from_inside_a_running_event_loop() -> None:
    """A bench or a test may start it from a coroutine: its readiness check runs its own loop."""

    async def start_and_stop() -> None:
        with EmbeddedBroker() as broker:
            kafka_answers("127.0.0.1", broker.port, 5.0)

    asyncio.run(start_and_stop())


def test_context_manager_uses_a_temporary_log_and_removes_it() -> None:
    with EmbeddedBroker() as broker:
        log_path = broker.log_path
        assert log_path is not None and log_path.exists()
        pid = broker.pid
        assert pid is not None
    assert not log_path.exists()
    assert not _process_exists(pid)


@pytest.mark.broker
def test_two_brokers_run_side_by_side_on_different_ports() -> None:
    with EmbeddedBroker() as first, EmbeddedBroker() as second:
        assert first.port != second.port
        for broker in (first, second):
            kafka_answers("127.0.0.1", broker.port, timeout=2.0)
        first.stop()
        kafka_answers("127.0.0.1", second.port, timeout=2.0)


@pytest.mark.broker
def test_port_taken_by_another_broker_is_an_error_for_a_fixed_port() -> None:
    with EmbeddedBroker() as running:
        clash = EmbeddedBroker(port=running.port)
        # The clashing process exits 0 after printing "Address in use"; a probe alone would
        # be answered by the running broker, so this must still be reported as a failure.
        with pytest.raises(BrokerStartError, match="in use"):
            clash.start(timeout=5.0)
        assert not clash.is_running()
        assert running.is_running()


@pytest.mark.broker
def test_free_port_choice_moves_on_when_the_port_was_taken() -> None:
    with EmbeddedBroker() as running:
        mover = EmbeddedBroker()
        mover.port = running.port  # simulate losing the race for the chosen port
        try:
            mover.start(timeout=5.0)
            assert mover.port != running.port
            kafka_answers("127.0.0.1", mover.port, timeout=2.0)
        finally:
            mover.stop()


@pytest.mark.broker
def test_a_start_interrupted_by_ctrl_c_leaves_no_broker_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker has its own session, so the Ctrl-C that ends the demo never reaches it."""
    broker = EmbeddedBroker()
    launched: list[int] = []

    def interrupted(*args: object, **kwargs: object) -> None:
        assert broker.pid is not None  # the readiness probe: the broker is running
        launched.append(broker.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded_broker, "kafka_answers", interrupted)
    with pytest.raises(KeyboardInterrupt):
        broker.start()
    (pid,) = launched
    try:
        assert not _process_exists(pid), "the broker outlived the interrupted start"
        assert broker.log_path is None, "its temporary log is removed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.broker
def test_stop_kills_a_broker_that_ignores_sigterm() -> None:
    broker = EmbeddedBroker()
    broker.start()
    pid = broker.pid
    assert pid is not None
    # SIGSTOP makes the process ignore SIGTERM until continued; stop() must escalate.
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    broker.stop(timeout=0.3)
    assert time.monotonic() - started < 3.0
    assert not _process_exists(pid)


def test_wait_for_kafka_on_a_closed_port_fails_fast_and_clearly() -> None:
    port = free_loopback_port()  # closed: bound, then released; nothing listens there
    started = time.monotonic()
    with pytest.raises(KafkaUnreachableError) as caught:
        wait_for_kafka(f"127.0.0.1:{port}", timeout=0.5)
    assert time.monotonic() - started < 2.0
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "connection refused" in message
    assert "KAFKA_BOOTSTRAP_SERVERS" in message


def test_wait_for_kafka_rejects_a_server_that_does_not_speak_kafka() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_like_http() -> None:
            # A wrong service on the port: reads the request, answers in its own protocol.
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = server.accept()
                    with conn:
                        conn.recv(1024)
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer_like_http, daemon=True).start()
        with pytest.raises(KafkaUnreachableError, match="not a Kafka broker"):
            wait_for_kafka(f"kafka://127.0.0.1:{port}", timeout=0.3)


def test_wait_for_kafka_rejects_malformed_bootstrap_servers() -> None:
    with pytest.raises(ValueError, match="host:port"):
        wait_for_kafka("localhost", timeout=0.1)


@pytest.mark.broker
def test_roundtrip_preserves_keys_values_headers_and_partitions(
    kafka_bootstrap: str, new_topic_name: Callable[..., str]
) -> None:
    topic = new_topic_name()
    create_topics(kafka_bootstrap, [topic], partitions=3)
    records = [
        (f"key-{i}".encode(), f"value-{i}".encode(), i % 3, [("trace-id", str(i).encode())])
        for i in range(300)
    ]
    records.append((None, b"no key", 0, None))
    records.append((b"tombstone", None, 1, [("kind", b"delete"), ("kind", b"twice")]))
    records.append(("text-key", "text value", 2, [("h", "text header")], 1_700_000_000_000))

    produced = produce(kafka_bootstrap, topic, records)
    assert len(produced) == len(records)

    consumed = consume_all(kafka_bootstrap, topic, expected_count=len(records), timeout=10.0)
    assert len(consumed) == len(records)
    by_key = {r.key: r for r in consumed}
    for i in range(300):
        record = by_key[f"key-{i}".encode()]
        assert record.value == f"value-{i}".encode()
        assert record.partition == i % 3
        assert record.headers == (("trace-id", str(i).encode()),)
    assert by_key[None].value == b"no key" and by_key[None].headers == ()
    tombstone = by_key[b"tombstone"]
    assert tombstone.value is None
    assert tombstone.headers == (("kind", b"delete"), ("kind", b"twice"))
    assert tombstone.header("kind") == b"twice"
    text = by_key[b"text-key"]
    assert (text.value, text.headers, text.timestamp) == (
        b"text value",
        (("h", b"text header"),),
        1_700_000_000_000,
    )
    assert {(p.partition, p.offset) for p in produced} == {
        (r.partition, r.offset) for r in consumed
    }
    # Offsets within each partition are contiguous from 0, in production order.
    for partition in range(3):
        offsets = [r.offset for r in consumed if r.partition == partition]
        assert offsets == list(range(len(offsets)))


@pytest.mark.broker
def test_consume_all_times_out_with_a_count_when_records_are_missing(
    kafka_bootstrap: str, new_topic_name: Callable[..., str]
) -> None:
    topic = new_topic_name()
    create_topics(kafka_bootstrap, [topic], partitions=1)
    produce(kafka_bootstrap, topic, [(b"k", b"v", None, None)])
    with pytest.raises(TimeoutError, match="read 1 of 2"):
        consume_all(kafka_bootstrap, topic, expected_count=2, timeout=1.0)
