"""Exactly once (``KP_PROCESSING_GUARANTEE=exactly_once``): each input partition's outputs and
its consumed offset are committed in one Kafka transaction, by a producer whose transactional id
belongs to that partition, so a read_committed consumer sees every input record's output once.

The order on assignment (``GroupConsumer.on_partitions_assigned``): :meth:`fence` starts the
partition's producer, which makes the broker abort or finish the previous owner's open
transaction and refuse that owner anything more; only then are the committed offsets read, and
the partition's cache rebuilt and its records scored. A worker that was paused while its
partitions moved (a zombie) finds its producer fenced: its records of that partition are
dropped, never committed.

The worker's outputs go through :class:`~worker.io.publisher.Publisher`, never through faust's
producer (not started), so faust's own ``exactly_once`` mode would not cover them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from worker.core.cache_store import StoreTopic
from worker.core.failures import PartitionLost
from worker.core.records import Decision, RoutedRecord
from worker.io.kafka import stop_client
from worker.io.publisher import NO_PRODUCER_IDS, Publisher
from worker.settings import Settings
from worker.stream.observer import MetricsObserver

log = logging.getLogger(__name__)

Partition = tuple[str, int]
# What a producer gets once another has started with its transactional id.
FENCED = (ProducerFenced, InvalidProducerEpoch)


class TransactionsRefused(KafkaError):
    """The broker grants no transactions: exactly-once cannot run on it."""


@dataclass
class _Owned:
    """One owned input partition: its producer, and the open transaction's reach."""

    producer: AIOKafkaProducer
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The offset after the last record whose output went into the open transaction; None
    # while no transaction is open.
    next_offset: int | None = None


class TransactionalPublisher(Publisher):
    """Publishes each input partition's outputs in that partition's open transaction, and
    commits the transaction with the partition's offset (:meth:`commit`)."""

    def __init__(
        self,
        settings: Settings,
        topics: dict[Decision, str] | None = None,
        observer: MetricsObserver | None = None,
        store: StoreTopic | None = None,
    ) -> None:
        super().__init__(settings, topics, observer, store=store)
        self._group_id = settings.group_id
        self._owned: dict[Partition, _Owned] = {}
        # One assignment at a time: two producers of one partition would fence each other.
        self._fencing = asyncio.Lock()

    def transactional_id(self, tp: Partition) -> str:
        """Stable for the partition whichever worker owns it: that is what fences the last one."""
        return f"{self._group_id}:{tp[0]}:{tp[1]}"

    async def start(self) -> None:
        """Refuse at start, in one line, a broker that grants no transactions (the embedded
        one): a producer with the group's own check id asks for one."""
        check = self._new_producer(f"{self._group_id}:start-check")
        try:
            await check.start()
        except (*NO_PRODUCER_IDS, TransactionalIdAuthorizationFailed) as exc:
            raise TransactionsRefused(
                "KP_PROCESSING_GUARANTEE=exactly_once but the broker grants no transactions "
                f"({type(exc).__name__}); use at_least_once with this broker, or grant the "
                f"worker Write on transactional ids starting '{self._group_id}:'"
            ) from exc
        finally:
            await stop_client(check, "transaction check")

    async def stop(self) -> None:
        """Abort what is open (its records were never committed: they are redelivered)."""
        await self.release(list(self._owned))
        await super().stop()

    # -- ownership ----------------------------------------------------------------------------
    def owns(self, tp: Partition) -> bool:
        """Whether the partition's records are this worker's to score: fenced by it since its
        assignment, and not fenced by another worker since."""
        return tp in self._owned

    async def fence(self, partitions: Iterable[Partition]) -> None:
        """Own ``partitions`` from now on: a producer for each one not yet owned, started
        before anything of it is read (the previous owner is fenced); those owned no more
        are released."""
        wanted = set(partitions)
        async with self._fencing:
            await self._release([tp for tp in self._owned if tp not in wanted])
            new = sorted(tp for tp in wanted if tp not in self._owned)
            producers = {tp: self._new_producer(self.transactional_id(tp)) for tp in new}
            started = await asyncio.gather(
                *(producer.start() for producer in producers.values()), return_exceptions=True
            )
            failed = [exc for exc in started if isinstance(exc, BaseException)]
            if failed:
                await asyncio.gather(
                    *(stop_client(p, "transactional producer") for p in producers.values())
                )
                raise failed[0]
            self._owned.update({tp: _Owned(producer) for tp, producer in producers.items()})
            if new:
                log.info("partitions fenced for exactly-once", extra={"partitions": new})

    async def release(self, partitions: Sequence[Partition]) -> None:
        """Own ``partitions`` no more: an open transaction is aborted, the producer stopped."""
        async with self._fencing:
            await self._release(partitions)

    async def _release(self, partitions: Sequence[Partition]) -> None:
        for tp in partitions:
            owned = self._owned.pop(tp, None)
            if owned is None:
                continue
            async with owned.lock:
                if owned.next_offset is not None:
                    await self._abort(tp, owned)
            await stop_client(owned.producer, "transactional producer")

    # -- publishing -----------------------------------------------------------------------------
    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        """Send one input record's outputs in its partition's open transaction, opening one if
        none is, and wait for the broker's acks. Records of a partition enter in the order they
        call this (the lock is first come, first served): the transaction's offset covers
        every record before it."""
        tp = routed[0].source.topic_partition
        owned = self._owned.get(tp)
        if owned is None:
            raise PartitionLost(f"{tp[0]}[{tp[1]}] is not owned by this worker any more")
        async with owned.lock:
            if self._owned.get(tp) is not owned:
                raise PartitionLost(f"{tp[0]}[{tp[1]}] was released meanwhile")
            try:
                if owned.next_offset is None:
                    await owned.producer.begin_transaction()
                    owned.next_offset = routed[0].source.offset
                # Cache entries in the same transaction: visible with their outputs, or never.
                items = self._with_entries(routed)
                sent = [await self._send(item, owned.producer) for item in items]
            except FENCED as exc:
                raise await self._lost(tp, owned, exc) from exc
            owned.next_offset = routed[-1].source.offset + 1
        results = await asyncio.gather(*sent, return_exceptions=True)
        errors = [res for res in results if isinstance(res, BaseException)]
        if errors:
            # The transaction cannot commit: everything in it is redelivered.
            if isinstance(errors[0], FENCED):
                raise await self._lost(tp, owned, errors[0]) from errors[0]
            raise errors[0]
        self._observer.broker.published()

    async def commit(self) -> dict[Partition, int]:
        """Commit every open transaction with its partition's offset; returns the offsets
        committed. A fenced partition is dropped (its next owner scores it again)."""
        partitions = list(self._owned)
        offsets = await asyncio.gather(*(self._commit(tp) for tp in partitions))
        return {
            tp: offset for tp, offset in zip(partitions, offsets, strict=True) if offset is not None
        }

    async def _commit(self, tp: Partition) -> int | None:
        owned = self._owned.get(tp)
        if owned is None:
            return None
        async with owned.lock:
            offset = owned.next_offset
            if offset is None or self._owned.get(tp) is not owned:
                return None
            began = time.monotonic()
            try:
                await owned.producer.send_offsets_to_transaction(
                    {TopicPartition(*tp): offset}, self._group_id
                )
                await owned.producer.commit_transaction()
            except FENCED as exc:
                await self._lost(tp, owned, exc)
                return None
            except KafkaError:
                await self._abort(tp, owned)
                raise
            owned.next_offset = None
            self._observer.transaction_committed(time.monotonic() - began)
            return offset

    async def _abort(self, tp: Partition, owned: _Owned) -> None:
        owned.next_offset = None
        self._observer.transaction_aborted()
        try:
            await owned.producer.abort_transaction()
        except KafkaError as exc:  # fenced or unreachable: the broker aborts it in time
            log.warning(
                "transaction not aborted",
                extra={"topic": tp[0], "partition": tp[1], "error": type(exc).__name__},
            )

    async def _lost(self, tp: Partition, owned: _Owned, exc: BaseException) -> PartitionLost:
        """Another producer took the partition's transactional id: this worker's hold on the
        partition is over, and nothing of its open transaction will ever be visible. Returns
        what the partition's publishing raises."""
        if self._owned.get(tp) is owned:
            del self._owned[tp]
            owned.next_offset = None
            self._observer.transaction_aborted()
            log.warning(
                "fenced: another worker owns the partition now; its records here are dropped",
                extra={"topic": tp[0], "partition": tp[1], "error": type(exc).__name__},
            )
            await stop_client(owned.producer, "transactional producer")
        return PartitionLost(f"{tp[0]}[{tp[1]}]: another worker owns it now")
