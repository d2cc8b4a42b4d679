"""Kafka clients the worker, replay and demo share: config, topics, log reading, publishing.

Written against the Apache Kafka protocol only. Faust owns the consumer group; these clients
read ranges of a partition by direct assignment (no group) and publish with acks=all.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
    UnknownError,
    UnsupportedVersionError,
)

from worker.core.errors import error_line
from worker.core.output import is_refused_form, output_topics, refused, without_value
from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.io import unreadable
from worker.retry import backoff
from worker.settings import Settings
from worker.stream.observer import MetricsObserver

log = logging.getLogger(__name__)

PUBLISH_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)
STOP_TIMEOUT_SECONDS = 5.0
# What a broker answers a request for a producer id when it grants none.
NO_PRODUCER_IDS = (UnknownError, UnsupportedVersionError, ClusterAuthorizationFailedError)
FETCH_TIMEOUT_MS = 1000
MAX_IDLE_FETCHES = 30
# Commands run by hand (replay, rescore) give up on an unreachable broker after this long,
# reading (MAX_IDLE_FETCHES empty fetches), connecting (a request unanswered for this long:
# aiokafka's own default waits 40 s) and publishing (records unacknowledged this long after
# they were sent) alike; the worker never does.
COMMAND_GIVE_UP_SECONDS = MAX_IDLE_FETCHES * FETCH_TIMEOUT_MS / 1000


async def _stop_client(
    client: AIOKafkaConsumer | AIOKafkaProducer, name: str, timeout: float = STOP_TIMEOUT_SECONDS
) -> None:
    """Stop a client without hanging on, or masking the error that ended the work with, a
    broker that is gone: aiokafka's stop then waits on it, or lets its fetch task's
    cancellation escape. Whatever was not delivered was not acknowledged either."""
    try:
        await asyncio.wait_for(client.stop(), timeout)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # our own cancellation, not the client's
        log.warning("%s stopped with its requests cancelled", name)
    except (TimeoutError, KafkaError, OSError) as exc:
        log.warning("%s did not stop cleanly", name, extra={"error": repr(exc)[:300]})


async def stop_all(*clients: PartitionLogReader | Publisher | None) -> None:
    """Stop every client, each even when stopping one before it was cancelled (Ctrl-C):
    a client left open is reported as "Unclosed" at exit. The cancellation is raised after."""
    cancelled: asyncio.CancelledError | None = None
    for client in clients:
        if client is None:
            continue
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
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None
        )
        if settings.ssl_certfile:
            context.load_cert_chain(
                str(settings.ssl_certfile),
                str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
            )
        config["ssl_context"] = context
    if settings.security_protocol.startswith("SASL"):
        assert settings.sasl_password is not None
        config["sasl_mechanism"] = settings.sasl_mechanism
        config["sasl_plain_username"] = settings.sasl_username
        config["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    return config


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """The partitions of a topic (none when it does not exist), from the broker's metadata."""
    admin = AIOKafkaAdminClient(**client_config(settings))
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described.get("error_code"):
        return []
    return sorted(p["partition"] for p in described.get("partitions", ()))


async def partitions_of(settings: Settings, topic: str) -> int | None:
    """Partition count of a topic, or None when it does not exist."""
    return len(await topic_partitions(settings, topic)) or None


async def ensure_topics(settings: Settings, output_topics: Sequence[str]) -> int:
    """Create the input topic (if missing) and the output topics; returns input partitions."""
    admin = AIOKafkaAdminClient(**client_config(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        to_create: list[NewTopic] = []
        input_partitions = settings.input_partitions
        if settings.input_topic not in existing:
            to_create.append(
                NewTopic(settings.input_topic, input_partitions, settings.replication_factor)
            )
        else:
            input_partitions = await partitions_of(settings, settings.input_topic) or 1
        partitions = settings.output_partitions or input_partitions
        to_create += [
            _output_topic(name, partitions, settings)
            for name in output_topics
            if name not in existing
        ]
        await _create(admin, to_create)
        return input_partitions
    finally:
        await admin.close()


async def create_topics(settings: Settings, names: Sequence[str], partitions: int) -> None:
    """Create the topics that do not exist yet."""
    admin = AIOKafkaAdminClient(**client_config(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        await _create(
            admin,
            [_output_topic(name, partitions, settings) for name in names if name not in existing],
        )
    finally:
        await admin.close()


def _output_topic(name: str, partitions: int, settings: Settings) -> NewTopic:
    # Kafka's default record limit (~1 MiB) is below what an output may need.
    return NewTopic(
        name,
        partitions,
        settings.replication_factor,
        topic_configs={"max.message.bytes": str(settings.output_record_limit)},
    )


class TopicCreationError(KafkaError):
    """The broker refused to create a topic; the message carries its error code and text."""


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
            if code:
                raise TopicCreationError(f"cannot create topic {name!r}: error {code} {message}")
        log.info("created topic", extra={"topic": topic.name, "partitions": topic.num_partitions})


def _source_record(message: Any) -> SourceRecord:
    return SourceRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp_ms=int(message.timestamp),
        key=message.key,
        value=message.value,
        headers=tuple((k, bytes(v)) for k, v in (message.headers or ())),
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
        )
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if not self._started:
            await self._consumer.start()
            self._started = True

    async def stop(self) -> None:
        """Close the client, started or not (once): a client built and never closed, as when
        Ctrl-C comes before or during its start, is reported as "Unclosed" at exit."""
        if not self._closed:
            self._closed = True
            self._started = False
            await _stop_client(self._consumer, "log reader")

    async def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset (needs the reader to be built with that group id)."""
        return await self._consumer.committed(TopicPartition(topic, partition))

    async def first_offset(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        return (await self._consumer.beginning_offsets([tp]))[tp]

    async def partitions(self, topic: str) -> list[int]:
        return await topic_partitions(self._settings, topic)

    async def probe(
        self, partitions: Sequence[tuple[str, int]], timeout: float
    ) -> dict[tuple[str, int], int]:
        """The end offsets of ``partitions`` (asked of their leaders, as a fetch would be),
        after the cluster's metadata, within ``timeout`` seconds; raises if the broker cannot
        answer. With no partitions, the metadata request alone tells whether it answers."""

        async def ask() -> dict[tuple[str, int], int]:
            await self._consumer.topics()
            wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
            ends = await self._consumer.end_offsets(wanted) if wanted else {}
            return {(tp.topic, tp.partition): end for tp, end in ends.items()}

        return await asyncio.wait_for(ask(), timeout)

    async def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """First offset whose timestamp is >= timestamp_ms, or None if there is none."""
        tp = TopicPartition(topic, partition)
        found = (await self._consumer.offsets_for_times({tp: timestamp_ms}))[tp]
        return None if found is None else found.offset

    async def iter_range(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        end_time_ms: int | None = None,
    ) -> AsyncIterator[list[SourceRecord]]:
        """Chunks of records from ``start`` up to ``end`` (exclusive), the first record at or
        after ``end_time_ms``, or the end of the partition as it was when reading began.

        The end of the partition is the high watermark reported with fetched data, which is
        exact on every broker (unlike a separate end-offsets request on some).
        """
        tp = TopicPartition(topic, partition)
        self._consumer.assign([tp])
        self._consumer.seek(tp, start)
        stop_at = end
        idle_rounds = 0
        while stop_at is None or await self._consumer.position(tp) < stop_at:
            batch = await self._consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
            messages = batch.get(tp, [])
            if stop_at is None:
                stop_at = self._consumer.highwater(tp)
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
                record = _source_record(message)
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
        return [
            record
            async for chunk in self.iter_range(topic, partition, start, end)
            for record in chunk
        ]


class Publisher:
    """Publishes routed records to their output topics and waits for the broker's acks."""

    def __init__(
        self,
        settings: Settings,
        topics: dict[Decision, str] | None = None,
        observer: MetricsObserver | None = None,
        give_up_after_seconds: float | None = None,
    ) -> None:
        """``give_up_after_seconds``: raise once publishing has failed for that long (a
        command run by hand); None retries for as long as it takes (the worker)."""
        self._give_up_after = give_up_after_seconds
        self._topics = topics or output_topics(settings)
        self._observer = observer or MetricsObserver()
        self._settings = settings
        self._max_output_bytes = settings.max_output_bytes
        self.idempotent = settings.producer_idempotence != "off"
        self._producer = self._new_producer()
        self._started = False
        self._closed = False

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **client_config(self._settings),
            acks="all",
            enable_idempotence=self.idempotent,
            # A record is sent as soon as it is ready: each one waits on its own ack inside
            # its 100 ms budget, and a burst still shares requests (records queue while
            # one is in flight to the broker). A 2 ms linger made the publish stage 3.7-4.7 ms
            # instead of 1.3-2.6, with no gain in backlog rate (bench/RESULTS.md).
            linger_ms=0,
            max_batch_size=262_144,
            max_request_size=self._settings.output_record_limit,
            compression_type=self._settings.producer_compression,
            request_timeout_ms=30_000,
        )

    async def start(self) -> None:
        """Start; with ``KP_PRODUCER_IDEMPOTENCE=auto`` a broker that grants no producer id
        gets a plain producer (one warning), with ``on`` it is an error."""
        try:
            await self._producer.start()
        except NO_PRODUCER_IDS as exc:
            await self._producer.stop()
            if self._settings.producer_idempotence == "on":
                raise KafkaError(
                    "KP_PRODUCER_IDEMPOTENCE=on but the broker refused a producer id "
                    f"({type(exc).__name__}); set it to auto or off for this broker"
                ) from exc
            log.warning(
                "publishing without idempotence: the broker grants no producer ids",
                extra={"error": type(exc).__name__},
            )
            self.idempotent = False
            self._producer = self._new_producer()
            await self._producer.start()
        self._started = True

    async def stop(self) -> None:
        """Close the producer, started or not (once; see :meth:`PartitionLogReader.stop`)."""
        if not self._closed:
            self._closed = True
            self._started = False
            await _stop_client(self._producer, "publisher")

    def topic_for(self, decision: Decision) -> str:
        return self._topics[decision]

    async def _send(self, record: RoutedRecord) -> asyncio.Future[Any]:
        """Hand one record to the producer.

        A record the client refuses (too large; neither key nor value; anything it raises
        that is not a KafkaError) would be refused again on every try and every restart: it
        is replaced by a smaller dead letter (``_smaller``), and only a refusal of the
        smallest form raises. A KafkaError other than a size one is the client's state (a
        timeout, a stopped producer), not the record's: it propagates as before.
        """
        try:
            return await self._producer.send(
                self._topics[record.decision],
                value=record.value,
                key=record.key,
                headers=list(record.headers),
            )
        except MessageSizeTooLargeError as exc:  # refused before sending: too large
            refusal: Exception = exc
        except KafkaError:
            raise
        except Exception as exc:  # e.g. aiokafka's assertion on a record with no key or value
            refusal = exc
        smaller = self._smaller(record, refusal)
        if smaller is None:
            raise refusal
        log.warning(
            "the Kafka client refused a record; publishing a smaller dead letter instead",
            extra={
                "topic": record.source.topic,
                "partition": record.source.partition,
                "offset": record.source.offset,
                "error": type(refusal).__name__,
            },
        )
        return await self._send(smaller)

    def _smaller(self, record: RoutedRecord, refusal: Exception) -> RoutedRecord | None:
        """What to publish instead of a refused record: too large, the same without its value
        (the input's headers kept); otherwise, or still refused, the least a dead letter can
        be; None once that too was refused."""
        too_large = isinstance(refusal, MessageSizeTooLargeError | RecordTooLargeError)
        if too_large and record.value is not None:
            return without_value(record, self._max_output_bytes)
        if is_refused_form(record):
            return None
        return refused(record, error_line(refusal, limit=200))

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        """Send all, then wait for every ack; retried until acknowledged (never dropped).

        A record the broker refuses as too large is not retried as it is: it goes to the
        dead-letter topic without its value, pointing at the original (``_smaller``). One the
        client refuses to send is replaced in ``_send``; no record is retried as it was
        refused, so no input record can stop the worker at its offset on every restart.
        """
        pending = list(routed)
        delays = backoff(PUBLISH_RETRY_SECONDS)
        failing_since: float | None = None
        while pending:
            sent_at = time.monotonic()
            futures = [await self._send(record) for record in pending]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [
                (self._smaller(r, res) or r)
                if isinstance(res, MessageSizeTooLargeError | RecordTooLargeError)
                else r
                for r, res in zip(pending, results, strict=True)
                if isinstance(res, BaseException)
            ]
            if not failed:
                self._observer.broker_published()
                return
            self._observer.publish_retried()
            errors = {type(res).__name__ for res in results if isinstance(res, BaseException)}
            # From the first try: a request to a broker that vanished fails only after its
            # timeout, and that wait counts towards giving up.
            failing_since = failing_since or sent_at
            gave_up = self._give_up_after is not None and (
                time.monotonic() - failing_since >= self._give_up_after
            )
            if gave_up:
                raise KafkaError(
                    f"the broker acknowledged no output for {self._give_up_after:.0f} s "
                    f"({', '.join(sorted(errors))})"
                )
            delay = next(delays)
            log.warning(
                "publish failed, retrying",
                extra={"failed": len(failed), "errors": sorted(errors), "retry_in_s": delay},
            )
            pending = failed
            await asyncio.sleep(delay)


__all__ = [
    "KafkaError",
    "PartitionLogReader",
    "Publisher",
    "client_config",
    "ensure_topics",
    "stop_all",
]
