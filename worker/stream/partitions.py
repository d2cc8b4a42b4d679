"""The partitions this worker owns, each with one owner of its state: novelty cache, next
offset to score, epoch and the order its records are scored in.

- A partition is initialised the first time it is needed (on assignment, or its first record):
  its novelty cache is rebuilt from the records before the committed offset, exactly as live
  scoring left it.
- Records the consumer skipped (between the next expected offset and a delivered one) are
  read from the log, so none goes unscored; redelivered records are recognised. Skipped records
  the log no longer holds (deleted by retention or delete-records before they were scored) are
  counted as lost, with a warning line.
- A log that went back below the offset the worker had reached (the topic deleted and
  recreated, the log truncated) is noticed when a record below that offset arrives and the log
  now ends below it too, which a redelivery never does: the partition starts over on the new
  log (warning line, cache rebuilt from the new log only, commits allowed to go back).
- Forgetting a partition (revocation, failure) bumps its epoch: work of an older epoch still
  in the pipeline leaves no state behind, and a rebuild under way for it is given up, as it is
  when the worker stops: its records are left to the partition's next owner.
- A rebuild takes each trace's row from the cache store (:mod:`worker.core.cache_store`)
  where it finds a sound one, and embeds the others. Partitions are initialised side by side,
  each under its own lock: none waits for another's rebuild (reads of the log take turns).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from worker.core.cache_store import StoreTopic
from worker.core.records import SourceRecord
from worker.core.scorer import Scorer
from worker.core.trace import Trace
from worker.stream.observer import MetricsObserver

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# Rebuild reads back in steps of this many records beyond the cache capacity to find
# enough valid traces when some preceding records were dead-lettered.
REBUILD_EXTRA_STEP = 256
# A restore reads this many times the cache capacity from the end of the store's partition:
# beyond its partition's last ``capacity`` entries, room for entries of records scored again
# (redelivered, or after the committed offset by a previous owner).
STORE_READ_CAPACITIES = 2
# A rebuild embeds this many traces at a time and gives up between two such steps once its
# partition is revoked or the worker stops, so that neither waits for the whole cache (1,000
# traces took 6 s on 2 cores): a step is ~0.5 s of model runs at ~60 texts/s.
REBUILD_STEP_TRACES = 32


class LogReader(Protocol):
    async def committed(self, topic: str, partition: int) -> int | None: ...
    async def first_offset(self, topic: str, partition: int) -> int: ...
    async def log_end(self, topic: str, partition: int, near: int) -> int: ...
    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[SourceRecord]: ...
    async def partitions(self, topic: str) -> list[int]: ...


@dataclass
class Admitted:
    """What to do with delivered records of one partition, in offset order."""

    to_score: list[SourceRecord] = field(default_factory=list)  # skipped ones read from the log
    redelivered: list[SourceRecord] = field(default_factory=list)


LogRestarted = Callable[[TopicPartition], Awaitable[None]]


class Partitions:
    """State of every owned partition; reads of the log and rebuilds run one at a time."""

    def __init__(
        self,
        scorer: Scorer,
        reader: LogReader,
        observer: MetricsObserver,
        log_restarted: LogRestarted,
        store: StoreTopic | None = None,
    ) -> None:
        """``log_restarted`` is awaited when a partition's log started over, once its state is
        forgotten and before the new log's records are taken. ``store``: where rebuilds read
        stored cache entries (None: every trace is embedded)."""
        self.scorer = scorer
        self.reader = reader
        self.observer = observer
        self.log_restarted = log_restarted
        self.store = store
        self._next_offset: dict[TopicPartition, int] = {}
        # The next offset each partition had reached, kept when it is forgotten: a log found
        # below it later went back. And where the consumer was sent back from to its log start.
        self._reached: dict[TopicPartition, int] = {}
        self._sent_back: dict[TopicPartition, int] = {}
        # The offset reached that the log was last found to hold: the records redelivered
        # after a rebalance (each its own admit) ask the log's end once, not each.
        self._held: dict[TopicPartition, int] = {}
        self._epochs: dict[TopicPartition, int] = defaultdict(int)
        self._last_scored: dict[TopicPartition, asyncio.Future[None]] = {}
        self._assigned: set[TopicPartition] = set()
        self._locks: defaultdict[TopicPartition, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._stopping = False
        # Set by the app: stops (True) or resumes the consumer's fetches of a partition.
        self.hold_fetching: Callable[[TopicPartition, bool], None] = lambda tp, held: None

    def stop(self) -> None:
        """The worker is stopping: a rebuild under way is given up, and no other begins (the
        partitions' records are left, unacknowledged, to their next owners)."""
        self._stopping = True

    def _given_up(self, tp: TopicPartition, epoch: int) -> bool:
        """Whether work on tp begun at ``epoch`` is to be dropped: revoked since, or stopping."""
        return self._stopping or self._epochs[tp] != epoch

    def assigned(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """The consumer now holds ``partitions``: forget the lost ones; returns the new ones.

        A partition kept across a rebalance keeps its cache: if another worker scored some of
        its records meanwhile, they show up as a gap and are scored again from the log.
        """
        now = set(partitions)
        self.forget(sorted(self._assigned - now))
        gained = sorted(now - self._assigned)
        self._assigned = now
        self.observer.partitions_assigned(sorted(now))
        return gained

    def consumer_sent_back(self, tp: TopicPartition, read: int) -> None:
        """The consumer went back to tp's log start after delivering ``read``, which it does
        only when its position has passed the log's end: the log went back."""
        self._sent_back[tp] = read + 1

    def owned(self) -> list[TopicPartition]:
        """The partitions with state: initialised, and neither revoked nor failed since."""
        return list(self._next_offset)

    def held(self) -> list[TopicPartition]:
        """The partitions the consumer holds, those whose cache is being rebuilt included."""
        return sorted(self._assigned)

    def epoch(self, tp: TopicPartition) -> int:
        return self._epochs[tp]

    def forget(self, partitions: Sequence[TopicPartition]) -> None:
        """Revoked, reassigned or failed: state must be rebuilt before the next use."""
        for tp in partitions:
            self._epochs[tp] += 1
            self._next_offset.pop(tp, None)
            self._last_scored.pop(tp, None)
            self.scorer.drop_partition(tp)
            self.observer.partition_forgotten(tp)

    def after(
        self, tp: TopicPartition, scored: asyncio.Future[None]
    ) -> asyncio.Future[None] | None:
        """Queue a record's scoring behind the partition's previous one; returns that one."""
        previous = self._last_scored.get(tp)
        self._last_scored[tp] = scored
        return previous

    async def prepare(self, partitions: Sequence[TopicPartition]) -> None:
        """Initialise newly assigned partitions side by side before their records arrive (a
        failure here is retried by the partition's first record)."""
        await asyncio.gather(*(self._prepare(tp) for tp in partitions))

    async def _prepare(self, tp: TopicPartition) -> None:
        """Initialise tp with its fetches held: none of its records reaches the pipeline (where
        it would wait, and the records behind it with it) before its cache is ready."""
        async with self._locks[tp]:
            # Stopping, initialised by a record meanwhile, or revoked since.
            if self._stopping or tp in self._next_offset or tp not in self._assigned:
                return
            self.hold_fetching(tp, True)
            try:
                await self._initialise(tp, None)
            except Exception as exc:
                log.warning(
                    "could not prepare partition ahead of its records",
                    extra={"topic": tp[0], "partition": tp[1], "error": repr(exc)[:300]},
                )
            finally:
                self.hold_fetching(tp, False)

    async def admit(self, tp: TopicPartition, delivered: Sequence[SourceRecord]) -> Admitted:
        """Which of a partition's delivered records to score (with skipped ones from the log
        before them) and which were scored already. ``delivered`` is in offset order."""
        async with self._locks[tp]:
            first = delivered[0].offset
            if tp in self._next_offset:
                await self._started_over(tp, first)  # forgotten if so: initialised anew below
            if tp not in self._next_offset and not self._stopping:
                await self._initialise(tp, first)
            admitted = Admitted()
            if tp not in self._next_offset:
                return admitted  # given up during its rebuild: its next owner scores these
            for record in delivered:
                expected = self._next_offset[tp]
                if record.offset < expected:
                    admitted.redelivered.append(record)  # its embedding is in the cache
                    continue
                if record.offset > expected:
                    admitted.to_score += await self._read_gap(tp, expected, record.offset)
                admitted.to_score.append(record)
                self._next_offset[tp] = self._reached[tp] = record.offset + 1
            return admitted

    async def _started_over(self, tp: TopicPartition, offset: int) -> bool:
        """Whether tp's log went back below the offset this worker had reached (its topic
        recreated, its log truncated), ``offset`` being where reading it goes on: then the
        partition is forgotten, with a warning line, and :attr:`log_restarted` awaited.

        Below that offset is a redelivery, unless the log now ends below it too; the log's end
        is asked only then (the consumer sent back to the log's start needs no asking).
        """
        sent_back = self._sent_back.pop(tp, None)
        reached = self._reached.get(tp, sent_back)
        if reached is None or offset >= reached:
            return False
        if sent_back is None and self._held.get(tp) == reached:
            return False
        topic, partition = tp
        end = await self.reader.log_end(topic, partition, reached - 1)
        if end >= reached and sent_back is None:
            self._held[tp] = reached
            return False
        self._reached.pop(tp, None)
        log.warning(
            "input partition's log went back (topic recreated or log truncated); "
            "scoring it again from the new log",
            extra={"topic": topic, "partition": partition, "expected": reached, "log_end": end},
        )
        self.forget([tp])
        await self.log_restarted(tp)
        return True

    async def _read_gap(self, tp: TopicPartition, start: int, end: int) -> list[SourceRecord]:
        """Records the consumer never delivered: read them from the log so none goes unscored.
        Those the log no longer holds (below its start) are lost, and counted."""
        gap = await self.reader.read(tp[0], tp[1], start, end)
        if len(gap) < end - start:
            # Holes above the log's start are a transaction's marker, a producer's aborted
            # records (read_committed) or records compacted away: none is a record to score.
            first = await self.reader.first_offset(tp[0], tp[1])
            lost_until = min(first, gap[0].offset if gap else end)
            if lost_until > start:
                self.observer.records_lost(lost_until - start)
                log.warning(
                    "records deleted from the input log before they were scored",
                    extra={
                        "topic": tp[0],
                        "partition": tp[1],
                        "start": start,
                        "end": lost_until,
                        "records": lost_until - start,
                    },
                )
        if not gap:
            return gap
        self.observer.gap_read(len(gap))
        log.warning(
            "consumer skipped records; scoring them from the log",
            extra={
                "topic": tp[0],
                "partition": tp[1],
                "start": start,
                "end": end,
                "records": len(gap),
            },
        )
        return gap

    async def _initialise(self, tp: TopicPartition, first_delivered: int | None) -> None:
        """Start from the committed offset (or, with none, the first delivered record or the
        log's start: where a new group's consumer starts too)."""
        topic, partition = tp
        committed = await self.reader.committed(topic, partition)
        if committed is not None:
            start = committed if first_delivered is None else min(committed, first_delivered)
        elif first_delivered is not None:
            start = first_delivered
        else:
            start = await self.reader.first_offset(topic, partition)
        if await self._started_over(tp, start):
            # The committed offset may be the old log's: the new one is read from its start, or
            # from where the consumer went back to.
            if first_delivered is None:
                start = await self.reader.first_offset(topic, partition)
            else:
                start = first_delivered
        # Records of an earlier ownership still in the pipeline must not touch the new cache.
        self.forget([tp])
        epoch = self._epochs[tp]
        self.observer.lag.started(tp, start)  # lag is counted from here, the rebuild included
        self.observer.health.progress(rebuilding=1)
        try:
            await self.rebuild_cache(tp, start)
        finally:
            self.observer.health.progress(rebuilding=-1)
        if self._given_up(tp, epoch):  # nothing of it is kept
            self.scorer.drop_partition(tp)
            return
        self._next_offset[tp] = self._reached[tp] = start
        self.observer.cache_filled(tp, self.scorer.cache_size(tp))

    async def rebuild_cache(self, tp: TopicPartition, before: int) -> int:
        """Fill tp's cache from the records preceding ``before``, exactly as live scoring did.

        The cache held the last ``capacity`` valid traces before ``before``; dead-lettered
        records never entered it, so the read goes back until it has that many valid ones.
        Each trace's row comes from the cache store if it holds a sound one, else from the
        model. Returns the traces added; fewer than that when given up (revoked, or stopping).
        """
        if not self.scorer.has_embedder:
            return 0
        topic, partition = tp
        epoch = self._epochs[tp]
        began = time.monotonic()
        low = await self.reader.first_offset(topic, partition)
        capacity = self.scorer.cache_capacity
        end, start = before, max(low, before - capacity)
        traces: list[tuple[SourceRecord, Trace]] = []
        while end > start:
            chunk = await self.reader.read(topic, partition, start, end)
            traces = self.scorer.valid_traces(chunk) + traces
            if len(traces) >= capacity or start <= low:
                break
            end, start = start, max(low, start - (capacity - len(traces)) - REBUILD_EXTRA_STEP)
        traces = traces[-capacity:]
        stored = await self._stored_rows(tp) if traces else {}
        restored = embedded = 0
        for first in range(0, len(traces), REBUILD_STEP_TRACES):
            if self._given_up(tp, epoch):
                log.info(
                    "novelty cache rebuild given up",
                    extra={
                        "topic": topic,
                        "partition": partition,
                        "records": restored + embedded,
                        "reason": "stopping" if self._stopping else "revoked",
                    },
                )
                return restored + embedded
            step = traces[first : first + REBUILD_STEP_TRACES]
            from_store, from_model = await asyncio.to_thread(
                self.scorer.warm_partition, tp, step, stored
            )
            restored, embedded = restored + from_store, embedded + from_model
        if not traces:
            return 0
        seconds = time.monotonic() - began
        self.observer.cache_rebuilt(seconds, restored, embedded)
        log.info(
            "rebuilt novelty cache",
            extra={
                "topic": topic,
                "partition": partition,
                "records": restored + embedded,
                "restored": restored,
                "embedded": embedded,
                "seconds": round(seconds, 3),
            },
        )
        return restored + embedded

    async def _stored_rows(self, tp: TopicPartition) -> dict[bytes, np.ndarray]:
        """The sound rows at the end of tp's partition of the cache store, by text key; none
        when there is no store, or it cannot be read (warning line): the traces are embedded."""
        store = self.store
        if store is None:
            return {}
        partition = store.partition_of(tp[1])
        try:
            if partition not in await self.reader.partitions(store.name):
                raise LookupError(f"topic {store.name!r} has no partition {partition}")
            low = await self.reader.first_offset(store.name, partition)
            end = await self.reader.log_end(store.name, partition, low)
            span = STORE_READ_CAPACITIES * self.scorer.cache_capacity + REBUILD_EXTRA_STEP
            records = await self.reader.read(store.name, partition, max(low, end - span), end)
        except Exception as exc:
            log.warning(
                "novelty cache store unreadable; embedding the partition's cache instead",
                extra={"topic": tp[0], "partition": tp[1], "error": repr(exc)[:300]},
            )
            return {}
        return self.scorer.stored_rows(records)
