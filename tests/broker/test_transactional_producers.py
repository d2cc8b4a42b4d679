"""Producers that write in transactions (Apache Kafka only: the embedded broker's read_committed
fetch returns aborted records, and it refuses aiokafka's InitProducerId).

A trace a producer took back (an aborted transaction) is never scored; its committed traces
are, each once; the transaction markers between them make no warning line."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from worker.dev.process import WorkerProcess

from support.fixtures import chosen_broker
from support.kafka_helpers import create_topics
from support.outputs import collect_outputs
from support.traces import make_trace
from support.workers import worker_topics

pytestmark = [
    pytest.mark.broker,
    pytest.mark.skipif(
        chosen_broker() == "embedded",
        reason="the embedded broker has no working transactions (shared BROKER.md)",
    ),
]


async def _produce_in_transactions(bootstrap: str, topic: str) -> dict[str, set[int]]:
    """Two transactions of three traces each, the first aborted: offsets by outcome."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"fleet-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    offsets: dict[str, set[int]] = {"aborted": set(), "committed": set()}
    try:
        for outcome in ("aborted", "committed", "aborted", "committed"):
            await producer.begin_transaction()
            sent = [
                await producer.send(
                    topic, orjson.dumps(make_trace(id=f"kp:trace:{outcome}-{i}")), partition=0
                )
                for i in range(3)
            ]
            offsets[outcome] |= {(await future).offset for future in sent}
            if outcome == "aborted":
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
    finally:
        await producer.stop()
    return offsets


def test_aborted_traces_are_never_scored_and_committed_ones_are(kafka_bootstrap: str) -> None:
    env, outputs = worker_topics(f"txn-{uuid.uuid4().hex[:8]}", partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"], *outputs], 1)
    offsets = asyncio.run(_produce_in_transactions(kafka_bootstrap, env["KP_INPUT_TOPIC"]))
    # Whether the worker starts before or after them, a committed trace is read once.
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        expected = {(0, offset) for offset in offsets["committed"]}
        found = collect_outputs(kafka_bootstrap, outputs, expected, timeout=60, settle=3)
        log = worker.events()
    sources = sorted((o.source_partition, o.source_offset) for o in found)
    assert sources == sorted(expected), "each committed trace once, no aborted one"
    ids = {o.document["trace"]["id"] for o in found if o.decision != "dead_letter"}
    assert all("committed" in trace_id for trace_id in ids), ids
    # Of the scorer's own lines (a new broker's first group lookup makes aiokafka log one).
    warnings = [
        e
        for e in log
        if e.get("level") in ("warning", "error", "critical")
        and str(e.get("logger", "")).startswith(("worker.stream", "worker.io"))
    ]
    assert warnings == [], f"transaction markers made log lines: {warnings[:3]}"
