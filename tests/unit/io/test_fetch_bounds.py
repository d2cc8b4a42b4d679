"""What one fetch may bring is bounded, for every consumer the worker opens: the group
consumer (whose whole fetch aiokafka leaves at 50 MiB by default) and the log reader. Above
it, only a single batch larger than the bound comes whole (Kafka's rule, so a consumer always
progresses); bench/compression_bomb.py measures what such a batch costs decompressed."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from worker.io import kafka
from worker.io.group_consumer import group_consumer_config
from worker.io.kafka import PartitionLogReader
from worker.settings import load_settings

from support.clients import built_clients


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


@pytest.mark.parametrize("max_message_bytes", [None, "4194304"])
def test_every_consumer_bounds_a_whole_fetch(
    monkeypatch: pytest.MonkeyPatch, max_message_bytes: str | None
) -> None:
    if max_message_bytes:
        monkeypatch.setenv("KP_MAX_MESSAGE_BYTES", max_message_bytes)
        monkeypatch.setenv("KP_MAX_OUTPUT_BYTES", str(2 * int(max_message_bytes)))
    settings = load_settings()
    bound = settings.fetch_max_bytes
    assert bound == max(1 << 20, 2 * settings.max_message_bytes)

    readers = built_clients(monkeypatch, kafka, "AIOKafkaConsumer")

    async def fetch_limits() -> list[tuple[int, int]]:
        group = AIOKafkaConsumer(**group_consumer_config(settings))
        reader = PartitionLogReader(settings)
        (built,) = readers
        consumers = (group, built.client)
        limits = [(c._fetch_max_bytes, c._max_partition_fetch_bytes) for c in consumers]
        isolation.extend(c._isolation_level for c in consumers)
        await group.stop()
        await reader.stop()
        return limits

    isolation: list[str] = []
    assert asyncio.run(fetch_limits()) == [(bound, bound), (bound, bound)]
    # A transactional producer's aborted records reach neither the scorer nor the log reader.
    assert isolation == ["read_committed", "read_committed"]


class _ResettingConsumer:
    """What aiokafka does on Apache Kafka when a read starts past the log's end: the broker
    answers OFFSET_OUT_OF_RANGE and, with auto_offset_reset="earliest", the client goes back
    to the first offset and fetches from there. (The test broker answers with no records.)"""

    def __init__(self, topic: str, records: int) -> None:
        self.topic, self.records, self.at, self.fetched = topic, records, 0, 0

    def assign(self, partitions: object) -> None:
        pass

    def seek(self, tp: object, offset: int) -> None:
        self.at = offset

    async def position(self, tp: object) -> int:
        return self.at

    def highwater(self, tp: object) -> int | None:
        return self.records if self.fetched else None

    async def getmany(self, tp: object, timeout_ms: int) -> dict[object, list[object]]:
        self.fetched += 1
        if self.at > self.records:
            self.at = 0  # the reset
        messages = [
            ConsumerRecord(self.topic, 0, offset, 0, 0, None, b"{}", None, 2, 0, ())
            for offset in range(self.at, self.records)
        ]
        self.at = self.records
        return {tp: messages}


@pytest.mark.parametrize("end", [None, 100])
def test_a_range_starting_past_the_log_reads_nothing(
    end: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replay --from-offset 50` on a partition of 5 records replays none of them (on Kafka,
    the client's reset to the first offset made it replay all 5)."""
    consumer = _ResettingConsumer("t", records=5)
    monkeypatch.setattr(kafka, "AIOKafkaConsumer", lambda *args, **kwargs: consumer)

    async def read() -> list[int]:
        reader = PartitionLogReader(load_settings())
        chunks = reader.iter_range("t", 0, 50, end, end_may_pass_the_log=True)
        return [record.offset async for chunk in chunks for record in chunk]

    assert asyncio.run(read()) == []
    assert consumer.fetched == 1
