"""Watching a worker through a Kafka cluster's failovers, with clients that ride them out.

- :class:`Feeder` produces varied traces to the input topic (acks=all, idempotent), at a
  steady rate and in bursts, retrying through leader changes.
- :class:`OutputTail` reads the three output topics from the beginning, from a thread, and
  keeps every output with the time the broker appended it (the output topics are created
  with ``message.timestamp.type=LogAppendTime``, so the figure is the broker's, not the time
  this reader got round to it).
- The rest asks what the cluster looks like: leaders and in-sync replicas (an
  :class:`AdminClient`), the group's coordinator and committed offsets (aiokafka's admin).

librdkafka (``confluent_kafka``) follows leaders by itself, so none of these helpers needs
restarting when a node dies.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from support.determinism import THINGS, TOOLS, VERBS
from support.traces import make_trace

DOMAINS = ("code", "finance", "support", "medical", "general")
# librdkafka's own lines (a connection refused by the dead node, ...) go to logging, which
# pytest shows with a failure, rather than to stderr.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
# Every this many records one is not JSON: a dead letter.
MALFORMED_EVERY = 61


def varied_trace(i: int, tag: str) -> bytes:
    """Record ``i``: a trace with its own id and a text drawn from a few hundred (so novelty
    meets near and exact repeats), or every ``MALFORMED_EVERY``th a record that is not JSON."""
    if i % MALFORMED_EVERY == MALFORMED_EVERY // 2:
        return b'{"broken": '
    rng = random.Random(i)
    verb, thing = rng.choice(VERBS), rng.choice(THINGS)
    steps: list[dict[str, Any]] = [
        {"step_id": 0, "type": "thought", "content": f"plan to {verb} {thing}"}
    ]
    for step_id in range(1, rng.randint(1, 5)):
        kind = rng.choice(["tool_call", "observation", "error_recovery"])
        step: dict[str, Any] = {"step_id": step_id, "type": kind, "content": f"{kind} {i % 37}"}
        if kind == "tool_call":
            step["tool"] = {"name": rng.choice(TOOLS)}
        steps.append(step)
    return orjson.dumps(
        make_trace(
            id=f"kp:trace:{tag}-{i:06d}",
            domain=rng.choice(DOMAINS),
            success=rng.random() < 0.8,
            confidence=round(rng.random(), 2),
            objective=f"{verb} {thing}",
            steps=steps,
        )
    )


def create_replicated_topics(
    admin: AdminClient,
    topics: dict[str, dict[str, str]],
    partitions: int,
    replication_factor: int,
    timeout: float = 60.0,
) -> None:
    """Create each topic with its configs; raises what the broker answered."""
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor, config=c) for name, c in topics.items()],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for future in futures.values():
        future.result(timeout)


def leaders(admin: AdminClient, topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the node that leads it (-1: none now)."""
    found: dict[tuple[str, int], int] = {}
    for topic in topics:
        metadata = admin.list_topics(topic, timeout=15).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        for partition in metadata.partitions.values():
            found[(topic, partition.id)] = partition.leader
    return found


def under_replicated(admin: AdminClient, topics: Iterable[str], replicas: int) -> list[str]:
    """The partitions of ``topics`` without a leader or with fewer in-sync replicas."""
    short = []
    for topic in topics:
        metadata = admin.list_topics(topic, timeout=15).topics[topic]
        for partition in metadata.partitions.values():
            if partition.leader < 0 or len(partition.isrs) < replicas:
                short.append(f"{topic}[{partition.id}] isr={sorted(partition.isrs)}")
    return short


async def _ask_group(bootstrap: str, group: str, offsets: bool) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        async with asyncio.timeout(20):
            await admin.start()
            if offsets:
                return await admin.list_consumer_group_offsets(group)
            return await admin.find_coordinator(group)
    finally:
        await admin.close()


def coordinator(bootstrap: str, group: str) -> int | None:
    """The node coordinating ``group`` now (None while nobody answers for it).

    Asked with aiokafka: librdkafka's admin client aborted the process (an assertion in
    ``rd_kafka_enq_once_del_source_return``) asking this while the coordinator was dead."""
    try:
        return int(asyncio.run(_ask_group(bootstrap, group, offsets=False)))
    except Exception:  # the coordinator is moving: ask again
        return None


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int] | None:
    """The group's committed offsets (None while the coordinator cannot be asked)."""
    try:
        answer = asyncio.run(_ask_group(bootstrap, group, offsets=True))
    except Exception:  # the coordinator is moving: ask again
        return None
    return {(tp.topic, tp.partition): meta.offset for tp, meta in answer.items()}


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark: every offset below it is a record (no transactions)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kp-watermarks", "logger": LIBRDKAFKA_LOG}
    )
    try:
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            assert low == 0, f"{topic}[{p}] starts at {low}: records were deleted"
            ends[p] = high
        return ends
    finally:
        consumer.close()


class Feeder(threading.Thread):
    """Produces record after record (``varied_trace``), ``rate`` a second round-robin over the
    partitions, and ``send(n)`` more at once; each acknowledged by every in-sync replica."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float, tag: str):
        super().__init__(daemon=True)
        self.topic, self.partitions, self.rate, self.tag = topic, partitions, rate, tag
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "logger": LIBRDKAFKA_LOG,
            }
        )
        self.errors: list[str] = []
        self.acknowledged = 0
        self._next = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def send(self, count: int) -> None:
        for _ in range(count):
            with self._lock:
                i, self._next = self._next, self._next + 1
            self.producer.produce(
                self.topic,
                value=varied_trace(i, self.tag),
                key=f"k{i}".encode(),
                partition=i % self.partitions,
                on_delivery=self._delivered,
            )
            self.producer.poll(0)

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
            return
        with self._lock:
            self.acknowledged += 1

    def run(self) -> None:
        while not self._halt.wait(1 / self.rate):
            self.send(1)

    def close(self) -> None:
        """Stop the steady feed; what is not acknowledged yet is dropped."""
        self._halt.set()
        self.join(10)

    def finish(self, timeout: float = 120.0) -> None:
        """Stop the steady feed and wait until every record is acknowledged."""
        self._halt.set()
        self.join(timeout)
        left = self.producer.flush(timeout)
        assert left == 0, f"{left} input records never acknowledged: {self.errors[-3:]}"
        assert not self.errors, f"input records not delivered: {self.errors[:3]}"


@dataclass(frozen=True)
class Seen:
    """One output record as read back."""

    topic: str
    partition: int
    offset: int
    appended_ms: int  # LogAppendTime: when the leader wrote it
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    source: tuple[int, int]  # the input record's (partition, offset)

    @property
    def content(self) -> tuple[str, bytes | None, bytes | None, tuple[Any, ...]]:
        """What must be the same on every copy of one input record's output."""
        return (self.topic, self.key, self.value, self.headers)


def _seen(message: Any) -> Seen:
    headers = tuple((k, None if v is None else bytes(v)) for k, v in message.headers() or ())
    named = dict(headers)
    if "kp-source-offset" in named:  # a dead letter says where its input is in headers
        source = (int(named["kp-source-partition"] or b""), int(named["kp-source-offset"] or b""))
    else:
        where = orjson.loads(message.value())["source"]
        source = (where["partition"], where["offset"])
    return Seen(
        message.topic(),
        message.partition(),
        message.offset(),
        message.timestamp()[1],
        message.key(),
        message.value(),
        headers,
        source,
    )


class OutputTail(threading.Thread):
    """Reads every partition of ``topics`` from its start until stopped; ``isolation_level``
    read_uncommitted also keeps the outputs of aborted transactions (librdkafka's default,
    read_committed, skips them)."""

    def __init__(
        self,
        bootstrap: str,
        topics: Iterable[str],
        partitions: int,
        isolation_level: str = "read_committed",
    ) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "kp-output-tail",  # never joined: partitions are assigned
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": isolation_level,
                "logger": LIBRDKAFKA_LOG,
            }
        )
        self.consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)]
        )
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for message in self.consumer.consume(500, timeout=0.2):
                    if message.error() is None:
                        with self._lock:
                            self.seen.append(_seen(message))
        finally:
            self.consumer.close()

    def outputs(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def wait_for(self, expected: set[tuple[int, int]], timeout: float, alive: Any) -> None:
        """Until every expected input record has an output; ``alive()`` is asserted meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            missing = expected - {s.source for s in self.outputs()}
            if not missing:
                return
            assert time.monotonic() < deadline, (
                f"{len(missing)} input records have no output after {timeout:g} s, "
                f"e.g. {sorted(missing)[:10]}"
            )
            alive()
            time.sleep(0.5)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
