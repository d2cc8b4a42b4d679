"""Read a worker's three output topics back and index every output by its source record."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from support.kafka_helpers import wait_for_partitions


@dataclass(frozen=True)
class Output:
    decision: str  # accepted | rejected | dead_letter
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]  # a header without a value is None

    @property
    def document(self) -> dict[str, Any]:
        assert self.value is not None
        return orjson.loads(self.value)  # type: ignore[no-any-return]

    @property
    def score(self) -> float | None:
        return None if self.decision == "dead_letter" else self.document["score"]["score"]


def _output(decision: str, message: Any) -> Output:
    headers = {k: None if v is None else bytes(v) for k, v in (message.headers or ())}
    if decision == "dead_letter":
        partition, offset = _dead_letter_source(headers)
    else:
        source = orjson.loads(message.value)["source"]
        partition, offset = source["partition"], source["offset"]
    return Output(decision, partition, offset, message.key, message.value, headers)


async def collect_outputs_async(
    bootstrap: str,
    topics: dict[str, str],
    expected: set[tuple[int, int]],
    timeout: float = 60.0,
    settle: float = 1.0,
    isolation_level: str = "read_uncommitted",
) -> list[Output]:
    """All outputs (duplicates included) until every expected (partition, offset) is seen.

    ``topics`` maps output topic -> decision. Reads ``settle`` seconds more after that, so
    unexpected extra outputs are caught too.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        partitions = await wait_for_partitions(bootstrap, topics, timeout)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        outputs: list[Output] = []
        settled_at: float | None = None
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=300)
            for tp, messages in batches.items():
                outputs.extend(_output(topics[tp.topic], m) for m in messages)
            seen = {(o.source_partition, o.source_offset) for o in outputs}
            if expected <= seen:
                settled_at = settled_at or time.monotonic()
                if time.monotonic() - settled_at >= settle:
                    return outputs
        missing = sorted(expected - {(o.source_partition, o.source_offset) for o in outputs})
        raise TimeoutError(f"{len(missing)} input records have no output, e.g. {missing[:10]}")
    finally:
        await consumer.stop()


def collect_outputs(
    bootstrap: str,
    topics: dict[str, str],
    expected: set[tuple[int, int]],
    timeout: float = 60.0,
    settle: float = 1.0,
    isolation_level: str = "read_uncommitted",
) -> list[Output]:
    return asyncio.run(
        collect_outputs_async(bootstrap, topics, expected, timeout, settle, isolation_level)
    )


def first_by_source(outputs: list[Output]) -> dict[tuple[int, int], Output]:
    first: dict[tuple[int, int], Output] = {}
    for output in outputs:
        first.setdefault((output.source_partition, output.source_offset), output)
    return first


async def outputs_by_trace_id(
    bootstrap: str, topics: list[str], wanted: set[str], timeout: float
) -> dict[str, list[tuple[str, float | None, tuple[int, int]]]]:
    """trace id -> (output topic, score, source (partition, offset)) of each of its outputs,
    read from the beginning of ``topics`` until every wanted id has one. A dead letter
    without a value is keyed ``dead:<record key>`` and has no score."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    outputs: dict[str, list[tuple[str, float | None]]] = {}
    try:
        partitions = await wait_for_partitions(bootstrap, topics, timeout)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= set(outputs):
            for messages in (await consumer.getmany(timeout_ms=300)).values():
                for m in messages:
                    headers = {k: bytes(v) for k, v in (m.headers or ())}
                    if not m.value:
                        source = _dead_letter_source(headers)
                        outputs.setdefault(f"dead:{m.key!r}", []).append((m.topic, None, source))
                        continue
                    value = orjson.loads(m.value)
                    if "score" in value:
                        score = value["score"]["score"]
                        source = (value["source"]["partition"], value["source"]["offset"])
                    else:
                        score, source = None, _dead_letter_source(headers)
                    outputs.setdefault(value["trace"]["id"], []).append((m.topic, score, source))
    finally:
        await consumer.stop()
    return outputs


def _dead_letter_source(headers: dict[str, bytes]) -> tuple[int, int]:
    return int(headers["kp-source-partition"]), int(headers["kp-source-offset"])
