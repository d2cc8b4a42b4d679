"""The input topic's consumer group: aiokafka's own group consumer, feeding the pipeline.

Each record goes to :meth:`StreamScorer.submit` as it arrives, with an acknowledgement that
marks its offset done (:class:`~worker.stream.checkpoint.Acknowledgements`). Every
KP_COMMIT_INTERVAL_SECONDS, at a revocation and at the stop, each partition is committed up to
its first record not yet acknowledged; with exactly-once its offset goes in its transaction
instead, and its previous owner is fenced before its committed offset is read.

The worker consumed through faust's consumer before: its thread, stream and agent cost 1.3-3.4
ms of CPU a record on top of this path (``python bench/client_floor.py``, bench/RESULTS.md
"Without faust's consumer"), which kept the worker from 1.1x its model's CPU a trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import InconsistentGroupProtocolError, KafkaError
from aiokafka.structs import ConsumerRecord

from worker.io import unreadable
from worker.io.access import AUTHORIZATION_ERRORS, refusals
from worker.io.kafka import client_config, source_record, stop_client
from worker.io.transactions import TransactionalPublisher
from worker.settings import Settings
from worker.stream.checkpoint import Acknowledgements, CommitWentBackwards
from worker.stream.checkpoint import TopicPartition as Partition
from worker.stream.observer import MetricsObserver
from worker.stream.permissions import Refusal
from worker.stream.processor import StreamScorer
from worker.version import __version__

log = logging.getLogger(__name__)

# How long one wait for records lasts before the loop looks again (a stop ends it sooner).
POLL_TIMEOUT_MS = 1000
# After the broker refused the consumer (the input's Read, the group's), it asks again this
# much later; a fetch that works lifts the refusal once none came for this long.
REFUSED_PAUSE_SECONDS = 1.0
REFUSED_QUIET_SECONDS = 2.0
# After any other error of the consumer, it asks again this much later.
RETRY_SECONDS = 1.0
# The longest a revocation or the stop waits to commit acknowledged records (a broker that is
# gone would hold it forever: the commit retries); what is left is redelivered.
LAST_COMMIT_SECONDS = 5.0
# The group's own bounds: a request the coordinator holds must not time out before the session
# does; a worker not asking for records this long (a cache rebuilt from the model) leaves the
# group; members take this long to rejoin a rebalance.
REQUEST_TIMEOUT_SECONDS = 90.0
MAX_POLL_INTERVAL_SECONDS = 1000.0
REBALANCE_TIMEOUT_SECONDS = 60.0
# How old the consumer's view of the input topic may grow: partitions added to the topic, or
# the topic recreated, are seen within this long and taken in the rebalance that follows.
METADATA_MAX_AGE_SECONDS = 10


def group_consumer_config(settings: Settings) -> dict[str, object]:
    """The group consumer's configuration. Workers of versions that consumed through faust
    assigned with faust's own protocol: the group refuses a mix (docs/operations.md, "Upgrading
    from a worker that consumed through faust")."""
    return {
        **client_config(settings),
        "client_id": f"kp-scorer-{__version__}",
        "group_id": settings.group_id,
        "partition_assignment_strategy": (RoundRobinPartitionAssignor,),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        # Aborted records of a transactional producer are never scored.
        "isolation_level": "read_committed",
        "fetch_max_wait_ms": settings.fetch_max_wait_ms,
        "fetch_max_bytes": settings.fetch_max_bytes,
        "max_partition_fetch_bytes": settings.fetch_max_bytes,
        "max_poll_records": settings.fetch_buffer_records,
        "session_timeout_ms": int(settings.session_timeout_seconds * 1000),
        "heartbeat_interval_ms": int(settings.heartbeat_interval_seconds * 1000),
        "request_timeout_ms": int(
            max(REQUEST_TIMEOUT_SECONDS, settings.session_timeout_seconds) * 1000
        ),
        "max_poll_interval_ms": int(MAX_POLL_INTERVAL_SECONDS * 1000),
        "rebalance_timeout_ms": int(REBALANCE_TIMEOUT_SECONDS * 1000),
        "metadata_max_age_ms": METADATA_MAX_AGE_SECONDS * 1000,
    }


class GroupConsumer(ConsumerRebalanceListener):  # type: ignore[misc]
    """Consumes the input topic in the worker's group and commits what was published."""

    def __init__(
        self,
        settings: Settings,
        stream: StreamScorer,
        observer: MetricsObserver,
        crash: Callable[[BaseException], None],
        transactions: TransactionalPublisher | None = None,
    ) -> None:
        self.settings = settings
        self.stream = stream
        self.observer = observer
        self.transactions = transactions
        self.acknowledgements = Acknowledgements()
        self._crash = crash
        self._consumer: AIOKafkaConsumer | None = None
        self._tasks: list[asyncio.Future[None]] = []
        self._committing = asyncio.Lock()
        # The offset after the last record delivered of each partition in this assignment: a
        # record below it means the client went back to the log's start.
        self._read: dict[Partition, int] = {}
        self._held: set[Partition] = set()
        self._seeking: set[Partition] = set()  # exactly-once: fenced, not yet sought
        self._assignment = 0  # rebalances so far: records fetched before one are not taken
        stream.partitions.hold_fetching = self.hold_fetching

    async def start(self) -> None:
        # A batch it cannot read, or that decompresses past KP_MAX_BATCH_BYTES, is dead letters.
        unreadable.install(self.settings.max_batch_bytes)
        self._consumer = AIOKafkaConsumer(**group_consumer_config(self.settings))
        await self._consumer.start()
        self._consumer.subscribe([self.settings.input_topic], listener=self)
        self._tasks = [
            asyncio.ensure_future(self._consume()),
            asyncio.ensure_future(self._commit_every(self.settings.commit_interval_seconds)),
        ]
        for task in self._tasks:
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Future[None]) -> None:
        """A loop that ended on an error ends the worker: it would otherwise stay up idle."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._crash(exc)

    async def stop_fetching(self) -> None:
        """Take no more records (the stop drains the pipeline next)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """The last commit (after the pipeline drained), then the group is left."""
        await self.stop_fetching()
        if self._consumer is None:
            return
        try:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await asyncio.wait_for(self.commit(), LAST_COMMIT_SECONDS)
        finally:
            await stop_client(self._consumer, "group consumer")

    # -- records ------------------------------------------------------------------------------
    async def _consume(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while True:
            try:
                batch = await consumer.getmany(
                    timeout_ms=POLL_TIMEOUT_MS, max_records=self.settings.fetch_buffer_records
                )
            except AUTHORIZATION_ERRORS as exc:
                # Reported, asked again: a refused permission is never a crash or a hang.
                for refusal in refusals(exc, "Read"):
                    self.observer.permissions.refused(refusal)
                await asyncio.sleep(REFUSED_PAUSE_SECONDS)
                continue
            except InconsistentGroupProtocolError as exc:
                log.error(
                    "the group refused this worker: its members assign partitions another way "
                    "(workers of a version that consumed through faust?); retrying",
                    extra={"group_id": self.settings.group_id, "error": type(exc).__name__},
                )
                await asyncio.sleep(RETRY_SECONDS)
                continue
            except KafkaError as exc:
                if exc.retriable:  # the broker did not answer: counted as unreachable
                    self.stream.failures.consumer_failed(exc)
                log.warning("fetching failed; retrying", extra={"error": repr(exc)[:300]})
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if consumer.assignment():
                self._granted()
            assignment = self._assignment
            for tp, records in batch.items():
                await self._submit((tp.topic, tp.partition), records, assignment)
                if tp in consumer.assignment() and (end := consumer.highwater(tp)) is not None:
                    self.observer.lag.log_ends({(tp.topic, tp.partition): end})

    def _granted(self) -> None:
        """A fetch that works lifts the input's Read refused (the group's Read is lifted by an
        assignment: a fetch also works while the group refuses this worker)."""
        self.observer.permissions.granted(
            Refusal("Read", "topic", self.settings.input_topic),
            quiet_seconds=REFUSED_QUIET_SECONDS,
        )

    async def _submit(
        self, tp: Partition, records: Sequence[ConsumerRecord[bytes, bytes]], assignment: int
    ) -> None:
        """Hand ``records`` to the pipeline, unless the group rebalanced since they were
        fetched (``assignment``): the new assignment delivers them again from the committed
        offset, and taking them too would acknowledge them out of order."""
        if self._assignment != assignment:
            return
        if self.transactions is not None and (
            not self.transactions.owns(tp) or tp in self._seeking
        ):
            # Fenced by the partition's new owner, or read before its fencing ended: its
            # records are delivered again from the committed offset read after it.
            return
        first = records[0].offset
        read = self._read.get(tp)
        if read is not None and first < read:
            # The client goes back like this only to the log's start, when its position passed
            # the log's end (topic recreated, log truncated).
            self.acknowledgements.restart([tp])
            self.stream.partitions.consumer_sent_back(tp, read - 1)
        self._read[tp] = records[-1].offset + 1
        now = time.monotonic()
        full = self.settings.max_in_flight_records
        for index, record in enumerate(records):
            if self._assignment != assignment:
                break
            self.observer.broker.fetched()
            acknowledge = self.acknowledgements.delivered(tp, record.offset)
            if index + 1 < len(records) and self.stream.checkpoint.in_flight() >= full:
                # Records of tp wait for the pipeline: the client fetches nothing more of it
                # until they are taken (it holds one answer a partition at most).
                self.observer.fetching_paused(tp, True)
            await self.stream.submit([source_record(record)], [now], [acknowledge])
        self.observer.fetching_paused(tp, False)

    def hold_fetching(self, tp: Partition, held: bool) -> None:
        """Fetch nothing of ``tp`` while held: its novelty cache is being rebuilt, and a record
        of it would hold every other partition's records behind it until then."""
        (self._held.add if held else self._held.discard)(tp)
        consumer = self._consumer
        partition = TopicPartition(*tp)
        if consumer is None or partition not in consumer.assignment():
            return  # revoked meanwhile: a new assignment starts every partition fetching
        (consumer.pause if held else consumer.resume)(partition)

    # -- commits ------------------------------------------------------------------------------
    async def _commit_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.commit()
            except KafkaError as exc:
                if self.transactions is not None:
                    # Aborted: its records were acknowledged here, and the next transaction's
                    # offset would commit past them; only a restart from the committed offsets
                    # scores them again.
                    self._crash(exc)
                    return
                log.warning("commit failed; retrying", extra={"error": repr(exc)[:300]})

    async def commit(self, partitions: Iterable[Partition] | None = None) -> bool:
        """Commit what was acknowledged of ``partitions`` (all assigned ones by default);
        returns whether it landed. Step 3 of :mod:`worker.stream.checkpoint`: a commit that
        would take a partition's offset backwards is refused before it reaches the broker."""
        consumer = self._consumer
        if consumer is None:
            return False
        async with self._committing:
            if self.transactions is not None:
                # Each partition's offset goes in its transaction, with its outputs; a plain
                # commit could cover outputs that a failed transaction then drops.
                offsets = await self.transactions.commit()
                self.stream.checkpoint.committed(offsets)
                return True
            assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            wanted = assigned if partitions is None else assigned & set(partitions)
            offsets = self.acknowledgements.to_commit(sorted(wanted))
            if not offsets:
                return True
            try:
                self.stream.checkpoint.committing(offsets)
            except CommitWentBackwards as exc:
                self._crash(exc)  # records already committed would be delivered again
                return False
            try:
                await consumer.commit({TopicPartition(*tp): o for tp, o in offsets.items()})
            except KafkaError as exc:
                # The group refused it (rebalancing) or the broker is gone: the records after
                # the last commit that landed are delivered again, to this worker or the next.
                log.info("commit not taken", extra={"error": type(exc).__name__})
                return False
            self.acknowledgements.committed(offsets)
            self.stream.checkpoint.committed(offsets)
            return True

    # -- rebalances ---------------------------------------------------------------------------
    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit what was acknowledged of ``revoked`` while the group still takes commits of
        this generation, so their next owner starts after it. With exactly-once, what they
        published is committed, and what comes after is aborted: even a partition this worker
        gets back starts again at its committed offset, its cache rebuilt."""
        self._assignment += 1
        released = sorted((tp.topic, tp.partition) for tp in revoked)
        if self.transactions is not None:
            with contextlib.suppress(KafkaError):
                await self.transactions.commit()
            self.stream.partitions.forget(released)
            await self.transactions.release(released)
        elif released:
            with contextlib.suppress(TimeoutError, KafkaError):
                await asyncio.wait_for(self.commit(released), LAST_COMMIT_SECONDS)
        self.acknowledgements.restart(released)
        for tp in released:
            self._read.pop(tp, None)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        now_assigned = sorted((tp.topic, tp.partition) for tp in assigned)
        consumer = self._consumer
        assert consumer is not None
        self._assignment += 1
        self.acknowledgements.restart(now_assigned)
        self._read = {}
        if self.transactions is not None:
            # Each partition's previous owner is fenced first: its open transaction ends
            # before the committed offset is read, and a late commit of its is refused.
            self._seeking = set(now_assigned)
            try:
                await self.transactions.fence(now_assigned)
                for tp in sorted(assigned):
                    committed = await consumer.committed(tp)
                    if committed is None:
                        await consumer.seek_to_beginning(tp)
                    else:
                        consumer.seek(tp, committed)
                    self._seeking.discard((tp.topic, tp.partition))
            except KafkaError as exc:
                self._crash(exc)
                return
            finally:
                self._seeking = set()
        for tp in self._held & set(now_assigned):
            consumer.pause(TopicPartition(*tp))
        self.stream.assigned(now_assigned)
        self.observer.permissions.granted(Refusal("Read", "group", self.settings.group_id))
        log.info("partitions assigned", extra={"partitions": now_assigned})
