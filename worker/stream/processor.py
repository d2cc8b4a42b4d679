"""Per-partition bookkeeping and the record pipeline: a Kafka run equals the pure function.

- Initialise a partition the first time this worker sees it (after start or assignment):
  rebuild its novelty cache from the records before the committed offset, and score any
  records between the committed offset and the first delivered one (records the consumer
  skipped) before the delivered ones.
- Skip redelivered records this worker already scored (their embeddings are in the cache).
- Detect gaps mid-stream the same way, so no input record goes unscored.
- Forget a partition on revocation; work finished for a partition revoked meanwhile is
  published (duplicates are allowed) but leaves no state behind.

Each record is a small pipeline of its own, started as soon as it arrives: decode, then its
embedding on one of the embedder's threads (so a burst's records embed side by side), then
novelty and scoring strictly in offset order within its partition, then publishing. A
record is acknowledged (its offset may be committed) only after the broker acknowledged its
output. Bookkeeping (reads of the log, cache rebuilds) runs one call at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.core.scorer import Prepared, Scorer
from worker.core.trace import Trace
from worker.stream import metrics

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Acknowledge = Callable[[], Awaitable[object]]
# Rebuild reads back in steps of this many records beyond the cache capacity to find
# enough valid traces when some preceding records were dead-lettered.
REBUILD_EXTRA_STEP = 256


class LogReader(Protocol):
    async def committed(self, topic: str, partition: int) -> int | None: ...
    async def first_offset(self, topic: str, partition: int) -> int: ...
    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[SourceRecord]: ...


class RoutedPublisher(Protocol):
    async def publish(self, routed: Sequence[RoutedRecord]) -> None: ...


@dataclass
class PartitionState:
    next_offset: int  # the next offset this worker has not scored yet


@dataclass(eq=False)  # identity: jobs are kept in sets
class _Job:
    """One record on its way through the pipeline."""

    record: SourceRecord
    received: float  # monotonic time the worker received it
    epoch: int  # the partition's epoch when it was taken; a later epoch means revoked
    acknowledge: Acknowledge | None
    scored: asyncio.Future[None]  # set once its novelty is in the cache (next may go)
    after: asyncio.Future[None] | None  # the previous record's ``scored`` in the partition
    published: asyncio.Future[RoutedRecord | None] = field(init=False)

    def __post_init__(self) -> None:
        self.published = asyncio.get_running_loop().create_future()


class StreamScorer:
    """Scores delivered records of any partitions and publishes the results."""

    def __init__(
        self,
        scorer: Scorer,
        reader: LogReader,
        publisher: RoutedPublisher,
        latency_budget_seconds: float = 0.1,
        max_in_flight_records: int = 16,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        if max_in_flight_records < 1:
            raise ValueError("max_in_flight_records must be positive")
        self.scorer = scorer
        self.reader = reader
        self.publisher = publisher
        self.latency_budget_seconds = latency_budget_seconds
        self.on_failure = on_failure
        self._state: dict[TopicPartition, PartitionState] = {}
        self._epochs: dict[TopicPartition, int] = defaultdict(int)
        self._last_scored: dict[TopicPartition, asyncio.Future[None]] = {}
        self._in_flight: dict[TopicPartition, set[_Job]] = defaultdict(set)
        self._embedding: dict[bytes, asyncio.Future[np.ndarray]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bookkeeping = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_in_flight_records)
        self._in_flight_count = 0
        # One thread decodes (bounded time per record, and off the event loop so the consumer
        # keeps heartbeating); each extra thread would also grow its own malloc arena.
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="kp-decode")

    # -- assignment -------------------------------------------------------------------------
    def forget(self, partitions: Sequence[TopicPartition]) -> None:
        """Partitions revoked or (re)assigned: their state must be rebuilt before next use.

        Records of these partitions still in the pipeline are dropped unpublished and
        unacknowledged (the partition's next owner scores them) unless already scored.
        """
        for tp in partitions:
            self._epochs[tp] += 1
            self._state.pop(tp, None)
            self._last_scored.pop(tp, None)
            self.scorer.caches.drop(tp)
            for gauge in (
                metrics.cache_entries,
                metrics.consumer_lag_records,
                metrics.consumer_lag_seconds,
            ):
                with contextlib.suppress(KeyError):  # a lost partition stops being reported
                    gauge.remove(tp[0], str(tp[1]))

    def owned(self) -> list[TopicPartition]:
        return list(self._state)

    def prepare_soon(self, partitions: Sequence[TopicPartition]) -> None:
        """Rebuild newly assigned partitions' caches now, so the first record of each does
        not wait for its partition's rebuild (records that arrive meanwhile wait for it)."""
        self._spawn(self._prepare(partitions))

    async def _prepare(self, partitions: Sequence[TopicPartition]) -> None:
        async with self._bookkeeping:
            for tp in partitions:
                if tp in self._state:
                    continue
                try:
                    await self._initialise(tp, None)
                except Exception as exc:  # the partition's first record will try again
                    log.warning(
                        "could not prepare partition ahead of its records",
                        extra={"topic": tp[0], "partition": tp[1], "error": repr(exc)[:300]},
                    )

    # -- processing -------------------------------------------------------------------------
    async def submit(
        self,
        delivered: Sequence[SourceRecord],
        received_at: Sequence[float] | None = None,
        acknowledgements: Sequence[Acknowledge | None] | None = None,
    ) -> list[asyncio.Future[RoutedRecord | None]]:
        """Start scoring delivered records; returns once each is on its way.

        Waits while ``max_in_flight_records`` are in the pipeline (back-pressure on the
        consumer). A record's acknowledgement runs after its output is published; a
        redelivered record's, after what this worker still has in flight for its partition.
        The futures give each record's routed output once published (None if dropped).
        """
        now = time.monotonic()
        received = list(received_at) if received_at is not None else [now] * len(delivered)
        acks = list(acknowledgements) if acknowledgements is not None else [None] * len(delivered)
        async with self._bookkeeping:
            jobs, redelivered = await self._plan(list(zip(delivered, received, acks, strict=True)))
        for acknowledge, tp in redelivered:
            self._spawn(self._acknowledge_after_in_flight(tp, acknowledge))
        for job in jobs:
            await self._slots.acquire()
            self._in_flight_count += 1
            metrics.in_flight.inc()
            metrics.batch_size.observe(self._in_flight_count)
            self._in_flight[job.record.topic_partition].add(job)
            self._spawn(self._run(job))
        return [job.published for job in jobs]

    async def process(
        self, delivered: Sequence[SourceRecord], received_at: Sequence[float] | None = None
    ) -> list[RoutedRecord]:
        """Submit and wait until all of it is published; raises what the pipeline raised."""
        pending = await self.submit(delivered, received_at)
        results = await asyncio.gather(*pending)
        return [routed for routed in results if routed is not None]

    async def drain(self) -> None:
        """Wait for every record in the pipeline to be published (or dropped)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        """Abandon what is in the pipeline: none of it was acknowledged, so it is redelivered."""
        self.on_failure = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._decoder.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _plan(
        self, items: list[tuple[SourceRecord, float, Acknowledge | None]]
    ) -> tuple[list[_Job], list[tuple[Acknowledge, TopicPartition]]]:
        """Jobs for the records not scored yet (gaps read from the log included), in offset
        order per partition; and the acknowledgements of redelivered records."""
        by_partition: dict[TopicPartition, list[tuple[SourceRecord, float, Acknowledge | None]]]
        by_partition = defaultdict(list)
        for item in items:
            by_partition[item[0].topic_partition].append(item)
        jobs: list[_Job] = []
        redelivered: list[tuple[Acknowledge, TopicPartition]] = []
        for tp, records in by_partition.items():
            records.sort(key=lambda item: item[0].offset)
            state = self._state.get(tp)
            if state is None:
                state = await self._initialise(tp, records[0][0].offset)
            for record, at, acknowledge in records:
                if record.offset < state.next_offset:
                    # Redelivered: already scored, its embedding is in the cache.
                    if acknowledge is not None:
                        redelivered.append((acknowledge, tp))
                    continue
                if record.offset > state.next_offset:
                    gap = await self._read_gap(tp, state.next_offset, record.offset)
                    jobs += [self._job(missed, time.monotonic(), None) for missed in gap]
                jobs.append(self._job(record, at, acknowledge))
                state.next_offset = record.offset + 1
        return jobs, redelivered

    def _job(self, record: SourceRecord, received: float, acknowledge: Acknowledge | None) -> _Job:
        tp = record.topic_partition
        scored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job = _Job(
            record, received, self._epochs[tp], acknowledge, scored, self._last_scored.get(tp)
        )
        self._last_scored[tp] = scored
        return job

    async def _run(self, job: _Job) -> None:
        tp = job.record.topic_partition
        try:
            started = time.monotonic()
            (prepared,) = await asyncio.get_running_loop().run_in_executor(
                self._decoder, self.scorer.prepare, [job.record]
            )
            decoded = time.monotonic()
            reused = await self._embed(prepared)
            embedded = time.monotonic()
            if job.after is not None:
                await job.after
            if self._epochs[tp] != job.epoch:
                job.published.set_result(None)  # revoked meanwhile: its next owner scores it
                return
            routed, novelty_seconds, score_seconds = self.scorer.finish([prepared])
            job.scored.set_result(None)
            publishing = time.monotonic()
            await self.publisher.publish(routed)
            acked = time.monotonic()
            if job.acknowledge is not None:
                await job.acknowledge()
            self._observe(
                job,
                routed[0],
                (
                    ("decode", decoded - started),
                    ("embed", embedded - decoded),
                    ("novelty", novelty_seconds),
                    ("score", score_seconds),
                    ("publish", acked - publishing),
                ),
                acked,
                reused,
            )
            job.published.set_result(routed[0])
        except BaseException as exc:
            # Nothing of this partition may be remembered: its records will be delivered again.
            self.forget([tp])
            if not job.published.done():
                job.published.set_exception(exc)
                job.published.exception()  # retrieved here; process() re-raises it
            if self.on_failure is not None and not isinstance(exc, asyncio.CancelledError):
                log.error(
                    "scoring or publishing failed; stopping",
                    extra={"topic": tp[0], "partition": tp[1], "offset": job.record.offset},
                    exc_info=exc,
                )
                self.on_failure(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if not job.scored.done():
                job.scored.set_result(None)  # the partition's next record may go on
            self._in_flight[tp].discard(job)
            self._in_flight_count -= 1
            metrics.in_flight.dec()
            self._slots.release()

    async def _embed(self, prepared: Prepared) -> bool:
        """The record's vector: reused from an identical text in the cache or in flight, else
        from the model on one of its threads. Returns whether it was reused."""
        if not prepared.needs_vector or self.scorer.reuse_stored(prepared):
            return prepared.stored_row
        assert prepared.text_key is not None and self.scorer.embedder is not None
        key = prepared.text_key
        running = self._embedding.get(key)
        if running is not None:
            prepared.vector = (await asyncio.shield(running))[0]
            return True
        future = asyncio.wrap_future(self.scorer.embedder.submit([prepared.text or ""]))
        self._embedding[key] = future
        try:
            prepared.vector = (await future)[0]
        finally:
            self._embedding.pop(key, None)
        return False

    async def _acknowledge_after_in_flight(
        self, tp: TopicPartition, acknowledge: Acknowledge
    ) -> None:
        """A redelivered record's offset may be committed once the first delivery is published."""
        waiting = [job.published for job in self._in_flight[tp]]
        await asyncio.gather(*waiting, return_exceptions=True)
        await acknowledge()

    async def _read_gap(self, tp: TopicPartition, start: int, end: int) -> list[SourceRecord]:
        """Records the consumer never delivered: read them from the log so none goes unscored."""
        gap = await self.reader.read(tp[0], tp[1], start, end)
        metrics.gap_records.inc(len(gap))
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

    async def _initialise(self, tp: TopicPartition, first_delivered: int | None) -> PartitionState:
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
        # Records of an earlier ownership still in the pipeline must not touch the new cache.
        self._epochs[tp] += 1
        self._last_scored.pop(tp, None)
        self.scorer.caches.drop(tp)
        await self.rebuild_cache(tp, start)
        state = PartitionState(next_offset=start)
        self._state[tp] = state
        return state

    async def rebuild_cache(self, tp: TopicPartition, before: int) -> int:
        """Fill tp's cache from the records preceding ``before``, exactly as live scoring did.

        The cache held the last ``capacity`` valid traces before ``before``; dead-lettered
        records never entered it, so the read goes back until it has that many valid ones.
        """
        if self.scorer.embedder is None:
            return 0
        topic, partition = tp
        began = time.monotonic()
        low = await self.reader.first_offset(topic, partition)
        capacity = self.scorer.caches.capacity
        end, start = before, max(low, before - capacity)
        traces: list[tuple[SourceRecord, Trace]] = []
        while end > start:
            chunk = await self.reader.read(topic, partition, start, end)
            traces = self.scorer.valid_traces(chunk) + traces
            if len(traces) >= capacity or start <= low:
                break
            end, start = start, max(low, start - (capacity - len(traces)) - REBUILD_EXTRA_STEP)
        traces = traces[-capacity:]
        if not traces:
            return 0
        expire_before_ms = None
        if self.scorer.caches.ttl_ms is not None:
            following = await self.reader.read(topic, partition, before, before + 1)
            if following:
                expire_before_ms = following[0].timestamp_ms - self.scorer.caches.ttl_ms
        embedded = await asyncio.to_thread(self.scorer.warm_partition, tp, traces, expire_before_ms)
        metrics.cache_rebuild_seconds.observe(time.monotonic() - began)
        metrics.cache_rebuild_records.inc(embedded)
        log.info(
            "rebuilt novelty cache",
            extra={
                "topic": topic,
                "partition": partition,
                "records": embedded,
                "seconds": round(time.monotonic() - began, 3),
            },
        )
        return embedded

    def _observe(
        self,
        job: _Job,
        routed: RoutedRecord,
        stages: Sequence[tuple[str, float]],
        acked: float,
        reused: bool,
    ) -> None:
        for stage, seconds in stages:
            metrics.stage_latency.labels(stage).observe(seconds)
        latency = acked - job.received
        metrics.trace_latency.observe(latency)
        if latency > self.latency_budget_seconds:
            metrics.budget_breaches.inc()
        record = routed.source
        now_ms = time.time() * 1000
        if record.timestamp_ms:
            age = max(0.0, (now_ms - record.timestamp_ms) / 1000)
            metrics.end_to_end_latency.observe(age)
            metrics.consumer_lag_seconds.labels(record.topic, str(record.partition)).set(age)
        if reused:
            metrics.embeddings_reused.inc()
        cache_size = self.scorer.caches.sizes().get(record.topic_partition)
        if cache_size is not None:  # None: revoked meanwhile, no longer reported
            metrics.cache_entries.labels(record.topic, str(record.partition)).set(cache_size)
        metrics.records.labels(routed.decision.value, routed.domain_label).inc()
        if routed.decision is Decision.DEAD_LETTER:
            assert routed.error is not None
            metrics.dead_letters.labels(routed.error.kind).inc()
        elif routed.breakdown is not None:
            breakdown = routed.breakdown
            metrics.scores.labels(routed.domain_label).observe(breakdown.score)
            metrics.novelty_sources.labels(breakdown.novelty_source.value).inc()
            dims = breakdown.dimensions
            for name, value in (
                ("complexity", dims.complexity),
                ("novelty", dims.novelty),
                ("tool_diversity", dims.tool_diversity),
                ("outcome", dims.outcome),
            ):
                metrics.dimensions.labels(name).observe(value)
