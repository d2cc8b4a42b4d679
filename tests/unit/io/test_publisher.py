"""What the publisher does with a record its Kafka client refuses: a smaller dead letter that
can be published, never the same record again (which would stop the worker at that offset on
every restart); the client's own failures (timeouts) still propagate as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from worker.core.errors import EmptyMessageError
from worker.core.output import KEY_NULL_HEADER, dead_letter, without_value
from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.io import publisher as publisher_module
from worker.io.publisher import Publisher
from worker.settings import load_settings

from support.traces import trace_bytes


class RecordingProducer:
    """Accepts what aiokafka's producer accepts, recording it; ``refuse`` may raise instead."""

    def __init__(self, refuse: Any = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.refuse = refuse or (lambda **record: None)

    async def send(self, topic: str, value: Any = None, key: Any = None, headers: Any = None):  # type: ignore[no-untyped-def]
        if value is None and key is None:
            raise AssertionError("Need at least one: key or value")  # aiokafka 0.14's check
        self.refuse(topic=topic, value=value, key=key, headers=headers)
        self.sent.append({"topic": topic, "value": value, "key": key, "headers": dict(headers)})
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def publish(routed: list[RoutedRecord], producer: RecordingProducer) -> list[dict[str, Any]]:
    """What reaches the Kafka client when a publisher whose client is ``producer`` publishes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(publisher_module, "AIOKafkaProducer", lambda **config: producer)
        asyncio.run(Publisher(load_settings()).publish(routed))
    return producer.sent


def record(key: bytes | None, value: bytes | None, offset: int = 5) -> SourceRecord:
    return SourceRecord("raw", 0, offset, 1, key, value, (("x-producer", b"p"),))


def scored_output(key: bytes | None = None) -> RoutedRecord:
    source = record(key, trace_bytes())
    return RoutedRecord(source, Decision.ACCEPTED, b'{"trace":{}}', source.headers, "other")


def test_aiokafka_refuses_a_record_with_neither_key_nor_value() -> None:
    """The premise: what librdkafka and Java producers send, aiokafka cannot publish."""

    async def send() -> None:
        await AIOKafkaProducer(bootstrap_servers="127.0.0.1:9").send("t", value=None, key=None)

    with pytest.raises(AssertionError):
        asyncio.run(send())


def test_a_null_key_tombstone_is_dead_lettered_with_an_empty_key() -> None:
    routed = dead_letter(record(None, None), EmptyMessageError("message has no value"))
    (sent,) = publish([routed], RecordingProducer())
    assert (sent["key"], sent["value"]) == (b"", None)
    assert sent["headers"]["kp-key-null"] == b"true" and sent["headers"]["x-producer"] == b"p"
    assert sent["headers"]["kp-error-kind"] == b"empty"


def test_a_dead_letter_with_a_key_or_a_value_is_published_as_it_came() -> None:
    error = EmptyMessageError("message has no value")
    keyed, empty = dead_letter(record(b"k", None), error), dead_letter(record(None, b""), error)
    sent = publish([keyed, empty], RecordingProducer())
    assert [(s["key"], s["value"]) for s in sent] == [(b"k", None), (None, b"")]
    assert not any(KEY_NULL_HEADER[0] in s["headers"] for s in sent)


def test_a_null_key_record_too_large_to_publish_loses_its_value_not_its_key_being_null() -> None:
    routed = without_value(scored_output(key=None), 100)
    assert routed.value is None and routed.key == b"" and KEY_NULL_HEADER in routed.headers

    def too_large(value: Any, **_: Any) -> None:
        if value is not None:
            raise MessageSizeTooLargeError("too large for the producer")

    (sent,) = publish([scored_output(key=None)], RecordingProducer(too_large))
    assert (sent["key"], sent["value"]) == (b"", None)
    assert sent["headers"]["kp-error-kind"] == b"output_too_large"
    assert sent["topic"] == load_settings().dead_letter_topic


def test_any_other_refusal_gives_the_least_dead_letter_once_and_the_rest_go_on() -> None:
    """A refusal that is not a KafkaError (a TypeError here) concerns the record: it is not
    sent again as it is, and the records around it are published."""

    def refuse_producer_headers(headers: Any, **_: Any) -> None:
        if any(name == "x-producer" for name, _ in headers):
            calls.append(1)
            raise TypeError("header refused")

    calls: list[int] = []
    first, refused_one, last = scored_output(b"a"), scored_output(b"b"), scored_output(b"c")
    sent = publish([first, refused_one, last], RecordingProducer(refuse_producer_headers))
    assert len(calls) == 3, "each record tried once as it was"
    assert len(sent) == 3
    for out, key in zip(sent, (b"a", b"b", b"c"), strict=True):
        assert out["key"] == key and out["value"] is None
        assert out["topic"] == load_settings().dead_letter_topic
        assert out["headers"]["kp-error-kind"] == b"internal"
        assert b"TypeError: header refused" in out["headers"]["kp-value-omitted"]
        assert "x-producer" not in out["headers"], "nothing of the input but its key"


def test_a_refusal_of_the_least_dead_letter_raises_instead_of_looping() -> None:
    def refuse_all(**_: Any) -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        publish([scored_output(b"a")], RecordingProducer(refuse_all))


def test_the_clients_own_failures_propagate_as_before() -> None:
    def time_out(**_: Any) -> None:
        raise KafkaTimeoutError("buffer full")

    with pytest.raises(KafkaTimeoutError):
        publish([scored_output(b"a")], RecordingProducer(time_out))


def test_a_key_too_large_to_publish_is_left_out_of_the_least_dead_letter() -> None:
    """The input's key alone can be over the publish limit (a topic that takes larger records
    than the outputs'): the dead letter then goes with an empty key, never stopping the worker
    at that offset."""

    def too_large(key: Any, value: Any, **_: Any) -> None:
        if len(key or b"") + len(value or b"") > 1_000:
            raise MessageSizeTooLargeError("too large for the producer")

    first, huge_key, last = scored_output(b"a"), scored_output(b"k" * 5_000), scored_output(b"c")
    sent = publish([first, huge_key, last], RecordingProducer(too_large))
    assert [s["key"] for s in sent] == [b"a", b"", b"c"]
    dead = sent[1]
    assert dead["value"] is None and dead["topic"] == load_settings().dead_letter_topic
    assert dead["headers"]["kp-error-kind"] == b"output_too_large"
    reason = dead["headers"]["kp-error-reason"]
    assert reason.startswith(b"accepted output: the key made it too large to publish (value 12 ")
    assert b"key 5000 bytes" in reason, "the key is blamed, with its size, not the value"
    assert b"key" in dead["headers"]["kp-value-omitted"]
    assert dead["headers"]["kp-source-offset"] == b"5", "it points at the original"
    assert "kp-key-null" not in dead["headers"], "the original's key was not null"


def test_headers_too_large_to_publish_are_named_as_what_made_the_output_too_large() -> None:
    """A producer's headers can make a small output too large: the dead letter says so, with
    the sizes, where it blamed the value's 12 bytes ('output of 12 bytes is over the ...')."""

    def too_large(headers: Any, **_: Any) -> None:
        if sum(len(name) + len(value or b"") for name, value in headers) > 1_000:
            raise MessageSizeTooLargeError("too large for the producer")

    source = SourceRecord("raw", 0, 5, 1, b"k", trace_bytes(), (("x-big", b"h" * 5_000),))
    output = RoutedRecord(source, Decision.REJECTED, b'{"trace":{}}', source.headers, "other")
    (dead,) = publish([output], RecordingProducer(too_large))
    assert dead["value"] is None and dead["key"] == b"k" and "x-big" not in dead["headers"]
    assert dead["headers"]["kp-error-kind"] == b"output_too_large"
    reason = dead["headers"]["kp-error-reason"].decode()
    assert reason.startswith("rejected output: the headers made it too large to publish (")
    assert "value 12 bytes, key 1 bytes, headers 5005 bytes" in reason


def test_a_dead_letter_too_large_to_publish_names_its_value_and_keeps_its_kind() -> None:
    routed = without_value(dead_letter(record(b"k", b"v" * 3_000), EmptyMessageError("x")), 900)
    headers = dict(routed.headers)
    assert headers["kp-error-kind"] == b"empty" and headers["kp-error-reason"] == b"x"
    assert headers["kp-value-omitted"].startswith(b"the value made it too large to publish")
    assert b"value 3000 bytes, key 1 bytes" in headers["kp-value-omitted"]
