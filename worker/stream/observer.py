"""Every metric update, in one place: processing code reports what happened to an observer and
never touches a metric itself. The default observer writes the Prometheus metrics of
:mod:`worker.stream.metrics`; tests may pass their own. The state read at scrape time
(``broker``, ``permissions``, ``lag``, ``health``) is reported to those objects directly."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import fields

from worker.core.errors import ERROR_KINDS
from worker.core.records import Decision, RoutedRecord
from worker.stream import metrics
from worker.stream.connectivity import BrokerHealth
from worker.stream.health import WorkerHealth
from worker.stream.lag import PartitionLag
from worker.stream.permissions import Permissions
from worker.stream.timing import RecordTiming

TopicPartition = tuple[str, int]
# A file path in a reason (``/models/minilm/model.onnx``, ``models/x.onnx``): the port shows
# its file name only, since the path says where the operator keeps the files.
FILE_PATH = re.compile(r"[^\s'\"(),:]*/[^\s'\"(),:]*[^\s'\"(),:./]")


class MetricsObserver:
    """Turns the worker's events into Prometheus metrics."""

    def __init__(
        self,
        latency_budget_seconds: float = 0.1,
        broker: BrokerHealth | None = None,
        stall_seconds: float = 60.0,
    ) -> None:
        self.latency_budget_seconds = latency_budget_seconds
        self.broker = broker or BrokerHealth()
        self.lag = PartitionLag()
        self.permissions = Permissions()
        self.health = WorkerHealth(
            stall_seconds,
            records_waiting=lambda: self.lag.records_waiting(stall_seconds),
            broker=self.broker.readiness,
            permissions=self.permissions.readiness,
        )
        self._fetch_paused: set[TopicPartition] = set()

    def watch(self) -> None:
        """Make the scrape-time metrics (connectivity, lag) read this observer's state."""
        metrics.broker_reachable.set_function(self.broker.reachable_value)
        metrics.seconds_since_last_fetch.set_function(self.broker.seconds_since_fetch)
        metrics.seconds_since_last_publish.set_function(self.broker.seconds_since_publish)
        metrics.consumer_lag.source = self.lag.snapshot

    def configured(self, version: str, model_id: str | None) -> None:
        """The build, once the model is loaded, and every dead-letter kind and cache-vector
        origin at 0 (the thresholds are known before: :meth:`configured_thresholds`)."""
        metrics.build_info.info({"version": version, "model": model_id or ""})
        # Every kind at 0 from the start: a counter whose series is born at 1 shows no
        # increase, so the first internal error since a start would never raise its alert.
        for kind in ERROR_KINDS:
            metrics.dead_letters.labels(kind)
        for origin in ("store", "model"):
            metrics.cache_rebuild_records.labels(origin)

    def configured_thresholds(
        self, accept_threshold: float, domain_thresholds: dict[str, float]
    ) -> None:
        """The thresholds and budget, known from the settings before the broker answers: a
        worker waiting for it at start would otherwise export a threshold of 0, which
        KpScorerThresholdsDiffer reads as a replica that scores differently."""
        metrics.accept_threshold.set(accept_threshold)
        for domain, threshold in domain_thresholds.items():
            metrics.domain_accept_threshold.labels(domain).set(threshold)
        metrics.latency_budget.set(self.latency_budget_seconds)

    def fetching_paused(self, tp: TopicPartition, paused: bool) -> None:
        """Records fetched from ``tp`` wait for the pipeline (fetching it paused), or no longer.
        Told after every batch: the gauge is set only when the set of paused partitions changed."""
        if paused == (tp in self._fetch_paused):
            return
        if paused:
            self._fetch_paused.add(tp)
            metrics.fetch_pauses.inc()
        else:
            self._fetch_paused.discard(tp)
        metrics.fetch_paused.set(len(self._fetch_paused))

    def embedder_loaded(self, model_id: str | None, reason: str | None) -> None:
        """The scorer is ready, with a model (its id, a name) or without one, and why: the
        reason (which the log line has in full) with file names for paths."""
        reason = reason and FILE_PATH.sub(lambda path: path[0].rsplit("/", 1)[1], reason)
        metrics.embedder_up.set(1 if model_id else 0)
        metrics.embedder_info.info({"model": model_id or "", "reason": reason or ""})
        self.health.scorer_ready(model_id, reason)

    def partitions_assigned(self, partitions: Sequence[TopicPartition]) -> None:
        self.lag.assigned(partitions)
        # A new assignment starts every partition fetching in the Kafka client.
        self._fetch_paused.clear()
        metrics.fetch_paused.set(0)
        self.health.assignment_received()

    def record_entered(self, depth: int) -> None:
        """A record entered the pipeline, which now holds ``depth`` records."""
        metrics.in_flight.inc()
        metrics.batch_size.observe(depth)
        self.health.progress(in_pipeline=1)

    def record_left(self) -> None:
        metrics.in_flight.dec()
        self.health.progress(in_pipeline=-1)

    def record_published(
        self,
        routed: RoutedRecord,
        timing: RecordTiming,
        reused_vector: bool,
        cache_size: int | None,
    ) -> None:
        """One record's output was acknowledged: its latencies, decision and score."""
        for stage, seconds in timing.stages():
            metrics.stage_latency.labels(stage).observe(seconds)
        metrics.trace_latency.observe(timing.latency)
        if timing.latency > self.latency_budget_seconds:
            metrics.budget_breaches.inc()
        source = routed.source
        topic, partition = source.topic, str(source.partition)
        if self.lag.finished(source.topic_partition, source.offset, source.timestamp_ms):
            metrics.future_timestamps.inc()
        if source.timestamp_ms > 0:  # from its timestamp to now, its output acknowledged
            metrics.end_to_end_latency.observe(max(0.0, time.time() - source.timestamp_ms / 1000))
        if reused_vector:
            metrics.embeddings_reused.inc()
        if cache_size is not None:
            metrics.cache_entries.labels(topic, partition).set(cache_size)
        metrics.records.labels(routed.decision.value, routed.domain_label).inc()
        if routed.decision is Decision.DEAD_LETTER:
            assert routed.error is not None
            metrics.dead_letters.labels(routed.error.kind).inc()
        elif routed.breakdown is not None:
            breakdown = routed.breakdown
            metrics.scores.labels(routed.domain_label).observe(breakdown.score)
            metrics.novelty_sources.labels(breakdown.novelty_source.value).inc()
            dims = breakdown.dimensions
            for dimension in fields(dims):  # each labelled by its field's name
                metrics.dimensions.labels(dimension.name).observe(getattr(dims, dimension.name))

    def partition_forgotten(self, tp: TopicPartition) -> None:
        """A partition forgotten (lost, or failed) stops being reported until scored again."""
        self.lag.started(tp, None)
        with contextlib.suppress(KeyError):
            metrics.cache_entries.remove(tp[0], str(tp[1]))

    def cache_filled(self, tp: TopicPartition, entries: int | None) -> None:
        """A partition's cache holds ``entries`` vectors before its next record (rebuilt on
        assignment); None: it has none yet."""
        if entries is not None:
            metrics.cache_entries.labels(tp[0], str(tp[1])).set(entries)

    def cache_rebuilt(self, seconds: float, restored: int, embedded: int) -> None:
        """A partition's cache is ready: ``restored`` rows read from the store, ``embedded``."""
        metrics.cache_rebuild_seconds.observe(seconds)
        metrics.cache_rebuild_records.labels("store").inc(restored)
        metrics.cache_rebuild_records.labels("model").inc(embedded)

    def gap_read(self, records: int) -> None:
        metrics.gap_records.inc(records)

    def records_lost(self, records: int) -> None:
        """Records deleted from the input log (retention, delete-records) before scored."""
        metrics.records_lost.inc(records)

    def log_restarted(self, tp: TopicPartition) -> None:
        """tp's log started over: what was scored of the old one says nothing of the new."""
        metrics.log_restarts.inc()
        self.lag.restarted(tp)

    def publish_retried(self) -> None:
        metrics.publish_retries.inc()

    def transaction_committed(self, seconds: float) -> None:
        """Exactly-once: a partition's outputs and offset committed, in ``seconds``."""
        metrics.transactions.labels("committed").inc()
        metrics.transaction_commit_seconds.observe(seconds)

    def transaction_aborted(self) -> None:
        """Exactly-once: an open transaction given up (fenced, failed, or at a stop)."""
        metrics.transactions.labels("aborted").inc()
