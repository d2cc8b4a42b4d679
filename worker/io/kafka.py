"""Kafka clients the worker, replay and demo share: config, topics, log reading (publishing
is ``worker.io.publisher``).

Written against the Apache Kafka protocol only. ``worker.io.group_consumer`` owns the consumer
group; these clients read ranges of a partition by direct assignment (no group).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)

from worker.core.cache_store import ENTRY_BYTES, StoreTopic
from worker.core.records import SourceRecord
from worker.io import unreadable
from worker.io.tls import TLS_PROTOCOLS, tls_context
from worker.settings import Settings

log = logging.getLogger(__name__)

STOP_TIMEOUT_SECONDS = 5.0
FETCH_TIMEOUT_MS = 1000
MAX_IDLE_FETCHES = 30
# A log's end is known from the first fetch answered, records or none (an empty log).
END_FETCH_TIMEOUT_MS = 100
# Commands run by hand (replay, rescore) give up on an unreachable broker after this long,
# reading (MAX_IDLE_FETCHES empty fetches), connecting (a request unanswered for this long:
# aiokafka's own default waits 40 s) and publishing (records unacknowledged this long after
# they were sent) alike; the worker never does.
COMMAND_GIVE_UP_SECONDS = MAX_IDLE_FETCHES * FETCH_TIMEOUT_MS / 1000


async def stop_client(client: AIOKafkaConsumer | AIOKafkaProducer, name: str) -> None:
    """Stop a client without hanging on, or masking the error that ended the work with, a
    broker that is gone: aiokafka's stop then waits on it, or lets its fetch task's
    cancellation escape. Whatever was not delivered was not acknowledged either."""
    try:
        await asyncio.wait_for(client.stop(), STOP_TIMEOUT_SECONDS)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # our own cancellation, not the client's
        log.warning("%s stopped with its requests cancelled", name)
    except (TimeoutError, KafkaError, OSError) as exc:
        log.warning("%s did not stop cleanly", name, extra={"error": repr(exc)[:300]})


class Stoppable(Protocol):
    """A reader or publisher: what :func:`stop_all` stops."""

    async def stop(self) -> None: ...


async def stop_all(*clients: Stoppable | None) -> None:
    """Stop every client, each even when stopping one before it was cancelled (Ctrl-C):
    a client left open is reported as "Unclosed" at exit. The cancellation is raised after."""
    cancelled: asyncio.CancelledError | None = None
    for client in filter(None, clients):
        try:
            await client.stop()
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled


def client_config(settings: Settings) -> dict[str, Any]:
    """Connection and security options every aiokafka client gets (SASL/SSL pass through)."""
    config: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in TLS_PROTOCOLS:
        config["ssl_context"] = tls_context(settings)
    if settings.security_protocol.startswith("SASL"):
        assert settings.sasl_password is not None
        config["sasl_mechanism"] = settings.sasl_mechanism
        config["sasl_plain_username"] = settings.sasl_username
        config["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    return config


@asynccontextmanager
async def _admin(settings: Settings) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(**client_config(settings))
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def _partitions(admin: AIOKafkaAdminClient, topic: str) -> list[int]:
    (described,) = await admin.describe_topics([topic])
    if described.get("error_code"):
        return []
    return sorted(p["partition"] for p in described.get("partitions", ()))


async def ensure_topics(
    settings: Settings, output_topics: Sequence[str]
) -> tuple[int, StoreTopic | None]:
    """Create the input topic (if missing), the output topics and the cache store's; returns
    the input's partition count and the store (None when KP_CACHE_STORE_TOPIC is empty)."""
    name, store = settings.cache_store_topic, None
    async with _admin(settings) as admin:
        existing = set(await admin.list_topics())
        if settings.input_topic in existing:
            partitions = len(await _partitions(admin, settings.input_topic)) or 1
        else:
            partitions = settings.input_partitions
            await _create(
                admin, [NewTopic(settings.input_topic, partitions, settings.replication_factor)]
            )
        if name:
            if name not in existing:
                await _create(admin, [store_topic_spec(name, partitions, settings)])
            store = StoreTopic(name, len(await _partitions(admin, name)) or partitions)
    await create_topics(settings, output_topics, settings.output_partitions or partitions)
    return partitions, store


async def create_topics(settings: Settings, names: Sequence[str], partitions: int) -> None:
    """Create the topics that do not exist yet."""
    async with _admin(settings) as admin:
        existing = set(await admin.list_topics())
        await _create(
            admin,
            [
                output_topic_spec(name, partitions, settings)
                for name in names
                if name not in existing
            ],
        )


def output_topic_spec(name: str, partitions: int, settings: Settings) -> NewTopic:
    # Kafka's default record limit (~1 MiB) is below what an output may need.
    return NewTopic(
        name,
        partitions,
        settings.replication_factor,
        topic_configs={"max.message.bytes": str(settings.output_record_limit)},
    )


def store_topic_spec(name: str, partitions: int, settings: Settings) -> NewTopic:
    """The cache store (:mod:`worker.core.cache_store`): one partition per input partition,
    kept by size, not age (an idle partition's cache never expires in the worker either): at
    least three segments of a full cache's entries, where a restore reads two caches' worth."""
    segment = max(1_048_576, settings.cache_capacity * ENTRY_BYTES)
    configs = {"retention.ms": "-1", "segment.bytes": str(segment)}
    return NewTopic(
        name,
        partitions,
        settings.replication_factor,
        topic_configs={**configs, "retention.bytes": str(4 * segment)},
    )


class TopicCreationError(KafkaError):
    """The broker refused to create a topic; the message carries its error code and text."""


class TopicNotAuthorized(TopicCreationError):
    """The user may neither see ``topic`` (Describe, which Read and Write include) nor create
    it (Create): whether it exists, the broker does not say."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(
            f"not authorized: the broker neither shows topic {topic!r} to this user "
            "(Describe, which Read and Write include) nor lets it create the topic (Create)"
        )


# What CreateTopics answers a user without Create (on the topic or the cluster).
_NOT_AUTHORIZED_CODES = (
    TopicAuthorizationFailedError.errno,
    ClusterAuthorizationFailedError.errno,
)


async def _create(admin: AIOKafkaAdminClient, topics: list[NewTopic]) -> None:
    for topic in topics:
        try:
            response = await admin.create_topics([topic])
        except TopicAlreadyExistsError:
            continue
        # The admin client reports per-topic errors in the response instead of raising.
        for name, code, *message in getattr(response, "topic_errors", ()):
            if code == TopicAlreadyExistsError.errno:
                continue
            if code in _NOT_AUTHORIZED_CODES:
                raise TopicNotAuthorized(name)
            if code:
                raise TopicCreationError(f"cannot create topic {name!r}: error {code} {message}")
        log.info("created topic", extra={"topic": topic.name, "partitions": topic.num_partitions})


# Kafka's timestamp of a record without one: aiokafka reads a message format v0 record's as None.
NO_TIMESTAMP = -1


def source_record(message: Any) -> SourceRecord:
    """A consumed aiokafka record as the scorer takes it. A header value may be null on the
    wire: it stays null, not empty bytes, on every output that keeps it. Its timestamp is the
    record's integer milliseconds, exact over int64 (None, a record without one, is -1)."""
    milliseconds = message.timestamp
    headers = message.headers or ()
    return SourceRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp_ms=NO_TIMESTAMP if milliseconds is None else milliseconds,
        key=message.key,
        value=message.value,
        headers=tuple((str(k), None if v is None else bytes(v)) for k, v in headers),
    )


class PartitionLogReader:
    """Reads offset ranges of partitions directly (no consumer group, commits nothing)."""

    def __init__(
        self,
        settings: Settings,
        group_id: str | None = None,
        give_up_after_seconds: float | None = None,
    ) -> None:
        """``give_up_after_seconds``: the longest one request may wait for an answer (a
        command run by hand); None keeps the client's default (the worker)."""
        self._settings = settings
        self._group_id = group_id
        # One client reads one partition at a time (each read assigns it): reads take turns.
        self._reading = asyncio.Lock()
        unreadable.install(settings.max_batch_bytes)
        timeout: dict[str, int] = {}
        if give_up_after_seconds is not None:
            timeout["request_timeout_ms"] = int(give_up_after_seconds * 1000)
        self._consumer = AIOKafkaConsumer(
            **client_config(settings),
            **timeout,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=settings.fetch_max_bytes,
            fetch_max_bytes=settings.fetch_max_bytes,
            # A broker that holds a fetch until the wait runs out holds each read that long.
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
            # A transactional producer's aborted records are neither scored nor read back.
            isolation_level="read_committed",
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        """Close the client, started or not: a client built and never closed, as when Ctrl-C
        comes before or during its start, is reported as "Unclosed" at exit. (aiokafka's
        stop does nothing the second time.)"""
        await stop_client(self._consumer, "log reader")

    async def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset; None from a reader built with no group (a replay
        owns no offsets: every partition starts where its range starts)."""
        if self._group_id is None:
            return None
        return await self._consumer.committed(TopicPartition(topic, partition))

    async def first_offset(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        return (await self._consumer.beginning_offsets([tp]))[tp]

    async def log_end(self, topic: str, partition: int, near: int) -> int:
        """The partition's end (high watermark) as a fetch from ``near`` reports it, exact on
        every broker (an end-offsets request is not on some). A fetch past the end goes back to
        the log's start, and reports the end as well."""
        tp = TopicPartition(topic, partition)
        async with self._reading, self._paused_after(tp):
            self._consumer.assign([tp])  # a new assignment: no high watermark known yet
            self._consumer.seek(tp, near)
            async with asyncio.timeout(COMMAND_GIVE_UP_SECONDS):
                while (end := self._consumer.highwater(tp)) is None:
                    await self._consumer.getmany(tp, timeout_ms=END_FETCH_TIMEOUT_MS, max_records=1)
        return int(end)

    @asynccontextmanager
    async def _paused_after(self, tp: TopicPartition) -> AsyncIterator[None]:
        """Pause ``tp`` once read: the client would fetch it again every fetch wait, for nothing,
        and the next request of the reader waited for that fetch (1 s of each 1.1 s that a
        takeover's reads of a partition took on Apache Kafka, against 0.1 s paused)."""
        try:
            yield
        finally:
            self._consumer.pause(tp)

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of a topic (none when it does not exist), from the broker's metadata.
        A topic asked for by name is created by a broker that creates topics on first use
        (Apache Kafka's default): a misspelt topic would be made, and read as empty."""
        async with _admin(self._settings) as admin:
            if topic not in await admin.list_topics():
                return []
            return await _partitions(admin, topic)

    async def probe(
        self, partitions: Sequence[tuple[str, int]], timeout: float
    ) -> dict[tuple[str, int], int]:
        """The end offsets of ``partitions`` (asked of their leaders, as a fetch would be),
        within ``timeout`` seconds; raises if the broker cannot answer. With no partitions, the
        input's first partition is asked, not returned. Never the cluster's metadata, which
        names every topic: an idle worker asking it every probe took 0.0520 core beside 3,000
        other topics, 0.0060 without (bench/idle_cpu.py --other-topics, RESULTS.md). The client
        finds a partition's leader in the metadata of the topics it reads."""
        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        asked = wanted or [TopicPartition(self._settings.input_topic, 0)]
        async with asyncio.timeout(timeout):
            ends = await self._consumer.end_offsets(asked)
        return {(tp.topic, tp.partition): ends[tp] for tp in wanted}

    async def range_start(
        self, topic: str, partition: int, from_offset: int | None, from_time_ms: int | None
    ) -> int | None:
        """Where a range of the partition starts: its first offset, or ``from_offset`` if
        later, or its first record at or after ``from_time_ms``; None when no record is at or
        after that time (nothing of the partition is in the range)."""
        start = await self.first_offset(topic, partition)
        if from_offset is not None:
            return max(start, from_offset)
        if from_time_ms is not None:
            tp = TopicPartition(topic, partition)
            found = (await self._consumer.offsets_for_times({tp: from_time_ms}))[tp]
            # A broker answers "none" as no offset, or as one with timestamp -1 (unknown).
            if found is None or found.timestamp < from_time_ms:
                return None
            return max(start, found.offset)
        return start

    async def iter_range(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        end_time_ms: int | None = None,
        end_may_pass_the_log: bool = False,
    ) -> AsyncIterator[list[SourceRecord]]:
        """Chunks of records from ``start`` up to ``end`` (exclusive), the first record at or
        after ``end_time_ms``, or the end of the partition as it was when reading began.

        The end of the partition is the high watermark reported with fetched data, which is
        exact on every broker (unlike a separate end-offsets request on some). Without
        ``end_may_pass_the_log`` the records up to ``end`` are known to exist, and waited for;
        with it (a range a person gave), the range also stops at the end of the partition.
        """
        tp = TopicPartition(topic, partition)
        self._consumer.assign([tp])
        self._consumer.seek(tp, start)
        stop_at = None if end_may_pass_the_log else end
        idle_rounds = 0
        while stop_at is None or await self._consumer.position(tp) < stop_at:
            messages = (await self._consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)).get(tp, [])
            if stop_at is None:
                stop_at = self._consumer.highwater(tp)
                if stop_at is not None and end is not None:
                    stop_at = min(stop_at, end)
            if not messages:
                idle_rounds += 1
                if stop_at is None and idle_rounds >= 3:
                    return  # an empty partition reports no high watermark
                if idle_rounds >= MAX_IDLE_FETCHES:
                    raise TimeoutError(f"{topic}[{partition}]: no records from {start} to {end}")
                continue
            idle_rounds = 0
            chunk = []
            for message in messages:
                record = source_record(message)
                if record.offset < start:
                    # Before the range: the client went back to the log's start, as it does
                    # (auto_offset_reset) when Kafka answers a start past the end out of range.
                    continue
                if stop_at is not None and record.offset >= stop_at:
                    break
                if end_time_ms is not None and record.timestamp_ms >= end_time_ms:
                    stop_at = record.offset
                    break
                chunk.append(record)
            if chunk:
                yield chunk

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """Records with start <= offset < end, in offset order."""
        if end <= start:
            return []
        async with self._reading, self._paused_after(TopicPartition(topic, partition)):
            return [
                record
                async for chunk in self.iter_range(topic, partition, start, end)
                for record in chunk
            ]
