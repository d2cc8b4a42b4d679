"""A decompression bomb through a real worker: a record whose value is 64 MiB of one byte, in
one gzip batch of ~64 KiB, is dead-lettered as too_large; the trace after it is scored; the
worker keeps running, and its peak resident memory grows by a bounded multiple of the
value (aiokafka decompresses a whole batch in memory, then copies the value out of it).

The 1 GiB bomb, and the figure the Deployment's memory limit is sized from, are
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
BOMB_MIB = 64
# What the worker may hold beyond its ready size for the bomb: the decompressed batch and the
# value copied out of it (2x; 2.0x measured), and room for allocator slack.
PEAK_OVER_READY = 3 * BOMB_MIB * MIB


def status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


async def produce_bomb_and_trace(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type="gzip",
        max_request_size=(BOMB_MIB + 1) * MIB,
        acks="all",
    )
    await producer.start()
    try:
        bomb = await producer.send_and_wait(
            topic, b"x" * (BOMB_MIB * MIB), key=b"bomb", partition=0
        )
        trace = await producer.send_and_wait(
            topic, orjson.dumps(make_trace()), key=b"after", partition=0
        )
    finally:
        await producer.stop()
    return [(bomb.partition, bomb.offset), (trace.partition, trace.offset)]


def test_a_gzip_bomb_is_dead_lettered_in_bounded_memory(kafka_bootstrap: str) -> None:
    env, outputs = worker_topics(f"bomb-{uuid.uuid4().hex[:8]}", partitions=1)
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        assert worker.pid is not None
        ready = status_bytes(worker.pid, "VmRSS")
        sources = asyncio.run(produce_bomb_and_trace(kafka_bootstrap, env["KP_INPUT_TOPIC"]))
        found = collect_outputs(kafka_bootstrap, outputs, set(sources), timeout=120)
        peak = status_bytes(worker.pid, "VmHWM")
        assert worker.alive(), worker.tail()
    by_source = {(o.source_partition, o.source_offset): o for o in found}
    assert len(found) == len(by_source) == 2, "each record in exactly one output topic"
    bomb, trace = (by_source[s] for s in sources)
    assert bomb.decision == "dead_letter"
    assert bomb.headers["kp-error-kind"] == b"too_large"
    assert bomb.headers.get("kp-value-omitted"), "a 64 MiB value is not republished"
    assert trace.decision in ("accepted", "rejected")
    assert peak - ready < PEAK_OVER_READY, (
        f"peak RSS {peak / MIB:.0f} MiB, {(peak - ready) / MIB:.0f} MiB over the ready "
        f"{ready / MIB:.0f} MiB, for a {BOMB_MIB} MiB value"
    )
