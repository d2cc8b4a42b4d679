"""Per-partition bookkeeping around the Scorer: what makes a Kafka run equal the pure function.

- Initialise a partition the first time this worker sees it (after start or assignment):
  rebuild its novelty cache from the records before the committed offset, and score any
  records between the committed offset and the first delivered one (records the consumer
  skipped) before the delivered batch.
- Skip redelivered records this worker already scored (their embeddings are in the cache).
- Detect gaps mid-stream the same way, so no input record goes unscored.
- Forget a partition on revocation; work finished for a partition revoked meanwhile is
  published (duplicates are allowed) but leaves no state behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from worker import metrics
from worker.pipeline import BatchResult, Decision, RoutedRecord, Scorer, SourceRecord
from worker.trace import Trace

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
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
    epoch: int
    next_offset: int  # the next offset this worker has not scored yet


class StreamScorer:
    """Scores batches of delivered records of any partitions and publishes the results."""

    def __init__(
        self,
        scorer: Scorer,
        reader: LogReader,
        publisher: RoutedPublisher,
        latency_budget_seconds: float = 0.1,
        score_chunk_records: int = 1,
    ) -> None:
        if score_chunk_records < 1:
            raise ValueError("score_chunk_records must be positive")
        self.scorer = scorer
        self.reader = reader
        self.publisher = publisher
        self.latency_budget_seconds = latency_budget_seconds
        self.score_chunk_records = score_chunk_records
        self._state: dict[TopicPartition, PartitionState] = {}
        self._epochs: dict[TopicPartition, int] = defaultdict(int)

    # -- assignment -------------------------------------------------------------------------
    def forget(self, partitions: Sequence[TopicPartition]) -> None:
        """Partitions revoked or (re)assigned: their state must be rebuilt before next use."""
        for tp in partitions:
            self._epochs[tp] += 1
            self._state.pop(tp, None)
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

    # -- processing -------------------------------------------------------------------------
    async def process(
        self, delivered: Sequence[SourceRecord], received_at: Sequence[float] | None = None
    ) -> list[RoutedRecord]:
        """Score and publish; returns what was published (after the broker acknowledged it)."""
        received = (
            list(received_at) if received_at is not None else [time.monotonic()] * len(delivered)
        )
        by_partition: dict[TopicPartition, list[tuple[SourceRecord, float]]] = defaultdict(list)
        for record, at in zip(delivered, received, strict=True):
            by_partition[record.topic_partition].append((record, at))

        todo: list[SourceRecord] = []
        todo_received: list[float] = []
        epochs: dict[TopicPartition, int] = {}
        for tp, items in by_partition.items():
            items.sort(key=lambda item: item[0].offset)
            epochs[tp] = self._epochs[tp]
            state = self._state.get(tp)
            first = items[0][0].offset
            if state is None:
                state = await self._initialise(tp, first)
            for record, at in items:
                if record.offset < state.next_offset:
                    continue  # redelivered: already scored, its embedding is in the cache
                if record.offset > state.next_offset:
                    gap = await self._read_gap(tp, state.next_offset, record.offset)
                    todo += gap
                    todo_received += [time.monotonic()] * len(gap)
                todo.append(record)
                todo_received.append(at)
                state.next_offset = record.offset + 1

        if not todo:
            self._discard_if_revoked(epochs)
            return []
        metrics.in_flight.inc(len(todo))
        routed: list[RoutedRecord] = []
        publishing: list[asyncio.Task[None]] = []
        try:
            # Chunks are scored in order (the same scores as one batch) and each chunk is
            # published while the next one is scored, so a trace waits for its own chunk's
            # embedding and ack rather than for the whole take.
            for start in range(0, len(todo), self.score_chunk_records):
                stop = start + self.score_chunk_records
                result = await asyncio.to_thread(self.scorer.score_batch, todo[start:stop])
                routed += result.routed
                publishing.append(
                    asyncio.create_task(self._publish(result, todo_received[start:stop]))
                )
            await asyncio.gather(*publishing)
        except BaseException:
            # Nothing of this batch may be remembered: it will be delivered again.
            for task in publishing:
                task.cancel()
            await asyncio.gather(*publishing, return_exceptions=True)
            self.forget(list(by_partition))
            raise
        finally:
            metrics.in_flight.dec(len(todo))
        self._discard_if_revoked(epochs)
        metrics.batch_size.observe(len(todo))
        self._observe_partitions(routed)
        return routed

    async def _publish(self, result: BatchResult, received: Sequence[float]) -> None:
        started = time.monotonic()
        await self.publisher.publish(result.routed)
        acked = time.monotonic()
        self._observe(result, received, acked - started, acked)

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

    def _discard_if_revoked(self, epochs: dict[TopicPartition, int]) -> None:
        for tp, epoch in epochs.items():
            if self._epochs[tp] != epoch:  # revoked while we worked: remember nothing
                self._state.pop(tp, None)
                self.scorer.caches.drop(tp)

    async def _initialise(self, tp: TopicPartition, first_delivered: int) -> PartitionState:
        topic, partition = tp
        committed = await self.reader.committed(topic, partition)
        start = first_delivered if committed is None else min(committed, first_delivered)
        self.scorer.caches.drop(tp)
        await self.rebuild_cache(tp, start)
        state = PartitionState(epoch=self._epochs[tp], next_offset=start)
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
        self, result: BatchResult, received: Sequence[float], publish_seconds: float, acked: float
    ) -> None:
        count = len(result.routed)
        stages = result.stages
        for stage, seconds in (
            ("decode", stages.decode),
            ("embed", stages.embed),
            ("novelty", stages.novelty),
            ("score", stages.score),
            ("publish", publish_seconds),
        ):
            histogram = metrics.stage_latency.labels(stage)
            for _ in range(count):
                histogram.observe(seconds)
        for routed, at in zip(result.routed, received, strict=True):
            latency = acked - at
            metrics.trace_latency.observe(latency)
            if latency > self.latency_budget_seconds:
                metrics.budget_breaches.inc()
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

    def _observe_partitions(self, routed: Sequence[RoutedRecord]) -> None:
        for (topic, partition), size in self.scorer.caches.sizes().items():
            metrics.cache_entries.labels(topic, str(partition)).set(size)
        now_ms = time.time() * 1000
        last: dict[TopicPartition, SourceRecord] = {}
        for record in routed:
            last[record.source.topic_partition] = record.source
        for (topic, partition), record in last.items():
            lag = max(0.0, (now_ms - record.timestamp_ms) / 1000) if record.timestamp_ms else 0.0
            metrics.consumer_lag_seconds.labels(topic, str(partition)).set(lag)
