"""What the broker refuses the worker, named and retried (worker/io/access.py and its callers):
a topic the user may neither see nor create at start-up, an output topic it may not write to,
the SASL credentials or the broker's certificate. Each is one line that names what to change,
and none stops the worker. The broker test is tests/broker/test_security_kafka.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    TopicAuthorizationFailedError,
)

from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.io import access, app, kafka, publisher
from worker.io.access import ConnectionRefusal, connection_refusal, refusals
from worker.io.publisher import Publisher
from worker.settings import load_settings
from worker.stream.observer import MetricsObserver
from worker.stream.permissions import Refusal

from support.tls import make_broker_certificates


def test_an_authorization_error_names_what_was_refused() -> None:
    assert refusals(GroupAuthorizationFailedError("kp-scorer"), "Read") == [
        Refusal("Read", "group", "kp-scorer")
    ]
    assert refusals(TopicAuthorizationFailedError({"b", "a"}), "Write") == [
        Refusal("Write", "topic", "a"),
        Refusal("Write", "topic", "b"),
    ]
    assert refusals(KafkaError("other"), "Read") == []


def test_a_topic_the_user_may_neither_see_nor_create_is_named() -> None:
    class Admin:
        async def create_topics(self, topics: list[Any]) -> Any:
            return SimpleNamespace(topic_errors=[(topics[0].name, 29, "Authorization failed.")])

    with pytest.raises(kafka.TopicNotAuthorized) as raised:
        asyncio.run(kafka._create(Admin(), [kafka.NewTopic("kp.traces.raw", 1, 1)]))  # type: ignore[arg-type]
    assert raised.value.topic == "kp.traces.raw"
    assert "neither shows topic 'kp.traces.raw'" in str(raised.value)


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "STARTUP_BACKOFF_SECONDS", (0.01,))
    monkeypatch.setattr(publisher, "PUBLISH_RETRY_SECONDS", (0.01,))


def test_the_start_waits_for_a_refused_topic_with_one_line_and_the_broker_reached(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, quick_retries: None
) -> None:
    refused = ["kp.traces.raw", "kp.traces.raw", "kp.traces.accepted"]

    async def ensure_topics(settings: Any, outputs: Any) -> tuple[int, None]:
        if refused:
            raise kafka.TopicNotAuthorized(refused.pop(0))
        return 1, None

    monkeypatch.setattr(app, "ensure_topics", ensure_topics)
    caplog.set_level(logging.INFO, logger="worker")
    observer = MetricsObserver()
    asyncio.run(app._wait_for_kafka(load_settings(), observer, app.FailurePolicy()))
    said = [r.getMessage() for r in caplog.records if r.name == "worker.stream.permissions"]
    create = "(or Create, for the worker to create it)"
    assert said == [
        f"not authorized: Read on topic 'kp.traces.raw' {create}",
        f"authorized: Read on topic 'kp.traces.raw' {create}",
        f"not authorized: Write on topic 'kp.traces.accepted' {create}",
        f"authorized: Write on topic 'kp.traces.accepted' {create}",
    ]
    assert observer.permissions.readiness() == "ok" and observer.broker.ever_reached
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


def test_a_refused_connection_is_said_as_what_to_check(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, quick_retries: None
) -> None:
    tries = [KafkaConnectionError("Unable to bootstrap from [...]")]

    async def ensure_topics(settings: Any, outputs: Any) -> tuple[int, None]:
        if tries:
            raise tries.pop()
        return 1, None

    async def diagnosed(settings: Any) -> ConnectionRefusal:
        return ConnectionRefusal("Kafka refused the SASL credentials of user 'u'", "bad", "X")

    monkeypatch.setattr(app, "ensure_topics", ensure_topics)
    monkeypatch.setattr(app, "connection_refusal", diagnosed)
    caplog.set_level(logging.INFO, logger="worker")
    asyncio.run(app._wait_for_kafka(load_settings(), MetricsObserver(), app.FailurePolicy()))
    (line,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert line.getMessage() == "Kafka refused the SASL credentials of user 'u'; retrying"
    assert (line.error, line.check) == ("bad", "X")  # type: ignore[attr-defined]


class RefusingProducer:
    """aiokafka's producer, refusing ``refusals`` writes to ``topic`` (the broker's answer, or
    before sending when its metadata says so) before it takes them."""

    def __init__(self, topic: str, refusals: int, before_sending: bool = False) -> None:
        self.topic, self.refusals, self.before_sending = topic, refusals, before_sending
        self.sent: list[str] = []

    async def send(self, topic: str, **_: Any) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if topic == self.topic and self.refusals:
            self.refusals -= 1
            if self.before_sending:
                raise TopicAuthorizationFailedError(topic)
            done.set_exception(TopicAuthorizationFailedError())
            return done
        self.sent.append(topic)
        done.set_result(None)
        return done


def dead_letter() -> RoutedRecord:
    source = SourceRecord("kp.traces.raw", 0, 7, 1, b"k", b"{", ())
    return RoutedRecord(source, Decision.DEAD_LETTER, b"{", (), "other")


@pytest.mark.parametrize("before_sending", [False, True])
def test_an_output_topic_refused_is_named_retried_and_published_once_granted(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    quick_retries: None,
    before_sending: bool,
) -> None:
    producer = RefusingProducer("kp.traces.dead-letter", 3, before_sending)
    monkeypatch.setattr(publisher, "AIOKafkaProducer", lambda **config: producer)
    caplog.set_level(logging.INFO, logger="worker")
    observer = MetricsObserver()
    asyncio.run(Publisher(load_settings(), observer=observer).publish([dead_letter()]))
    assert producer.sent == ["kp.traces.dead-letter"]
    said = [r.getMessage() for r in caplog.records if r.name == "worker.stream.permissions"]
    assert said == [
        "not authorized: Write on topic 'kp.traces.dead-letter'",
        "authorized: Write on topic 'kp.traces.dead-letter'",
    ]


def test_a_command_that_gives_up_says_which_topic_was_refused(
    monkeypatch: pytest.MonkeyPatch, quick_retries: None
) -> None:
    producer = RefusingProducer("kp.traces.dead-letter", 10**6)
    monkeypatch.setattr(publisher, "AIOKafkaProducer", lambda **config: producer)
    command = Publisher(load_settings(), give_up_after_seconds=0.05)
    with pytest.raises(
        KafkaError, match=r"not authorized: Write on topic 'kp\.traces\.dead-letter'"
    ):
        asyncio.run(command.publish([dead_letter()]))


@pytest.fixture
def tls_listener(tmp_path: Path) -> Iterator[int]:
    """A TLS port presenting a certificate for 127.0.0.1 that the test's CA signed."""
    (tmp_path / "broker").mkdir()
    server = make_broker_certificates(tmp_path / "broker").server_context()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            try:
                with server.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except OSError:
                pass
            finally:
                connection.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_certificate_no_ca_of_the_settings_signed_is_said_so(
    tls_listener: int, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    other_ca = make_broker_certificates(tmp_path / "other").ca
    settings = load_settings(
        kafka_bootstrap_servers=f"127.0.0.1:{tls_listener}",
        security_protocol="SSL",
        ssl_cafile=other_ca,
    )
    refusal = asyncio.run(connection_refusal(settings, timeout=5))
    assert refusal is not None
    assert refusal.problem == "the broker's TLS certificate is not trusted"
    assert refusal.error == "unable to get local issuer certificate"
    assert refusal.check.startswith("KP_SSL_CAFILE")


def test_a_broker_that_does_not_answer_is_no_refusal() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    settings = load_settings(kafka_bootstrap_servers=f"127.0.0.1:{port}")
    assert asyncio.run(connection_refusal(settings, timeout=5)) is None
    assert access.DIAGNOSE_SECONDS > 0
