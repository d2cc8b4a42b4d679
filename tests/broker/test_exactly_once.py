"""Exactly once (``KP_PROCESSING_GUARANTEE=exactly_once``) on Apache Kafka: a partition's outputs
and its offset commit in one transaction, and a worker whose partition moved (a zombie) commits
nothing more. The embedded broker grants no transactions: there the worker refuses to start.
The chaos test (kills, rebalances, a paused worker, a failover) is
``tests/chaos/test_exactly_once_chaos.py``."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.core.errors import InvalidJsonError
from worker.core.failures import PartitionLost
from worker.core.output import dead_letter
from worker.core.records import SourceRecord
from worker.dev.process import WorkerProcess
from worker.io.transactions import TransactionalPublisher
from worker.settings import load_settings

from support.fixtures import chosen_broker
from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs, collect_outputs_async
from support.traces import make_trace
from support.workers import worker_topics

pytestmark = pytest.mark.broker
kafka_only = pytest.mark.skipif(
    chosen_broker() == "embedded", reason="the embedded broker has no working transactions"
)


async def _committed(bootstrap: str, group: str, tp: tuple[str, int]) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(*tp))
    finally:
        await consumer.stop()


def _routed(topic: str, offset: int, who: str) -> object:
    record = SourceRecord(topic, 0, offset, 0, who.encode(), b"{")
    return dead_letter(record, InvalidJsonError(f"from {who}"))


@kafka_only
def test_a_zombies_transaction_is_aborted_and_its_late_commit_refused(
    kafka_bootstrap: str,
) -> None:
    """The previous owner (the zombie) sent outputs in its open transaction; the new owner
    fences it on taking the partition. Nothing of the zombie's is ever visible, its commit is
    refused, and the new owner's outputs and offset commit together."""
    env, outputs = worker_topics(f"eos-zombie-{uuid.uuid4().hex[:8]}", partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"], *outputs], 1)
    settings = load_settings(
        environ={**env, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    tp = (env["KP_INPUT_TOPIC"], 0)

    async def scenario() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        zombie = TransactionalPublisher(settings)
        owner = TransactionalPublisher(settings)
        try:
            await zombie.fence([tp])
            for offset in range(5):
                await zombie.publish([_routed(tp[0], offset, "zombie")])  # type: ignore[list-item]
            await owner.fence([tp])  # the partition moved while the zombie was paused
            with pytest.raises(PartitionLost):
                await zombie.publish([_routed(tp[0], 5, "zombie")])  # type: ignore[list-item]
            late = await zombie.commit()
            for offset in range(5):
                await owner.publish([_routed(tp[0], offset, "owner")])  # type: ignore[list-item]
            return late, await owner.commit()
        finally:
            await zombie.stop()
            await owner.stop()

    late, committed = asyncio.run(scenario())
    assert late == {}, "the zombie committed after its partition moved"
    assert committed == {tp: 5}
    seen = collect_outputs(
        kafka_bootstrap,
        outputs,
        {(0, offset) for offset in range(5)},
        timeout=30,
        settle=2,
        isolation_level="read_committed",
    )
    assert sorted((o.source_offset, o.key) for o in seen) == [
        (offset, b"owner") for offset in range(5)
    ], "read_committed sees the new owner's outputs, each once, and none of the zombie's"
    assert asyncio.run(_committed(kafka_bootstrap, env["KP_GROUP_ID"], tp)) == 5, (
        "the offset commits in the owner's transaction"
    )


@kafka_only
def test_a_worker_in_exactly_once_mode_scores_each_record_once(kafka_bootstrap: str) -> None:
    env, outputs = worker_topics(
        f"eos-{uuid.uuid4().hex[:8]}", partitions=2, KP_PROCESSING_GUARANTEE="exactly_once"
    )
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"], *outputs], 2)
    records = [
        (f"k{i}".encode(), orjson.dumps(make_trace(id=f"kp:trace:eos-{i}")), None, None)
        for i in range(30)
    ]
    produced = produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], records)
    expected = {(r.partition, r.offset) for r in produced}
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        found = collect_outputs(
            kafka_bootstrap,
            outputs,
            expected,
            timeout=90,
            settle=3,
            isolation_level="read_committed",
        )
        ready = [e for e in worker.events() if e.get("event") == "scorer ready"]
        assert worker.stop() == 0
    assert ready and ready[0].get("processing_guarantee") == "exactly_once"
    assert sorted((o.source_partition, o.source_offset) for o in found) == sorted(expected)
    ends: dict[int, int] = {}
    for r in produced:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    for partition, end in ends.items():
        tp = (env["KP_INPUT_TOPIC"], partition)
        assert asyncio.run(_committed(kafka_bootstrap, env["KP_GROUP_ID"], tp)) == end


def test_exactly_once_is_refused_at_start_on_a_broker_without_transactions(
    embedded_bootstrap: str,
) -> None:
    """The embedded broker grants no transactions: the worker says so in one line and exits,
    rather than scoring without the guarantee it was asked for."""
    env, _ = worker_topics(
        f"eos-refused-{uuid.uuid4().hex[:8]}", partitions=1, KP_PROCESSING_GUARANTEE="exactly_once"
    )
    with WorkerProcess(embedded_bootstrap, KP_FETCH_MAX_WAIT_MS="20", **env) as worker:
        assert worker.process is not None
        code = worker.process.wait(timeout=120)
        lines = [str(e.get("event", "")) + " " + str(e.get("error", "")) for e in worker.events()]
    assert code != 0
    refused = [line for line in lines if "grants no transactions" in line]
    assert refused, "\n".join(lines[-10:])
    assert "use at_least_once with this broker" in refused[0]


def test_uncommitted_outputs_stay_invisible_to_read_committed_consumers(
    kafka_bootstrap: str,
) -> None:
    """What a transaction holds before its commit is there for read_uncommitted consumers only
    (the proof, in the chaos test, that its kills landed inside transactions)."""
    if chosen_broker() == "embedded":
        pytest.skip("the embedded broker has no working transactions")
    env, outputs = worker_topics(f"eos-open-{uuid.uuid4().hex[:8]}", partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"], *outputs], 1)
    settings = load_settings(environ={**env, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    tp = (env["KP_INPUT_TOPIC"], 0)

    async def scenario() -> tuple[int, int]:
        publisher = TransactionalPublisher(settings)
        try:
            await publisher.fence([tp])
            await publisher.publish([_routed(tp[0], 0, "open")])  # type: ignore[list-item]
            seen = {}
            for level in ("read_uncommitted", "read_committed"):
                try:
                    found = await collect_outputs_async(
                        kafka_bootstrap,
                        outputs,
                        {(0, 0)},
                        timeout=3,
                        settle=0,
                        isolation_level=level,
                    )
                    seen[level] = len(found)
                except TimeoutError:
                    seen[level] = 0
            return seen["read_uncommitted"], seen["read_committed"]
        finally:
            await publisher.stop()  # aborts the open transaction

    uncommitted, committed = asyncio.run(scenario())
    assert (uncommitted, committed) == (1, 0)
