"""Every metric update, in one place: processing code reports what happened to an observer and
never touches a metric itself. The default observer writes the Prometheus metrics of
:mod:`worker.stream.metrics`; tests may pass their own."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from worker.core.records import Decision, RoutedRecord
from worker.stream import metrics
from worker.stream.connectivity import BrokerHealth

TopicPartition = tuple[str, int]


class MetricsObserver:
    """Turns the worker's events into Prometheus metrics."""

    def __init__(
        self, latency_budget_seconds: float = 0.1, health: BrokerHealth | None = None
    ) -> None:
        self.latency_budget_seconds = latency_budget_seconds
        self.health = health or BrokerHealth()

    def watch_broker(self) -> None:
        """Make the connectivity gauges read this observer's broker health (at scrape time)."""
        metrics.broker_reachable.set_function(self.health.reachable_value)
        metrics.seconds_since_last_fetch.set_function(self.health.seconds_since_fetch)
        metrics.seconds_since_last_publish.set_function(self.health.seconds_since_publish)

    def broker_fetched(self) -> None:
        self.health.fetched()

    def broker_published(self) -> None:
        self.health.published()

    def broker_unreachable(self, error: BaseException | str) -> None:
        self.health.unreachable(error)

    def embedder_loaded(self, model_id: str | None, reason: str | None) -> None:
        metrics.embedder_up.set(1 if model_id else 0)
        metrics.embedder_info.info({"model": model_id or "", "reason": reason or ""})

    def record_entered(self, depth: int) -> None:
        """A record entered the pipeline, which now holds ``depth`` records."""
        metrics.in_flight.inc()
        metrics.batch_size.observe(depth)

    def record_left(self) -> None:
        metrics.in_flight.dec()

    def record_published(
        self,
        routed: RoutedRecord,
        stages: Sequence[tuple[str, float]],
        latency_seconds: float,
        age_seconds: float | None,
        reused_vector: bool,
        cache_size: int | None,
    ) -> None:
        """One record's output was acknowledged: its latencies, decision and score."""
        for stage, seconds in stages:
            metrics.stage_latency.labels(stage).observe(seconds)
        metrics.trace_latency.observe(latency_seconds)
        if latency_seconds > self.latency_budget_seconds:
            metrics.budget_breaches.inc()
        topic, partition = routed.source.topic, str(routed.source.partition)
        if age_seconds is not None:
            metrics.end_to_end_latency.observe(age_seconds)
            metrics.consumer_lag_seconds.labels(topic, partition).set(age_seconds)
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
            for name, value in (
                ("complexity", dims.complexity),
                ("novelty", dims.novelty),
                ("tool_diversity", dims.tool_diversity),
                ("outcome", dims.outcome),
            ):
                metrics.dimensions.labels(name).observe(value)

    def partition_forgotten(self, tp: TopicPartition) -> None:
        """A partition this worker lost stops being reported."""
        for gauge in (
            metrics.cache_entries,
            metrics.consumer_lag_records,
            metrics.consumer_lag_seconds,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(tp[0], str(tp[1]))

    def cache_rebuilt(self, seconds: float, records: int) -> None:
        metrics.cache_rebuild_seconds.observe(seconds)
        metrics.cache_rebuild_records.inc(records)

    def gap_read(self, records: int) -> None:
        metrics.gap_records.inc(records)

    def publish_retried(self) -> None:
        metrics.publish_retries.inc()

    def records_behind(self, tp: TopicPartition, records: int) -> None:
        metrics.consumer_lag_records.labels(tp[0], str(tp[1])).set(records)
