"""The worker's 2-second probe asks its partitions' leaders for their end offsets, and the
whole cluster's metadata only when it holds no partition: that answer names every topic of
the cluster, and an idle worker asking it every probe spent 0.0520 core beside 3,000 other
topics, 0.0060 without it (bench/idle_cpu.py --other-topics, bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer

from worker.io.kafka import PartitionLogReader
from worker.settings import load_settings

from support.kafka_helpers import create_topics, produce

pytestmark = pytest.mark.broker


def test_the_probe_of_held_partitions_asks_no_cluster_metadata(
    kafka_bootstrap: str, new_topic_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic_name("probe")
    create_topics(kafka_bootstrap, [topic], partitions=2)
    for _ in range(3):  # a batch each: the embedded broker answers a last batch's start + 1
        produce(kafka_bootstrap, topic, [(b"k", b"{}", 1, None)])
    asked = []
    cluster_metadata = AIOKafkaConsumer.topics

    async def topics(consumer: AIOKafkaConsumer) -> set[str]:
        asked.append("the cluster's metadata")
        return await cluster_metadata(consumer)

    monkeypatch.setattr(AIOKafkaConsumer, "topics", topics)

    async def probes() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        reader = PartitionLogReader(load_settings(kafka_bootstrap_servers=kafka_bootstrap))
        await reader.start()
        try:
            return await reader.probe([(topic, 0), (topic, 1)], 10), await reader.probe([], 10)
        finally:
            await reader.stop()

    held, none = asyncio.run(probes())
    assert held == {(topic, 0): 0, (topic, 1): 3}
    assert none == {}
    assert asked == ["the cluster's metadata"]  # by the probe of no partitions only
