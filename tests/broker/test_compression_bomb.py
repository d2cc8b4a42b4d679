"""Decompression bombs through a real worker: records of 256 MiB of one byte, in gzip and in
zstd batches of a few hundred KiB, decompress no further than ``KP_MAX_BATCH_BYTES`` (64 MiB)
and are dead-lettered as unreadable; a 16 MiB one within that bound is dead-lettered as
too_large, as any record over ``KP_MAX_MESSAGE_BYTES``; the trace after them is scored; the
worker keeps running, and its peak resident memory grows by a bounded multiple of the bound.

The 1 GiB bomb's figure, which the Deployment's memory limit is sized from, is
``bench/compression_bomb.py``'s.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from worker.dev.process import WorkerProcess

from support.outputs import collect_outputs
from support.traces import make_trace
from support.workers import worker_topics

pytestmark = pytest.mark.broker
MIB = 1 << 20
BOMB_MIB = 256
WITHIN_BOUND_MIB = 16
BATCH_BOUND_MIB = 64  # KP_MAX_BATCH_BYTES's default
# What the worker may hold beyond its ready size: a batch decompressed up to the bound, the
# value copied out of the largest one within it, and room for allocator slack.
PEAK_OVER_READY = 3 * BATCH_BOUND_MIB * MIB


def status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


async def produce(bootstrap: str, topic: str, codec: str, value: bytes) -> tuple[int, int]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=codec,
        max_request_size=(BOMB_MIB + 1) * MIB,
        acks="all",
    )
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, value, key=codec.encode(), partition=0)
    finally:
        await producer.stop()
    return (sent.partition, sent.offset)


def test_compression_bombs_are_dead_lettered_in_bounded_memory(kafka_bootstrap: str) -> None:
    env, outputs = worker_topics(f"bomb-{uuid.uuid4().hex[:8]}", partitions=1)
    topic = env["KP_INPUT_TOPIC"]
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        assert worker.pid is not None
        ready = status_bytes(worker.pid, "VmRSS")
        bomb = b"x" * (BOMB_MIB * MIB)
        sources = [
            asyncio.run(produce(kafka_bootstrap, topic, "gzip", bomb)),
            asyncio.run(produce(kafka_bootstrap, topic, "zstd", bomb)),
            asyncio.run(produce(kafka_bootstrap, topic, "gzip", bomb[: WITHIN_BOUND_MIB * MIB])),
            asyncio.run(produce(kafka_bootstrap, topic, "lz4", orjson.dumps(make_trace()))),
        ]
        del bomb
        found = collect_outputs(kafka_bootstrap, outputs, set(sources), timeout=120)
        peak = status_bytes(worker.pid, "VmHWM")
        assert worker.alive(), worker.tail()
    by_source = {(o.source_partition, o.source_offset): o for o in found}
    assert len(found) == len(by_source) == 4, "each record in exactly one output topic"
    gzip_bomb, zstd_bomb, within, trace = (by_source[s] for s in sources)
    for output in (gzip_bomb, zstd_bomb):
        assert output.decision == "dead_letter"
        assert output.headers["kp-error-kind"] == b"unreadable"
        assert b"KP_MAX_BATCH_BYTES" in output.headers["kp-error-reason"]
        assert output.value is None and output.headers.get("kp-value-omitted")
    assert within.headers["kp-error-kind"] == b"too_large"
    assert within.value is None, "a 16 MiB value is not republished"
    assert trace.decision in ("accepted", "rejected")
    assert peak - ready < PEAK_OVER_READY, (
        f"peak RSS {peak / MIB:.0f} MiB, {(peak - ready) / MIB:.0f} MiB over the ready "
        f"{ready / MIB:.0f} MiB, for {BOMB_MIB} MiB bombs and a {BATCH_BOUND_MIB} MiB bound"
    )
