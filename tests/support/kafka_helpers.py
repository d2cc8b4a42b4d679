"""Small Kafka client helpers for tests: create topics, produce records, read a topic back.

They work against any Kafka broker. Reading counts records instead of trusting end offsets,
because some Kafka-compatible test brokers report wrong end offsets for multi-record batches.
Each helper has an async form (``*_async``) and a sync wrapper that runs it with
``asyncio.run`` (so the sync form cannot be called from inside a running event loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

Key = bytes | str | None
Value = bytes | str | None
Headers = Sequence[tuple[str, bytes | str]]
# (key, value, partition, headers) or, to set the record timestamp (ms since the epoch),
# (key, value, partition, headers, timestamp_ms). None lets the producer choose.
ProduceRecord = (
    tuple[Key, Value, int | None, Headers | None]
    | tuple[Key, Value, int | None, Headers | None, int | None]
)

# Producers batch: one record per request is slow on some test brokers and unrealistic.
MAX_BATCH_BYTES = 512 * 1024
LINGER_MS = 5
_TOPIC_ALREADY_EXISTS = 36


@dataclass(frozen=True)
class ConsumedRecord:
    """One record as read back from a topic."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partition: int
    offset: int
    timestamp: int

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


@dataclass(frozen=True)
class ProducedRecord:
    """Where a produced record landed.

    No timestamp: aiokafka 0.14 reports the first record's timestamp for every record of a
    batch, so read timestamps back with ``consume_all`` instead.
    """

    partition: int
    offset: int


async def create_topics_async(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    replication_factor: int = 1,
    exist_ok: bool = False,
    configs: dict[str, str] | None = None,
) -> None:
    """Create ``names`` with ``partitions`` each (and topic ``configs``); raise if the broker
    reports an error."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [
                NewTopic(name, partitions, replication_factor, topic_configs=configs or {})
                for name in names
            ]
        )
    finally:
        await admin.close()
    # The admin client returns per-topic error codes instead of raising.
    failures = [
        f"{error[0]}: error {error[1]}" + (f" ({error[2]})" if len(error) > 2 and error[2] else "")
        for error in response.topic_errors
        if error[1] != 0 and not (exist_ok and error[1] == _TOPIC_ALREADY_EXISTS)
    ]
    if failures:
        raise RuntimeError(f"create_topics failed: {'; '.join(failures)}")


async def wait_for_partitions(
    bootstrap: str, topics: Iterable[str], timeout: float = 60.0
) -> list[TopicPartition]:
    """Every partition of ``topics``, waiting (up to ``timeout``) until each topic exists: a
    worker creates its output topics at start-up."""
    names = sorted(set(topics))
    deadline = time.monotonic() + timeout
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        while True:
            described = await admin.describe_topics(names)
            if all(not d.get("error_code") and d.get("partitions") for d in described):
                return [
                    TopicPartition(d["topic"], p["partition"])
                    for d in described
                    for p in sorted(d["partitions"], key=lambda p: p["partition"])
                ]
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {names} were never created")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    replication_factor: int = 1,
    exist_ok: bool = False,
    configs: dict[str, str] | None = None,
) -> None:
    asyncio.run(
        create_topics_async(bootstrap, names, partitions, replication_factor, exist_ok, configs)
    )


async def produce_async(
    bootstrap: str, topic: str, records: Sequence[ProduceRecord]
) -> list[ProducedRecord]:
    """Send ``records`` in order (batched) and wait until all are acknowledged."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        max_batch_size=MAX_BATCH_BYTES,
        max_request_size=max(MAX_BATCH_BYTES * 2, 1_048_576),
        linger_ms=LINGER_MS,
        acks="all",
    )
    await producer.start()
    try:
        futures = []
        for record in records:
            key, value, partition, headers = record[:4]
            timestamp_ms = record[4] if len(record) > 4 else None
            futures.append(
                await producer.send(
                    topic,
                    value=_as_bytes(value),
                    key=_as_bytes(key),
                    partition=partition,
                    headers=[(name, _as_bytes(v) or b"") for name, v in headers or ()],
                    timestamp_ms=timestamp_ms,
                )
            )
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return [ProducedRecord(m.partition, m.offset) for m in metadata]


def produce(bootstrap: str, topic: str, records: Sequence[ProduceRecord]) -> list[ProducedRecord]:
    return asyncio.run(produce_async(bootstrap, topic, records))


async def consume_all_async(
    bootstrap: str,
    topic: str,
    expected_count: int,
    timeout: float = 10.0,
    extra_wait: float = 0.0,
) -> list[ConsumedRecord]:
    """Read ``topic`` from the beginning (no consumer group) until ``expected_count`` records.

    Then keep reading for ``extra_wait`` seconds to catch records beyond the expected ones
    (for "nothing more was written" checks). Returns records sorted by (partition, offset);
    raises TimeoutError if fewer than ``expected_count`` arrive within ``timeout``.
    """
    # Subscribing without a group assigns every partition of the topic, and with no
    # committed offsets "earliest" means the start of each partition.
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        received: list[ConsumedRecord] = []
        settle_until: float | None = None
        while True:
            now = time.monotonic()
            if len(received) >= expected_count and settle_until is None:
                settle_until = now + extra_wait
            stop_at = settle_until if settle_until is not None else deadline
            if now >= stop_at:
                break
            batches = await consumer.getmany(timeout_ms=max(1, int(min(0.2, stop_at - now) * 1000)))
            for messages in batches.values():
                received.extend(
                    ConsumedRecord(
                        key=m.key,
                        value=m.value,
                        headers=tuple((k, bytes(v)) for k, v in m.headers),
                        partition=m.partition,
                        offset=m.offset,
                        timestamp=m.timestamp,
                    )
                    for m in messages
                )
    finally:
        await consumer.stop()
    if len(received) < expected_count:
        raise TimeoutError(
            f"read {len(received)} of {expected_count} expected records from {topic!r} "
            f"within {timeout:g} s"
        )
    return sorted(received, key=lambda r: (r.partition, r.offset))


def consume_all(
    bootstrap: str,
    topic: str,
    expected_count: int,
    timeout: float = 10.0,
    extra_wait: float = 0.0,
) -> list[ConsumedRecord]:
    return asyncio.run(consume_all_async(bootstrap, topic, expected_count, timeout, extra_wait))


def _as_bytes(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data
