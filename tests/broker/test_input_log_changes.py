"""The input topic's log changing under a worker, on Apache Kafka (the embedded broker can do
none of it): the topic deleted and recreated, records deleted before they were scored, and
partitions added. Nothing is lost without a word, and what can be scored is scored."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, RecordsToDelete

from worker.dev.process import WorkerProcess

from support.fixtures import chosen_broker
from support.kafka_helpers import ProduceRecord, create_topics, produce, wait_for_partitions
from support.outputs import outputs_by_trace_id
from support.traces import make_trace
from support.workers import metric_total, worker_topics

pytestmark = [
    pytest.mark.broker,
    pytest.mark.skipif(
        chosen_broker() == "embedded",
        reason="the embedded broker cannot delete records or add partitions, and does not "
        "notice a recreated topic",
    ),
]

WENT_BACK = (
    "input partition's log went back (topic recreated or log truncated); "
    "scoring it again from the new log"
)
LOST = "records deleted from the input log before they were scored"
# docs/operations.md: an added partition is scored within this long.
ADDED_PARTITION_SECONDS = 30.0


def traces(name: str, count: int, first: int = 0, partition: int = 0) -> list[ProduceRecord]:
    return [
        (None, orjson.dumps(make_trace(id=f"kp:trace:{name}-{i}")), partition, None)
        for i in range(first, first + count)
    ]


def ids(name: str, count: int, first: int = 0) -> set[str]:
    return {f"kp:trace:{name}-{i}" for i in range(first, first + count)}


def wait_scored(bootstrap: str, outputs: dict[str, str], wanted: set[str]) -> None:
    found = asyncio.run(outputs_by_trace_id(bootstrap, list(outputs), wanted, timeout=90))
    assert wanted <= set(found), f"never scored: {sorted(wanted - set(found))}"


async def _admin(bootstrap: str) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    return admin


async def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = await _admin(bootstrap)
    try:
        await admin.delete_topics([topic])
        while topic in await admin.list_topics():
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def outputs_per_trace(bootstrap: str, topics: dict[str, str]) -> Counter[str]:
    """How many outputs each trace id has, reading every output topic to its end."""

    async def read() -> Counter[str]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            partitions = await wait_for_partitions(bootstrap, topics)
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = await consumer.end_offsets(partitions)
            found: Counter[str] = Counter()
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    found.update(orjson.loads(m.value)["trace"]["id"] for m in messages)
            return found
        finally:
            await consumer.stop()

    return asyncio.run(read())


def test_a_recreated_input_topic_is_scored_from_its_new_start(kafka_bootstrap: str) -> None:
    """Deleted and created again while the worker runs: each trace of the new topic gets one
    output, a warning line names the partition and the offsets, the stop commits the new
    log's offsets (exit 0), and a worker started afterwards scores only what came since."""
    env, outputs = worker_topics(f"recreate-{uuid.uuid4().hex[:8]}", partitions=1)
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic, *outputs], 1)
    produce(kafka_bootstrap, topic, traces("old", 8))
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        wait_scored(kafka_bootstrap, outputs, ids("old", 8))
        asyncio.run(_delete_topic(kafka_bootstrap, topic))
        # A worker's metadata request may have created it again already (Kafka's default
        # auto.create.topics.enable): partition 0 is there either way.
        create_topics(kafka_bootstrap, [topic], 1, exist_ok=True)
        produce(kafka_bootstrap, topic, traces("new", 3))
        wait_scored(kafka_bootstrap, outputs, ids("new", 3))
        exit_code = worker.stop()
        log = worker.events()
    assert exit_code == 0, "every published record of the new log is committed"
    (line,) = [e for e in log if e.get("event") == WENT_BACK]
    assert (line["level"], line["topic"], line["partition"]) == ("warning", topic, 0)
    assert line["expected"] == 8 and line["log_end"] <= 3, line

    produce(kafka_bootstrap, topic, traces("new", 2, first=3))
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        wait_scored(kafka_bootstrap, outputs, ids("new", 2, first=3))
        worker.stop()
        restarted_log = worker.events()
    assert outputs_per_trace(kafka_bootstrap, outputs) == Counter(ids("old", 8) | ids("new", 5))
    assert not [e for e in restarted_log if e.get("event") in (WENT_BACK, LOST)]


def test_records_deleted_before_they_were_scored_are_counted_lost(kafka_bootstrap: str) -> None:
    """Offsets 5..7 are deleted (delete-records) while the worker is stopped at offset 5: its
    successor says so in a warning line and counts exactly 3 lost, and scores the rest."""
    env, outputs = worker_topics(f"deleted-{uuid.uuid4().hex[:8]}", partitions=1)
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic, *outputs], 1)
    produce(kafka_bootstrap, topic, traces("scored", 5))
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        wait_scored(kafka_bootstrap, outputs, ids("scored", 5))
        assert worker.stop() == 0
    produce(kafka_bootstrap, topic, traces("later", 6))  # offsets 5..10

    async def delete_records() -> None:
        admin = await _admin(kafka_bootstrap)
        try:
            await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(8)})
        finally:
            await admin.close()

    asyncio.run(delete_records())
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        wait_scored(kafka_bootstrap, outputs, ids("later", 3, first=3))
        lost = metric_total(worker.metrics_port, "kp_records_lost_total")
        worker.stop()
        log = worker.events()
    assert lost == 3
    (line,) = [e for e in log if e.get("event") == LOST]
    assert (line["level"], line["topic"], line["partition"]) == ("warning", topic, 0)
    assert (line["start"], line["end"], line["records"]) == (5, 8, 3)
    scored = ids("scored", 5) | ids("later", 3, first=3)
    assert outputs_per_trace(kafka_bootstrap, outputs) == Counter(scored)


def test_a_partition_added_while_the_worker_runs_is_scored_in_time(kafka_bootstrap: str) -> None:
    env, outputs = worker_topics(f"grown-{uuid.uuid4().hex[:8]}", partitions=1)
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic, *outputs], 1)
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        produce(kafka_bootstrap, topic, traces("first", 1))
        wait_scored(kafka_bootstrap, outputs, ids("first", 1))

        async def add_partition() -> None:
            admin = await _admin(kafka_bootstrap)
            try:
                await admin.create_partitions({topic: NewPartitions(total_count=2)})
            finally:
                await admin.close()

        asyncio.run(add_partition())
        added = time.monotonic()
        produce(kafka_bootstrap, topic, traces("added", 1, partition=1))
        wait_scored(kafka_bootstrap, outputs, ids("added", 1))
        seconds = time.monotonic() - added
        worker.stop()
    print(f"\nan added partition's record scored {seconds:.1f} s after the partition was added")
    assert seconds <= ADDED_PARTITION_SECONDS, seconds
    assert outputs_per_trace(kafka_bootstrap, outputs) == Counter(ids("first", 1) | ids("added", 1))
