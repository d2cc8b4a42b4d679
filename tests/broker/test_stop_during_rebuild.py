"""A stop while a taken-over partition's novelty cache is being rebuilt: the rebuild is given
up (the partition is being given up too), so the stop does not wait for it, and nothing is
lost: the partition's committed offset stays where its previous owner left it."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.traces import make_trace, trace_bytes
from support.workers import worker_topics

# Enough traces that embedding them on one model thread takes about the stop's deadline here
# (7.3 s from the SIGTERM before rebuilds were given up: the process waited for the thread).
HISTORY = 2000
DEADLINE_SECONDS = 8
# A stop here takes 1-2 s: the model runs already under way, the consumer's last commit and
# the group's leave.
STOP_SECONDS = 4


async def _commit(bootstrap: str, group: str, topic: str, offset: int) -> int | None:
    """Commit ``offset`` for ``group`` as a previous owner of the partition would have."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: offset})
        return await consumer.committed(tp)
    finally:
        await consumer.stop()


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    async def read() -> int | None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
        await consumer.start()
        try:
            return await consumer.committed(TopicPartition(topic, 0))
        finally:
            await consumer.stop()

    return asyncio.run(read())


def test_a_stop_during_a_cache_rebuild_does_not_wait_for_it(kafka_bootstrap: str) -> None:
    env, _ = worker_topics(
        f"rebuild-stop-{uuid.uuid4().hex[:8]}",
        partitions=1,
        KP_CACHE_CAPACITY=str(HISTORY),
        KP_SHUTDOWN_TIMEOUT_SECONDS=str(DEADLINE_SECONDS),
        # One model thread: the rebuild runs the model on its own thread, which nothing else
        # interrupts (with a pool, its queued runs are cancelled at the stop).
        KP_EMBED_CONCURRENCY="1",
    )
    topic, group = env["KP_INPUT_TOPIC"], env["KP_GROUP_ID"]
    create_topics(kafka_bootstrap, [topic], partitions=1)
    history = [
        (None, trace_bytes(make_trace(objective=f"Trace {i} of the history")), 0, None)
        for i in range(HISTORY)
    ]
    produce(kafka_bootstrap, topic, history)
    assert asyncio.run(_commit(kafka_bootstrap, group, topic, HISTORY)) == HISTORY
    worker = WorkerProcess(kafka_bootstrap, **env).start()
    try:
        worker.wait_ready(timeout=120)  # assigned: the rebuild of its history has begun
        time.sleep(1)
        stopping = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.process is not None
        code = worker.process.wait(60)
        seconds = time.monotonic() - stopping
    finally:
        worker.stop()
    events = [e["event"] for e in worker.events()]
    print(f"\nstopped {seconds:.1f} s after SIGTERM, exit {code}: {events[-4:]}")
    assert "rebuilt novelty cache" not in events, "the rebuild was finished, not given up"
    assert "novelty cache rebuild given up" in events, worker.tail()
    assert code == 0, worker.tail()
    assert seconds < STOP_SECONDS, f"the stop waited {seconds:.1f} s"
    assert _committed(kafka_bootstrap, group, topic) == HISTORY
