"""The worker's 2-second probe asks its partitions' leaders for their end offsets, or, holding
none, its input's first partition's, and never the whole cluster's metadata: that answer names
every topic of the cluster, and an idle worker asking it every probe spent 0.0520 core beside
3,000 other topics, 0.0060 without it (bench/idle_cpu.py --other-topics, bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.io.kafka import PartitionLogReader
from worker.settings import load_settings

from support.kafka_helpers import create_topics, produce

pytestmark = pytest.mark.broker


def test_the_probe_asks_no_cluster_metadata_holding_partitions_or_none(
    kafka_bootstrap: str, new_topic_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic_name("probe")
    create_topics(kafka_bootstrap, [topic], partitions=2)
    for _ in range(3):  # a batch each: the embedded broker answers a last batch's start + 1
        produce(kafka_bootstrap, topic, [(b"k", b"{}", 1, None)])
    asked: list[object] = []
    cluster_metadata, end_offsets = AIOKafkaConsumer.topics, AIOKafkaConsumer.end_offsets

    async def topics(consumer: AIOKafkaConsumer) -> set[str]:
        asked.append("the cluster's metadata")
        return await cluster_metadata(consumer)

    async def ends(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> dict:
        asked.append(sorted(partitions))
        return await end_offsets(consumer, partitions)

    monkeypatch.setattr(AIOKafkaConsumer, "topics", topics)
    monkeypatch.setattr(AIOKafkaConsumer, "end_offsets", ends)
    settings = load_settings(kafka_bootstrap_servers=kafka_bootstrap, input_topic=topic)

    async def probes() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        reader = PartitionLogReader(settings)
        await reader.start()
        try:
            return await reader.probe([(topic, 0), (topic, 1)], 10), await reader.probe([], 10)
        finally:
            await reader.stop()

    held, none = asyncio.run(probes())
    assert held == {(topic, 0): 0, (topic, 1): 3}
    assert none == {}
    # Holding none, the broker is still asked something: the input's first partition.
    first, second = TopicPartition(topic, 0), TopicPartition(topic, 1)
    assert asked == [[first, second], [first]]
