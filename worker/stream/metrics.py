"""Every Prometheus metric of the worker, defined once, in base units.

Latency buckets are dense around the 100 ms budget with a boundary exactly at 0.1 s, so
"within budget" is an exact bucket ratio. Domain labels are bounded by ``Scorer.domain_label``
(configured profiles plus ``other``); partition labels by the topic's partition count.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.stream.lag import Lag

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
# Time in the topic comes on top for end-to-end latency: a backlog can be minutes old.
END_TO_END_BUCKETS = (*LATENCY_BUCKETS, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
SCORE_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
REBUILD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

trace_latency = Histogram(
    "kp_trace_latency_seconds",
    "Per trace: from receipt by the worker to the broker's publish acknowledgement",
    buckets=LATENCY_BUCKETS,
)
end_to_end_latency = Histogram(
    "kp_end_to_end_latency_seconds",
    "Per trace: from its record timestamp (producer or broker time) to the broker's "
    "acknowledgement of its output; includes time waiting in the topic",
    buckets=END_TO_END_BUCKETS,
)
stage_latency = Histogram(
    "kp_stage_latency_seconds",
    "Per trace: time in each stage, waits apart from work: fetch (record timestamp to "
    "receipt), decode_wait, decode, embed_wait (for a model thread), tokenize, embed (the "
    "model run), order_wait (for the partition's earlier records), novelty, score, publish",
    ["stage"],  # worker.stream.timing.STAGES
    buckets=LATENCY_BUCKETS,
)
budget_breaches = Counter(
    "kp_budget_breaches_total", "Traces whose latency exceeded the per-trace budget"
)
records = Counter(
    "kp_records_total", "Input records by routing decision and domain", ["decision", "domain"]
)
dead_letters = Counter("kp_dead_letters_total", "Dead-lettered records by error kind", ["kind"])
scores = Histogram(
    "kp_score", "Final quality score of scored traces", ["domain"], buckets=SCORE_BUCKETS
)
dimensions = Histogram(
    "kp_score_dimension",
    "Value of each score dimension of scored traces",
    ["dimension"],
    buckets=SCORE_BUCKETS,
)
novelty_sources = Counter(
    "kp_novelty_source_total", "Scored traces by where their novelty came from", ["source"]
)
batch_size = Histogram(
    "kp_batch_size",
    "Records in the scoring pipeline when a record enters it, itself included (1 = no queue)",
    buckets=BATCH_BUCKETS,
)
embeddings_reused = Counter(
    "kp_embeddings_reused_total",
    "Traces whose text equalled an earlier one still cached or in flight: no model run",
)
cache_entries = Gauge(
    "kp_cache_entries", "Vectors held in a partition's novelty cache", ["topic", "partition"]
)
embedder_up = Gauge("kp_embedder_up", "1 when the embedding model is loaded, 0 when novelty is 0.5")
embedder_info = Info("kp_embedder", "Embedding model in use, or why there is none")
in_flight = Gauge("kp_records_in_flight", "Records received and not yet acknowledged downstream")
cache_rebuild_seconds = Histogram(
    "kp_cache_rebuild_seconds",
    "Time to rebuild a partition's novelty cache on assignment (store reads and model runs)",
    buckets=REBUILD_BUCKETS,
)
cache_rebuild_records = Counter(
    "kp_cache_rebuild_records_total",
    "Traces put back in novelty caches on assignment, by where their vector came from "
    "(store: read from the cache store; model: embedded again)",
    ["origin"],
)
gap_records = Counter(
    "kp_gap_records_total",
    "Records the consumer skipped that the worker read back from the log and scored",
)
records_lost = Counter(
    "kp_records_lost_total",
    "Input records deleted from the log (retention, delete-records) before the worker scored "
    "them: never scored",
)
log_restarts = Counter(
    "kp_log_restarts_total",
    "Times an input partition's log went back below the offset the worker had reached (topic "
    "recreated, log truncated); the partition is scored again from the new log",
)
transactions = Counter(
    "kp_transactions_total",
    "Exactly-once transactions (a partition's outputs and its offset) by outcome: committed, "
    "aborted (fenced by another worker, failed, or open at a stop: redelivered)",
    ["outcome"],
)
transaction_commit_seconds = Histogram(
    "kp_transaction_commit_seconds",
    "Exactly-once: time to add a partition's offset to its transaction and commit it",
    buckets=LATENCY_BUCKETS,
)
publish_retries = Counter("kp_publish_retries_total", "Batches whose publish had to be retried")
future_timestamps = Counter(
    "kp_future_timestamps_total",
    "Input records whose timestamp was more than 1 s ahead of the worker's clock when scored "
    "(producer clocks running fast); lag seconds counts them as scored now",
)
fetch_paused = Gauge(
    "kp_fetch_paused_partitions",
    "Input partitions not fetched now: records already taken from them wait for the pipeline",
)
fetch_pauses = Counter(
    "kp_fetch_pauses_total",
    "Times an input partition's fetched records began to wait for the pipeline",
)

broker_reachable = Gauge(
    "kp_broker_reachable",
    "1 while the broker answers the worker (start-up, fetches, publishes, the input topic "
    "probe); 0 until it has answered once, and from a failed request until one succeeds again",
)
seconds_since_last_fetch = Gauge(
    "kp_seconds_since_last_fetch",
    "Seconds since records, or an answer to the 2 s probe (metadata, end offsets), last came "
    "back from the broker",
)
seconds_since_last_publish = Gauge(
    "kp_seconds_since_last_publish",
    "Seconds since the broker last acknowledged outputs (grows while idle, too)",
)

build_info = Info("kp_build", "The worker's version and embedding model (value always 1)")
accept_threshold = Gauge("kp_accept_threshold", "Configured default accept threshold")
domain_accept_threshold = Gauge(
    "kp_domain_accept_threshold", "Configured accept threshold of one task domain", ["domain"]
)
latency_budget = Gauge(
    "kp_latency_budget_seconds", "Configured per-trace latency budget (kp_budget_breaches_total)"
)


class _LagCollector(Collector):
    """kp_consumer_lag_records/_seconds, computed when scraped from the current source."""

    def __init__(self) -> None:
        self.source: Callable[[], list[Lag]] | None = None

    def collect(self) -> list[GaugeMetricFamily]:
        """Read at every scrape, and once at registration (no source yet: no samples)."""
        records = GaugeMetricFamily(
            "kp_consumer_lag_records",
            "Records between an owned partition's next record to score and the log's end",
            labels=["topic", "partition"],
        )
        seconds = GaugeMetricFamily(
            "kp_consumer_lag_seconds",
            "How long an owned partition has been behind: now minus the newer of its last "
            "scored record's timestamp (one ahead of the clock counts as its scoring time) and "
            "the last moment it was caught up; 0 when caught up",
            labels=["topic", "partition"],
        )
        for lag in self.source() if self.source else ():
            records.add_metric([lag.topic, str(lag.partition)], lag.records)
            seconds.add_metric([lag.topic, str(lag.partition)], lag.seconds)
        return [records, seconds]


consumer_lag = _LagCollector()
REGISTRY.register(consumer_lag)
