"""What one fetch may bring is bounded, for every consumer the worker opens: faust's group
consumer (whose whole fetch faust leaves at aiokafka's 50 MiB) and the log reader. Above
it, only a single batch larger than the bound comes whole (Kafka's rule, so a consumer always
progresses); bench/compression_bomb.py measures what such a batch costs decompressed."""

from __future__ import annotations

import asyncio

import pytest

from worker.io import kafka
from worker.io.app import ScorerApp
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
        app = ScorerApp(settings)
        group = app.consumer._new_consumer_thread()._create_worker_consumer(app.transport)
        reader = PartitionLogReader(settings)
        (built,) = readers
        consumers = (group, built.client)
        limits = [(c._fetch_max_bytes, c._max_partition_fetch_bytes) for c in consumers]
        await group.stop()
        await reader.stop()
        return limits

    assert asyncio.run(fetch_limits()) == [(bound, bound), (bound, bound)]
