"""Every private member of faust and aiokafka that the worker overrides, in one place.

Each override below names what it buys; ``tests/unit/io/test_library_overrides.py`` fails when
the library renames or reshapes a member used here. The other override, aiokafka's
``PartitionRecords`` and its codec functions (unreadable and oversized batches), lives in
:mod:`worker.io.unreadable`, installed from here, with its own tests.

- ``AIOKafkaConsumerThread._create_worker_consumer`` and the consumer's
  ``_fetch_max_wait_ms`` / ``_fetch_max_bytes`` / ``_isolation_level``: the fetch wait and fetch
  size from the settings, and read_committed.
- ``AIOKafkaConsumerThread._consumer`` / ``thread_loop``: pausing a partition's fetches.
- ``AIOKafkaConsumerThread.seek_to_committed``: a partition without a committed offset goes
  back to its log's start too.
- ``AIOKafkaConsumerThread._fetch_records`` and the group coordinator's ``_pending_exception``,
  ``_coordination_task`` and ``check_errors``: a permission the broker refuses the consumer
  (reading the input, joining the group) is reported and asked again, never a crash or a hang.
- ``Consumer._new_consumer_thread`` and ``_buffered_partitions``: the thread above, and pausing
  a partition in the client while faust's buffer for it is full.
- ``Consumer._commit``: every commit passes the checkpoint first (a commit never goes back);
  with exactly-once, the offsets are committed in the partitions' transactions instead.
- ``Consumer.commit`` / ``maybe_wait_for_commit_to_finish``: a commit asked for while another
  is under way still commits, once that one ended (the last commit at a stop among them).
- ``Consumer.on_partitions_revoked``: the revoked partitions' acknowledged records are
  committed before they go.
- ``Consumer.perform_seek``: with exactly-once, the partitions' previous owners are fenced
  before the committed offsets are read.
- ``Consumer._read_offset`` (read in ``getmany``) and ``_committed_offset``, ``_acked``,
  ``_acked_index``, ``_gap``: a partition whose log started over is read and committed anew.
- ``Consumer._to_message``: each message keeps the record's timestamp as Kafka has it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiokafka
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, ConsumerMessage, Message
from faust.types.transports import TPorTopicSet

from worker.io import unreadable
from worker.io.access import AUTHORIZATION_ERRORS, refusals
from worker.settings import Settings
from worker.stream.permissions import Permissions, Refusal

# After the broker refused the consumer a fetch, it asks again this much later; a fetch that
# works lifts the refusal once none came for this long.
REFUSED_FETCH_PAUSE_SECONDS = 1.0
REFUSED_FETCH_QUIET_SECONDS = 2.0
# The longest a revocation waits to commit the revoked partitions' acknowledged records.
REVOKE_COMMIT_SECONDS = 5.0


class ScorerConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread with the fetch wait and the fetch size taken from the settings.

    faust creates its group consumer with a fixed 1.5 s fetch wait. A broker that answers a
    fetch only when that wait runs out would hold each new record up to 1.5 s before the
    worker sees it, which alone breaks the 100 ms budget. It bounds each partition's share of
    a fetch (``consumer_max_fetch_size``) but leaves the whole fetch at aiokafka's 50 MiB:
    here the whole fetch gets the same bound as one partition (``Settings.fetch_max_bytes``).
    It reads ``read_uncommitted`` outside its own exactly-once mode, so a transactional
    producer's aborted records would be scored: here the consumer reads ``read_committed``.
    """

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        settings: Settings = self.app.scorer_settings  # type: ignore[attr-defined]
        # Both are read when the consumer starts its fetcher (the overrides test checks it).
        consumer._fetch_max_wait_ms = settings.fetch_max_wait_ms
        consumer._fetch_max_bytes = settings.fetch_max_bytes
        consumer._isolation_level = "read_committed"
        # A batch it cannot read, or that decompresses past KP_MAX_BATCH_BYTES, is dead letters.
        unreadable.install(settings.max_batch_bytes)
        return consumer

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """faust's seek of every assigned partition to its committed offset, where one without
        a committed offset (None, or 0, which aiokafka does not seek to either) goes back to
        its log's start, as a new assignment starts it. faust seeks like this to take back
        records it fetched and then dropped, because a rebalance had stopped its flow
        meanwhile; a partition not seeking back lost them: a partition added to the input
        topic lost its first records in 7 of 20 tries."""
        committed = await super().seek_to_committed()
        uncommitted = [tp for tp, offset in committed.items() if not offset]
        if uncommitted:
            await self.seek_to_beginning(*uncommitted)
        return committed

    def set_fetching(self, tp: TP, fetching: bool) -> None:
        """Pause or resume fetching ``tp``; safe to call from the app's event loop."""
        with contextlib.suppress(RuntimeError):  # the consumer thread has stopped: nothing to do
            self.thread_loop.call_soon_threadsafe(self._set_fetching, tp, fetching)

    @property
    def _permissions(self) -> Permissions:
        return self.app.observer.permissions  # type: ignore[attr-defined,no-any-return]

    async def _fetch_records(
        self,
        consumer: aiokafka.AIOKafkaConsumer,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Any:
        """faust's fetch, where the broker refusing to let the worker read the input (no Read
        on the topic) is reported, once, and the fetch asked again a second later: faust let
        the error crash the worker, which restarted into the same refusal. A fetch that works
        again lifts the refusal."""
        try:
            records = await super()._fetch_records(
                consumer, active_partitions, timeout=timeout, max_records=max_records
            )
        except TopicAuthorizationFailedError as exc:
            for refusal in refusals(exc, "Read"):
                self._permissions.refused(refusal)
            await asyncio.sleep(REFUSED_FETCH_PAUSE_SECONDS)
            return {}
        for topic in sorted({tp.topic for tp in active_partitions or ()}):
            self._permissions.granted(
                Refusal("Read", "topic", topic), quiet_seconds=REFUSED_FETCH_QUIET_SECONDS
            )
        return records

    def take_refusal(self) -> None:
        """Take the authorization error the group coordinator holds, if any (see
        :meth:`_take_refusal`); safe to call from the app's event loop."""
        with contextlib.suppress(RuntimeError):  # the consumer thread has stopped: nothing to do
            self.thread_loop.call_soon_threadsafe(self._take_refusal)

    def _take_refusal(self) -> None:
        """aiokafka's group coordinator stops at an error for the user, such as the group's
        Read refused, until the user takes it: aiokafka's own getmany does, faust's fetch does
        not (and fetches nothing while it holds no partition). The worker waited for its group
        without a word, and still after the permission was granted. Taken here, the refusal is
        reported and the coordinator joins again."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        pending = getattr(coordinator, "_pending_exception", None)
        if coordinator is None or not isinstance(pending, AUTHORIZATION_ERRORS):
            return
        if coordinator._coordination_task.done():
            return  # ended: check_errors would raise how, which is not ours to take
        try:
            coordinator.check_errors()
        except AUTHORIZATION_ERRORS as exc:
            for refusal in refusals(exc, "Read"):
                self._permissions.refused(refusal)

    def _set_fetching(self, tp: TP, fetching: bool) -> None:
        consumer = self._consumer
        partition = aiokafka.TopicPartition(tp.topic, tp.partition)
        if consumer is None or partition not in consumer.assignment():
            return  # revoked meanwhile: a new assignment starts every partition fetching
        if fetching:
            consumer.resume(partition)
        else:
            consumer.pause(partition)


class ScorerConsumer(faust_aiokafka.Consumer):
    """Faust's consumer that stops fetching a partition while the worker has a backlog of it.

    faust stops handing over a partition's records once the agent's buffer is under
    pressure (``stream_buffer_maxsize``, KP_FETCH_BUFFER_RECORDS), and takes them again
    when it has drained, but its consumer thread keeps asking the broker for more: an empty
    fetch every KP_FETCH_MAX_WAIT_MS, for nothing. On a backlog on 2 cores those fetches
    took ~0.03 of a core in the worker and ~0.035 in the broker (bench/RESULTS.md). Here the
    partition is paused in the Kafka client as well, so no fetch is sent for it until the
    buffer has drained.
    """

    _thread: ScorerConsumerThread

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ScorerConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def on_buffer_full(self, tp: TP) -> None:
        super().on_buffer_full(tp)
        if tp in self._buffered_partitions:
            self._thread.set_fetching(tp, False)
            self.app.observer.fetching_paused(tp, True)  # type: ignore[attr-defined]

    def on_buffer_drop(self, tp: TP) -> None:
        paused = tp in self._buffered_partitions
        super().on_buffer_drop(tp)
        if paused:
            self._thread.set_fetching(tp, True)
            self.app.observer.fetching_paused(tp, False)  # type: ignore[attr-defined]

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        """Step 3 of :mod:`worker.stream.checkpoint`: a commit that would take a partition's
        offset backwards is refused before it reaches the broker."""
        stream = self.app.stream_scorer  # type: ignore[attr-defined]
        if stream is not None:
            stream.checkpoint.committing(offsets)
        transactions = self.app.transactions  # type: ignore[attr-defined]
        if transactions is not None:
            # Exactly-once: each partition's offset goes in its transaction, with its outputs;
            # a plain commit here could cover outputs that a failed transaction then drops.
            try:
                await transactions.commit()
            except KafkaError as exc:
                # Aborted: its records were acknowledged here, so only a restart from the
                # committed offsets scores them again (faust's own commit crashes alike).
                await self.crash(exc)
                return False
            landed = True
        else:
            landed = bool(await super()._commit(offsets))
        if landed and stream is not None:
            stream.checkpoint.committed(offsets)
        return landed

    async def commit(
        self, topics: TPorTopicSet | None = None, start_new_transaction: bool = True
    ) -> bool:
        """faust's commit, after the commit under way (if any) ended: faust's own, finding one
        under way, waits for it and commits nothing more. What was acknowledged meanwhile then
        stayed uncommitted: at a stop (faust's last commit) a clean stop exited 75, and at a
        revocation (below) the partitions' next owner scored it again."""
        await self.maybe_wait_for_commit_to_finish()
        return await super().commit(topics, start_new_transaction=start_new_transaction)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """faust's revocation, after committing what was acknowledged of ``revoked``, as a
        Kafka consumer does in its revocation callback (the group still takes commits of its
        generation then). faust, without its ``stream_wait_empty``, drops their
        acknowledgements uncommitted: their next owner scored up to a commit interval of
        records again, and a stop of this worker before that owner had committed past them
        exited 75. A commit that fails or takes over REVOKE_COMMIT_SECONDS leaves them to be
        redelivered, as before. With exactly-once the app commits the partitions' transactions."""
        if revoked and self.app.transactions is None:  # type: ignore[attr-defined]
            with contextlib.suppress(TimeoutError, KafkaError):
                await asyncio.wait_for(self.commit(revoked), REVOKE_COMMIT_SECONDS)
        await super().on_partitions_revoked(revoked)

    async def perform_seek(self) -> None:
        """faust's seek to the committed offsets, where with exactly-once each partition's
        previous owner is fenced first (``TransactionalPublisher.fence``): its open transaction
        ends before its committed offset is read, and a late commit of its is refused."""
        transactions = self.app.transactions  # type: ignore[attr-defined]
        if transactions is not None:
            await transactions.fence((tp.topic, tp.partition) for tp in self.assignment())
        await super().perform_seek()

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        """faust's records, where one below the last record read of its partition goes on to
        the worker too. The client goes back like that only to the log's start, when its
        position has passed the log's end (topic recreated, log truncated): faust would drop
        every record of the new log below that offset without a word, and take no
        acknowledgement below the old log's committed offset (which its seek on assignment
        may have set again since the worker forgot it). The worker's partitions are told
        (``Partitions.consumer_sent_back``)."""
        async for tp, message in super().getmany(timeout):
            read = self._read_offset.get(tp)
            if read is not None and message.offset < read:
                self._read_offset[tp] = None
                self.forget_offsets((tp.topic, tp.partition))
                stream = self.app.stream_scorer  # type: ignore[attr-defined]
                if stream is not None:
                    stream.partitions.consumer_sent_back((tp.topic, tp.partition), read)
            yield tp, message

    def forget_offsets(self, tp: tuple[str, int]) -> None:
        """The log of ``tp`` started over (``Checkpoint.log_restarted``): what faust knows of
        its offsets is the old log's. faust acknowledges no offset below the last commit and
        commits none below it; forgotten, the new log's are acknowledged and committed."""
        key = TP(*tp)
        for offsets in (self._committed_offset, self._acked, self._acked_index, self._gap):
            offsets.pop(key, None)

    def hold_fetching(self, tp: tuple[str, int], held: bool) -> None:
        """Fetch nothing of ``tp`` while held: its novelty cache is being rebuilt, and a record
        of it would hold the agent, and every other partition's records behind it, until then."""
        self._thread.set_fetching(TP(*tp), not held)

    def take_refusal(self) -> None:
        """Report a permission the group coordinator was refused (ScorerConsumerThread)."""
        self._thread.take_refusal()

    def _to_message(self, tp: TP, record: Any) -> ConsumerMessage:
        """faust's message, which also keeps the record's timestamp as Kafka has it: integer
        milliseconds in ``timestamp_ms`` (None for a record without one), which
        :func:`worker.io.kafka.source_record` reads. faust's own ``timestamp`` is seconds in a
        float, exact only up to 2**53 ms: 2**53 + 1 came back as 2**53, and 2**63 - 1 as
        2**63, outside int64, which stopped the worker on every restart."""
        message = super()._to_message(tp, record)
        message.timestamp_ms = record.timestamp  # type: ignore[attr-defined]
        return message


class ScorerTransport(faust_aiokafka.Transport):
    Consumer = ScorerConsumer
