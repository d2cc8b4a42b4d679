"""Publishing routed records to their output topics, acknowledged by the broker (acks=all):
a record is never dropped, and one the Kafka client refuses is replaced by a dead letter it
can publish, so no input record can stop the worker at its offset. A topic the user may not
write to (no Write ACL) is reported by name and retried like an outage until it may.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    UnknownError,
    UnsupportedVersionError,
)

from worker.core.cache_store import StoreTopic
from worker.core.output import is_refused_form, output_topics, refused, without_value
from worker.core.records import Decision, RoutedRecord
from worker.io.access import AUTHORIZATION_ERRORS
from worker.io.kafka import client_config, stop_client
from worker.logs import error_line
from worker.retry import backoff
from worker.settings import Settings
from worker.stream.observer import MetricsObserver
from worker.stream.permissions import Refusal

log = logging.getLogger(__name__)

PUBLISH_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)
# What a broker answers a request for a producer id when it grants none.
NO_PRODUCER_IDS = (UnknownError, UnsupportedVersionError, ClusterAuthorizationFailedError)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A scored trace's cache entry on its way to the store (:mod:`worker.core.cache_store`):
    published, retried and refused as an output is."""

    topic: str
    partition: int
    key: bytes
    value: bytes


class Publisher:
    """Publishes routed records to their output topics and waits for the broker's acks."""

    def __init__(
        self,
        settings: Settings,
        topics: dict[Decision, str] | None = None,
        observer: MetricsObserver | None = None,
        give_up_after_seconds: float | None = None,
        store: StoreTopic | None = None,
    ) -> None:
        """``give_up_after_seconds``: raise once publishing has failed for that long (a
        command run by hand); None retries for as long as it takes (the worker). ``store``:
        where records' cache entries go (None: nowhere)."""
        self._give_up_after = give_up_after_seconds
        self._store = store
        self._topics = topics or output_topics(settings)
        self._observer = observer or MetricsObserver()
        self._settings = settings
        self.idempotent = settings.producer_idempotence != "off"
        self._producer = self._new_producer()

    def _new_producer(self, transactional_id: str | None = None) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **client_config(self._settings),
            acks="all",
            enable_idempotence=self.idempotent or transactional_id is not None,
            transactional_id=transactional_id,
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

    async def stop(self) -> None:
        """Close the producer, started or not (see :meth:`PartitionLogReader.stop`)."""
        await stop_client(self._producer, "publisher")

    async def _send(
        self, record: RoutedRecord | CacheEntry, producer: AIOKafkaProducer | None = None
    ) -> asyncio.Future[Any]:
        """Hand one record to ``producer`` (else the publisher's own). One it refuses (too
        large; neither key nor value; anything but a KafkaError) would be refused on every try
        and restart: it is replaced by a smaller dead letter (``_smaller``). Another KafkaError
        is the client's state (a timeout, a stopped producer), not the record's: it
        propagates."""
        send = (producer or self._producer).send
        try:
            if isinstance(record, CacheEntry):
                return await send(
                    record.topic, key=record.key, value=record.value, partition=record.partition
                )
            return await send(
                self._topics[record.decision],
                value=record.value,
                key=record.key,
                headers=list(record.headers),
            )
        except MessageSizeTooLargeError as exc:  # refused before sending: too large
            refusal: Exception = exc
        except AUTHORIZATION_ERRORS as exc:  # the topic's permission, not the record: retried
            not_sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            not_sent.set_exception(exc)
            return not_sent
        except KafkaError:
            raise
        except Exception as exc:  # e.g. aiokafka's assertion on a record with no key or value
            refusal = exc
        if isinstance(record, CacheEntry) or (smaller := self._smaller(record, refusal)) is None:
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
        return await self._send(smaller, producer)

    def _with_entries(self, routed: Sequence[RoutedRecord]) -> list[RoutedRecord | CacheEntry]:
        """The records, then their cache entries (none without a store). An entry goes beside
        its output, in the same requests to the broker: sent after the output's ack, each took
        a request of its own (20.7-21.4 traces a worker CPU-second against 22.0-24.8 without a
        store; beside them 21.9-24.2 against 22.3-25.2: bench/worker_throughput.py, RESULTS.md).
        One visible before its output is harmless: it is a pure function of the trace's text,
        and a restore reads only those of traces before the committed offset."""
        store = self._store
        entries = [
            CacheEntry(store.name, store.partition_of(r.source.partition), *r.cache_entry)
            for r in routed
            if store is not None and r.cache_entry is not None
        ]
        return [*routed, *entries]

    def _topic(self, item: RoutedRecord | CacheEntry) -> str:
        return item.topic if isinstance(item, CacheEntry) else self._topics[item.decision]

    def _smaller(self, record: RoutedRecord, refusal: Exception) -> RoutedRecord | None:
        """What to publish instead of a refused record: too large, the same without its value
        (the input's headers kept); otherwise, or still refused, the least a dead letter can
        be, then that with an empty key if it is still too large; None once that too was
        refused."""
        too_large = isinstance(refusal, MessageSizeTooLargeError | RecordTooLargeError)
        if too_large and record.value is not None:
            return without_value(record, self._settings.max_output_bytes)
        if is_refused_form(record):
            if too_large and record.key:  # the input's key alone is over the limit
                return refused(record, error_line(refusal, limit=200), with_key=False)
            return None
        return refused(record, error_line(refusal, limit=200))

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        """Send all (with their cache entries), then wait for every ack; retried until
        acknowledged (never dropped). A record the broker refuses as too large is retried as
        its ``_smaller`` form."""
        items = self._with_entries(routed)
        pending = items
        delays = backoff(PUBLISH_RETRY_SECONDS)
        failing_since: float | None = None
        while pending:
            sent_at = time.monotonic()
            futures = [await self._send(item) for item in pending]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [
                (self._smaller(r, res) or r)
                if isinstance(r, RoutedRecord)
                and isinstance(res, MessageSizeTooLargeError | RecordTooLargeError)
                else r
                for r, res in zip(pending, results, strict=True)
                if isinstance(res, BaseException)
            ]
            refused = sorted(
                {
                    self._topic(item)
                    for item, result in zip(pending, results, strict=True)
                    if isinstance(result, AUTHORIZATION_ERRORS)
                }
            )
            for topic in refused:
                self._observer.permissions.refused(Refusal("Write", "topic", topic))
            if not failed:
                self._observer.broker.published()
                for topic in {self._topic(item) for item in items}:
                    self._observer.permissions.granted(Refusal("Write", "topic", topic))
                return
            self._observer.publish_retried()
            errors = {type(res).__name__ for res in results if isinstance(res, BaseException)}
            errors |= {f"not authorized: Write on topic {topic!r}" for topic in refused}
            # From the first try: a request to a broker that vanished fails only after its
            # timeout, and that wait counts towards giving up.
            failing_since = failing_since or sent_at
            if self._give_up_after is not None and (
                time.monotonic() - failing_since >= self._give_up_after
            ):
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
