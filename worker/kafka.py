"""Kafka clients the worker, replay and demo share: config, topics, log reading, publishing.

Written against the Apache Kafka protocol only. Faust owns the consumer group; these clients
read ranges of a partition by direct assignment (no group) and publish with acks=all.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from worker.pipeline import Decision, RoutedRecord, SourceRecord
from worker.settings import Settings

log = logging.getLogger(__name__)

PUBLISH_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)
FETCH_TIMEOUT_MS = 1000


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


def output_topic(settings: Settings, decision: Decision) -> str:
    return {
        Decision.ACCEPTED: settings.accepted_topic,
        Decision.REJECTED: settings.rejected_topic,
        Decision.DEAD_LETTER: settings.dead_letter_topic,
    }[decision]


async def partitions_of(settings: Settings, topic: str) -> int | None:
    """Partition count of a topic, or None when it does not exist."""
    consumer = AIOKafkaConsumer(**client_config(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await consumer._client.fetch_all_metadata()
        found = partitions.partitions_for_topic(topic)
        return len(found) if found else None
    finally:
        await consumer.stop()


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
            NewTopic(name, partitions, settings.replication_factor)
            for name in output_topics
            if name not in existing
        ]
        for topic in to_create:
            try:
                await admin.create_topics([topic])
                log.info(
                    "created topic", extra={"topic": topic.name, "partitions": topic.num_partitions}
                )
            except TopicAlreadyExistsError:
                pass
        return input_partitions
    finally:
        await admin.close()


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

    def __init__(self, settings: Settings, group_id: str | None = None) -> None:
        self._consumer = AIOKafkaConsumer(
            **client_config(settings),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes * 2),
        )
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self._consumer.start()
            self._started = True

    async def stop(self) -> None:
        if self._started:
            await self._consumer.stop()
            self._started = False

    async def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset (needs the reader to be built with that group id)."""
        return await self._consumer.committed(TopicPartition(topic, partition))

    async def first_offset(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        return (await self._consumer.beginning_offsets([tp]))[tp]

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """Records with start <= offset < end, in offset order."""
        if end <= start:
            return []
        tp = TopicPartition(topic, partition)
        self._consumer.assign([tp])
        self._consumer.seek(tp, start)
        records: list[SourceRecord] = []
        idle_rounds = 0
        while await self._consumer.position(tp) < end:
            batch = await self._consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
            messages = batch.get(tp, [])
            if not messages:
                idle_rounds += 1
                if idle_rounds >= 30:
                    raise TimeoutError(
                        f"{topic}[{partition}]: no records between {start} and {end}"
                    )
                continue
            idle_rounds = 0
            records.extend(_source_record(m) for m in messages if start <= m.offset < end)
        return records


class Publisher:
    """Publishes routed records to their output topics and waits for the broker's acks."""

    def __init__(self, settings: Settings, topics: dict[Decision, str] | None = None) -> None:
        self._topics = topics or {d: output_topic(settings, d) for d in Decision}
        self._producer = AIOKafkaProducer(
            **client_config(settings),
            acks="all",
            linger_ms=2,
            max_batch_size=262_144,
            max_request_size=max(1_048_576, settings.max_message_bytes + 65_536),
            request_timeout_ms=30_000,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    def topic_for(self, decision: Decision) -> str:
        return self._topics[decision]

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        """Send all, then wait for every ack; retried until acknowledged (never dropped)."""
        pending = list(routed)
        attempt = 0
        while pending:
            futures = [
                await self._producer.send(
                    self._topics[record.decision],
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                )
                for record in pending
            ]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [
                r for r, res in zip(pending, results, strict=True) if isinstance(res, BaseException)
            ]
            if not failed:
                return
            errors = {type(res).__name__ for res in results if isinstance(res, BaseException)}
            delay = PUBLISH_RETRY_SECONDS[min(attempt, len(PUBLISH_RETRY_SECONDS) - 1)]
            log.warning(
                "publish failed, retrying",
                extra={"failed": len(failed), "errors": sorted(errors), "retry_in_s": delay},
            )
            attempt += 1
            pending = failed
            await asyncio.sleep(delay)


__all__ = ["KafkaError", "PartitionLogReader", "Publisher", "client_config", "ensure_topics"]
