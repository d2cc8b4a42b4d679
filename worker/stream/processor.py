"""The record pipeline: take -> score -> publish -> acknowledge, several records at a time.

Each record runs as soon as it arrives: decode, embed on a model thread (a burst's records
embed side by side), then novelty and scoring in offset order within its partition, then
publish. The at-least-once steps are :mod:`worker.stream.checkpoint`'s; which records to score
and each partition's state, :mod:`worker.stream.partitions`'; what a failure means,
:class:`~worker.core.failures.FailurePolicy`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from worker.core.cache_store import StoreTopic
from worker.core.failures import FailurePolicy
from worker.core.output import with_scorer_header
from worker.core.records import RoutedRecord, SourceRecord
from worker.core.scorer import Prepared, Scorer
from worker.stream.checkpoint import Acknowledge, Checkpoint, RoutedPublisher
from worker.stream.observer import MetricsObserver
from worker.stream.partitions import LogReader, Partitions, TopicPartition
from worker.stream.timing import RecordTiming

log = logging.getLogger(__name__)

# Records up to this size are decoded on the event loop: a typical trace decodes and
# validates in ~0.06 ms, and the costliest 16 KiB inputs in under 1 ms (`python
# bench/hostile_inputs.py --max-bytes 16384`), where handing a record to the decoding thread
# and back costs ~1 ms while the model threads run. Larger ones go to the thread.
INLINE_DECODE_BYTES = 16_384


@dataclass(eq=False)  # identity: jobs are kept in sets
class _Job:
    """One record on its way through the pipeline."""

    record: SourceRecord
    timing: RecordTiming  # when it was received, and each stage's stamps since
    epoch: int  # the partition's epoch when it was taken; a later epoch means revoked
    acknowledge: Acknowledge | None
    scored: asyncio.Future[None]  # set once its novelty is in the cache (the next may go)
    after: asyncio.Future[None] | None  # the previous record's ``scored`` in the partition
    published: asyncio.Future[RoutedRecord | None] = field(init=False)
    settled: bool = field(init=False, default=False)  # its pipeline slot is given back

    def __post_init__(self) -> None:
        self.published = asyncio.get_running_loop().create_future()


class StreamScorer:
    """Scores delivered records of any partitions and publishes the results."""

    def __init__(
        self,
        scorer: Scorer,
        reader: LogReader,
        publisher: RoutedPublisher,
        max_in_flight_records: int = 16,
        failures: FailurePolicy | None = None,
        observer: MetricsObserver | None = None,
        timing_header: bool = False,
        store: StoreTopic | None = None,
    ) -> None:
        """``timing_header``: each output carries its stages in ``kp-timing-ms``
        (KP_TIMING_HEADER). ``store``: the cache store, where each output's cache entry goes
        and caches are restored from."""
        if max_in_flight_records < 1:
            raise ValueError("max_in_flight_records must be positive")
        self.scorer = scorer
        self.checkpoint = Checkpoint(publisher)
        self.failures = failures or FailurePolicy()
        self.observer = observer or MetricsObserver()
        self.partitions = Partitions(scorer, reader, self.observer, self._log_restarted, store)
        self.store = store
        self.timing_header = timing_header
        self._embedding: dict[bytes, asyncio.Future[np.ndarray]] = {}
        self._slots = asyncio.Semaphore(max_in_flight_records)
        # One thread decodes records over INLINE_DECODE_BYTES (bounded time per record, and
        # off the event loop so the consumer keeps heartbeating); each extra thread would
        # also grow its own malloc arena.
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="kp-decode")

    # -- assignment -------------------------------------------------------------------------
    def assigned(self, partitions: Sequence[TopicPartition]) -> None:
        """The consumer holds ``partitions`` now. Lost ones are forgotten; new ones are rebuilt
        at once, so the first record of each does not wait for its partition's rebuild."""
        self.checkpoint.assigned(partitions)
        self.checkpoint.spawn(self.partitions.prepare(self.partitions.assigned(partitions)))

    async def _log_restarted(self, tp: TopicPartition) -> None:
        """tp's log started over (:mod:`worker.stream.partitions` found it): its commits may go
        back once the old log's records in flight have settled, and its lag starts afresh."""
        await self.checkpoint.log_restarted(tp)
        self.observer.log_restarted(tp)

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
        received = received_at or [now] * len(delivered)
        acks = acknowledgements or [None] * len(delivered)
        by_partition: dict[TopicPartition, list[SourceRecord]] = defaultdict(list)
        extra: dict[tuple[TopicPartition, int], tuple[float, Acknowledge | None]] = {}
        for record, at, ack in zip(delivered, received, acks, strict=True):
            by_partition[record.topic_partition].append(record)
            extra[record.topic_partition, record.offset] = (at, ack)
        jobs: list[_Job] = []
        for tp, records in by_partition.items():
            admitted = await self.partitions.admit(tp, sorted(records, key=lambda r: r.offset))
            for record in admitted.redelivered:
                acknowledge = extra[tp, record.offset][1]
                if acknowledge is not None:
                    self.checkpoint.acknowledge_redelivered(tp, acknowledge)
            for record in admitted.to_score:  # one read from the log was not delivered
                at, acknowledge = extra.get((tp, record.offset), (now, None))
                jobs.append(self._job(record, at, acknowledge))
        for job in jobs:
            await self._slots.acquire()
            if self.checkpoint.closed:  # stopping: left unacknowledged, delivered again
                self._slots.release()
                job.scored.set_result(None)
                job.published.set_result(None)
                continue
            self.checkpoint.entered(job.record.topic_partition, job.published)
            self.observer.record_entered(self.checkpoint.in_flight())
            task = self.checkpoint.spawn(self._run(job))
            # A job cancelled before its first step never runs its own cleanup.
            task.add_done_callback(functools.partial(self._settle, job))
        return [job.published for job in jobs]

    async def process(
        self, delivered: Sequence[SourceRecord], received_at: Sequence[float] | None = None
    ) -> list[RoutedRecord]:
        """Submit and wait until all of it is published; raises what the pipeline raised."""
        results = await asyncio.gather(*await self.submit(delivered, received_at))
        return [routed for routed in results if routed is not None]

    async def close(self, timeout: float) -> None:
        """Drain on stop (step 4 of :mod:`worker.stream.checkpoint`), then :meth:`stop`. A
        cache rebuild under way is given up first: nothing waits on it but records of its
        partition, which are left to the partition's next owner."""
        self.partitions.stop()
        await self.checkpoint.close(timeout)
        await self.stop()

    async def stop(self) -> None:
        """Abandon what is in the pipeline: none of it was acknowledged, so it is redelivered."""
        self.failures.stopping()
        self.partitions.stop()
        await self.checkpoint.stop()
        self._decoder.shutdown(wait=False, cancel_futures=True)

    def _job(self, record: SourceRecord, received: float, acknowledge: Acknowledge | None) -> _Job:
        tp = record.topic_partition
        scored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        epoch = self.partitions.epoch(tp)
        timing = RecordTiming.received_at(received, record.timestamp_ms)
        return _Job(record, timing, epoch, acknowledge, scored, self.partitions.after(tp, scored))

    async def _run(self, job: _Job) -> None:
        tp = job.record.topic_partition
        stage = "process"
        timing = job.timing
        try:
            timing.decoding = time.monotonic()
            if len(job.record.value or b"") <= INLINE_DECODE_BYTES:
                (prepared,) = self.scorer.prepare([job.record])
            else:
                (prepared,) = await asyncio.get_running_loop().run_in_executor(
                    self._decoder, self.scorer.prepare, [job.record]
                )
            timing.decoded = time.monotonic()
            reused = await self._embed(prepared, timing)
            timing.vector = time.monotonic()
            if job.after is not None:
                await job.after
            if self.partitions.epoch(tp) != job.epoch:
                job.published.set_result(None)  # revoked meanwhile: its next owner scores it
                return
            timing.ordered = time.monotonic()
            routed, timing.novelty, timing.score = self.scorer.finish([prepared])
            if self.store is not None:
                routed = [self.scorer.with_cache_entry(routed[0], prepared)]
            job.scored.set_result(None)
            if self.timing_header:
                routed = [with_scorer_header(routed[0], timing.header())]
            timing.publishing = time.monotonic()
            stage = "publish"
            timing.acked = await self.checkpoint.publish(routed, job.acknowledge)
            stage = "done"
            # cache_size is None if the partition was revoked meanwhile.
            self.observer.record_published(routed[0], timing, reused, self.scorer.cache_size(tp))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("record published", extra=_published_fields(routed[0], timing.latency))
            job.published.set_result(routed[0])
        except BaseException as exc:
            # Nothing of this partition may be remembered: its records will be delivered again.
            # Its records still in the pipeline are dropped unpublished and unacknowledged.
            self.partitions.forget([tp])
            if not job.published.done():
                job.published.set_exception(exc)
                job.published.exception()  # retrieved here; process() re-raises it
            # Abandoned at a stop (cancelled): no failure to decide, and never acknowledged.
            if isinstance(exc, asyncio.CancelledError):
                raise
            if stage == "publish":
                self.failures.publish_failed(job.record, exc)
            else:
                self.failures.processing_failed(job.record, exc)
        finally:
            self._settle(job)

    def _settle(self, job: _Job, _task: object = None) -> None:
        """Give the job's slot back, once: it is published, dropped or abandoned."""
        if job.settled:
            return
        job.settled = True
        if not job.scored.done():
            job.scored.set_result(None)  # the partition's next record may go on
        if not job.published.done():
            job.published.set_result(None)  # abandoned unacknowledged: delivered again
        self.checkpoint.left(job.record.topic_partition, job.published)
        self.observer.record_left()
        self._slots.release()

    async def _embed(self, prepared: Prepared, timing: RecordTiming) -> bool:
        """The record's vector: reused from an identical text in the cache or in flight, else
        from the model on one of its threads (stamping ``timing.run``). Returns whether it
        was reused."""
        if not prepared.needs_vector or self.scorer.reuse_stored(prepared):
            return prepared.stored_row
        assert prepared.text_key is not None
        key = prepared.text_key
        running = self._embedding.get(key)
        if running is not None:
            prepared.vector = (await asyncio.shield(running))[0]
            return True
        future = asyncio.wrap_future(self.scorer.submit_embedding(prepared.text or "", timing.run))
        self._embedding[key] = future
        try:
            prepared.vector = (await future)[0]
        finally:
            self._embedding.pop(key, None)
        return False


def _published_fields(routed: RoutedRecord, latency_seconds: float) -> dict[str, object]:
    """Where a published record came from and what became of it, for its DEBUG line: offsets,
    decision, score or error kind, never the record's key, value or headers."""
    source = routed.source
    fields: dict[str, object] = {
        "topic": source.topic,
        "partition": source.partition,
        "offset": source.offset,
        "decision": routed.decision.value,
        "domain": routed.domain_label,
        "latency_ms": round(latency_seconds * 1000, 1),
    }
    if routed.breakdown is not None:
        fields["score"] = round(routed.breakdown.score, 4)
    if routed.error is not None:
        fields["error_kind"] = routed.error.kind
    return fields
