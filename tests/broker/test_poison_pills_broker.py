"""Records any producer can send that the worker's own Kafka client refuses to publish as they
are, through a real worker: each ends in exactly one output and none stops the worker.

aiokafka (like the Java producer) refuses a record with neither key nor value, which librdkafka
sends: a null-key tombstone's dead letter, or that of a null-key record too large to publish
with its value, would crash the worker at the same offset on every restart, publishing the
outputs of the records after it again each time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Callable

import orjson
import pytest
from confluent_kafka import KafkaException, Producer
from jsonschema import Draft202012Validator

from worker.core.records import SourceRecord
from worker.dev.process import WorkerProcess
from worker.io.kafka import PartitionLogReader
from worker.settings import load_settings

from support.kafka_helpers import create_topics
from support.outputs import Output, collect_outputs
from support.paths import EXAMPLES, REPO
from support.workers import worker_topics

MAX_MESSAGE_BYTES = 20_000
MAX_OUTPUT_BYTES = 30_000  # a record is refused once its value and headers pass ~95 KB
OVERSIZED = 200_000


def _produce_any(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]
) -> list[int]:
    """(key, value) pairs to partition 0 with librdkafka, which sends a null key with a null
    value; returns their offsets."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 4 * OVERSIZED, "linger.ms": 5}
    )
    offsets: dict[int, int] = {}

    def delivered(index: int):  # type: ignore[no-untyped-def]
        def report(error: object, message: object) -> None:
            if error is not None:
                raise KafkaException(error)
            offsets[index] = message.offset()  # type: ignore[attr-defined]

        return report

    for index, (key, value) in enumerate(records):
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=0,
            headers=[("x-producer", b"poison"), ("x-null", None)],
            on_delivery=delivered(index),
        )
        producer.poll(0)
    assert producer.flush(30) == 0, "records left unsent"
    return [offsets[index] for index in range(len(records))]


def _outputs_of(
    worker: WorkerProcess, bootstrap: str, topics: dict[str, str], offsets: list[int]
) -> tuple[list[Output], bool, list[str]]:
    """The outputs of ``offsets`` (partition 0), whether the worker is still up, its events."""
    try:
        outputs = collect_outputs(bootstrap, topics, {(0, offset) for offset in offsets}, 60)
    except TimeoutError as exc:
        pytest.fail(f"{exc}; worker alive: {worker.alive()}; log tail:\n{worker.tail(15)}")
    return outputs, worker.alive(), [str(e.get("event")) for e in worker.events()]


def _headers_schema() -> Draft202012Validator:
    return Draft202012Validator(
        orjson.loads((REPO / "schemas" / "dead-letter-headers.schema.json").read_bytes())
    )


def one_partition_topics(bootstrap: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """A worker's settings over new one-partition topics, its input topic made, with the
    message limits of these tests."""
    env, topics = worker_topics(
        f"{name}-{uuid.uuid4().hex[:8]}",
        partitions=1,
        KP_MAX_MESSAGE_BYTES=str(MAX_MESSAGE_BYTES),
        KP_MAX_OUTPUT_BYTES=str(MAX_OUTPUT_BYTES),
    )
    create_topics(bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    return env, topics


@pytest.mark.broker
def test_records_without_key_or_value_are_dead_lettered_and_the_worker_goes_on(
    kafka_bootstrap: str,
) -> None:
    env, topics = one_partition_topics(kafka_bootstrap, "poison")
    valid = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()][:6]
    planned: list[tuple[str, bytes | None, bytes | None]] = [
        ("valid first", b"v0", valid[0]),
        ("null key, null value", None, None),
        ("keyed tombstone", b"k-tomb", None),
        ("null key, empty value", None, b""),
        ("null key, too large to publish", None, b"x" * OVERSIZED),
        ("null key, not JSON", None, b"not json"),
        ("null key, valid trace", None, valid[1]),
        *((f"valid after {i}", f"v{i}".encode(), valid[i]) for i in range(2, 6)),
    ]

    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_for_event("scorer ready", timeout=90)
        offsets = _produce_any(
            kafka_bootstrap, env["KP_INPUT_TOPIC"], [(k, v) for _, k, v in planned]
        )
        outputs, alive, events = _outputs_of(worker, kafka_bootstrap, topics, offsets)

    assert alive, "no record may stop the worker"
    assert events.count("scorer ready") == 1, "the worker must never restart"
    assert not [e for e in events if "failed; stopping" in e or "Crashed" in e], events
    by_offset: dict[int, list[Output]] = {}
    for output in outputs:
        by_offset.setdefault(output.source_offset, []).append(output)
    assert sorted(by_offset) == sorted(offsets), "no output of anything else"
    found = {}
    for (name, _, _), offset in zip(planned, offsets, strict=True):
        assert len(by_offset[offset]) == 1, f"{name}: {len(by_offset[offset])} outputs"
        found[name] = by_offset[offset][0]
        assert found[name].headers.get("x-producer") == b"poison", f"{name}: input header lost"
        kept = found[name].headers
        assert "x-null" in kept and kept["x-null"] is None, f"{name}: x-null {kept.get('x-null')!r}"

    def dead(name: str, kind: str) -> Output:
        output = found[name]
        assert output.decision == "dead_letter", name
        assert output.headers["kp-error-kind"] == kind.encode(), name
        errors = list(
            _headers_schema().iter_errors(
                {k: v.decode() for k, v in output.headers.items() if k.startswith("kp-")}
            )
        )
        assert not errors, f"{name}: {errors[0].message}"
        return output

    # Neither key nor value: a null value still (a tombstone stays one), an empty key, and a
    # header saying the key was null.
    nothing = dead("null key, null value", "empty")
    assert (nothing.key, nothing.value, nothing.headers.get("kp-key-null")) == (b"", None, b"true")
    too_large = dead("null key, too large to publish", "too_large")
    assert (too_large.key, too_large.value) == (b"", None)
    assert too_large.headers["kp-key-null"] == b"true"
    assert b"publish limit" in too_large.headers["kp-value-omitted"]
    # A key or a value of their own: kept exactly as they came, no kp-key-null.
    tombstone = dead("keyed tombstone", "empty")
    assert (tombstone.key, tombstone.value) == (b"k-tomb", None)
    empty = dead("null key, empty value", "empty")
    not_json = dead("null key, not JSON", "invalid_json")
    assert (empty.key, empty.value, not_json.key, not_json.value) == (None, b"", None, b"not json")
    assert not any("kp-key-null" in o.headers for o in (tombstone, empty, not_json))
    scored = [o for name, o in found.items() if "valid" in name]
    assert all(o.decision in ("accepted", "rejected") for o in scored)
    assert found["null key, valid trace"].key is None


@pytest.mark.broker
def test_a_key_too_large_to_publish_is_dead_lettered_without_it_and_the_worker_goes_on(
    kafka_bootstrap: str,
) -> None:
    """An input topic may take records larger than the outputs may be: a key over the publish
    limit would be refused in every form that keeps it, at every restart."""
    env, topics = one_partition_topics(kafka_bootstrap, "hugekey")
    valid = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()][:2]
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_for_event("scorer ready", timeout=90)
        offsets = _produce_any(
            kafka_bootstrap, env["KP_INPUT_TOPIC"], [(b"K" * OVERSIZED, valid[0]), (b"k", valid[1])]
        )
        outputs, alive, events = _outputs_of(worker, kafka_bootstrap, topics, offsets)

    assert alive, "no record may stop the worker"
    assert events.count("scorer ready") == 1, "the worker must never restart"
    assert sorted(o.source_offset for o in outputs) == offsets, "each exactly once"
    dead, after = sorted(outputs, key=lambda o: o.source_offset)
    assert dead.decision == "dead_letter" and (dead.key, dead.value) == (b"", None)
    assert dead.headers["kp-error-kind"] == b"output_too_large"
    assert b"key" in dead.headers["kp-value-omitted"] and "kp-key-null" not in dead.headers
    errors = list(_headers_schema().iter_errors({k: v.decode() for k, v in dead.headers.items()}))
    assert not errors, errors[0].message
    assert after.decision in ("accepted", "rejected") and after.key == b"k"


# A producer whose header names reach the wire as bytes that are not UTF-8 (Go and C clients
# can send them): aiokafka's pure-Python record builder, given a name that encodes to such
# bytes. Run in its own process: that builder is chosen when aiokafka is first imported.
_NOT_UTF8_PRODUCER = """
import asyncio, json, sys
from aiokafka import AIOKafkaProducer

class NotUtf8Name(str):
    def encode(self, *args, **kwargs):
        return b"\\xff\\xfe-name"

async def main(bootstrap, topic, values):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    offsets = []
    try:
        for index, value in enumerate(values):
            headers = [("x-producer", b"poison")]
            if index == 1:
                headers.append((NotUtf8Name("h"), b"v"))
            sent = await producer.send_and_wait(
                topic, value.encode(), key=f"k{index}".encode(), partition=0, headers=headers
            )
            offsets.append(sent.offset)
    finally:
        await producer.stop()
    print(json.dumps(offsets))

asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())))
"""


@pytest.mark.broker
def test_a_batch_the_kafka_client_cannot_read_is_dead_lettered_and_the_worker_goes_on(
    kafka_bootstrap: str,
) -> None:
    env, topics = worker_topics(f"unreadable-{uuid.uuid4().hex[:8]}", partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    valid = [line.decode() for line in EXAMPLES.read_bytes().splitlines() if line.strip()][:4]

    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_for_event("scorer ready", timeout=90)
        produced = subprocess.run(
            [sys.executable, "-c", _NOT_UTF8_PRODUCER, kafka_bootstrap, env["KP_INPUT_TOPIC"]],
            input=orjson.dumps(valid),
            capture_output=True,
            env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"},
            timeout=60,
            check=True,
        )
        offsets = orjson.loads(produced.stdout)
        outputs, alive, events = _outputs_of(worker, kafka_bootstrap, topics, offsets)

    assert alive, "no record may stop the worker"
    assert events.count("scorer ready") == 1, "the worker must never restart"
    assert sorted(o.source_offset for o in outputs) == sorted(offsets), "each exactly once"
    by_offset = {o.source_offset: o for o in outputs}
    unreadable = by_offset[offsets[1]]
    assert unreadable.decision == "dead_letter"
    assert unreadable.headers["kp-error-kind"] == b"unreadable"
    assert b"cannot read" in unreadable.headers["kp-error-reason"]
    assert (
        unreadable.value is None and b"read the original" in unreadable.headers["kp-value-omitted"]
    )
    errors = list(
        _headers_schema().iter_errors({k: v.decode() for k, v in unreadable.headers.items()})
    )
    assert not errors, errors[0].message
    others = [by_offset[offset] for offset in offsets if offset != offsets[1]]
    assert all(o.decision in ("accepted", "rejected") for o in others)


def test_a_null_header_value_is_read_by_the_log_reader(
    kafka_bootstrap: str, new_topic_name: Callable[[str], str]
) -> None:
    """A header value may be null on the wire (librdkafka sends one). The log reader behind
    replay, rescore and the rebuild of a partition's cache reads it as null, as the worker's
    consumer does, instead of failing on the record."""
    topic = new_topic_name("null-header")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, value=b"{}", partition=0, headers=[("x-null", None)])
    assert producer.flush(30) == 0, "record left unsent"
    settings = load_settings(kafka_bootstrap_servers=kafka_bootstrap)

    async def read() -> list[SourceRecord]:
        reader = PartitionLogReader(settings)
        await reader.start()
        try:
            return await reader.read(topic, 0, 0, 1)
        finally:
            await reader.stop()

    (record,) = asyncio.run(read())
    assert record.headers == (("x-null", None),)
