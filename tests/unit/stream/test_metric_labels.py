"""Hostile input cannot explode metric cardinality: every label of every ``kp_`` metric takes
its values from a bounded set.

``BOUNDS`` says, per label name, where its values come from; every label of every exported
metric (``support.metric_families``) must have an entry, so a new label has to say what bounds
it. Then 10,000 traces with random ``metadata.task_domain`` strings, and malformed records
among them, go through the Scorer and the StreamScorer's metrics path (fake log reader and
publisher, no broker), with the observer's other reports (thresholds, transactions, lag); every
series this creates in the process's registry, of every metric, must have each label's value
in its bound. An info metric is one series whatever its values.
"""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import Callable, Sequence

import orjson
from prometheus_client import REGISTRY

from worker.core.errors import ERROR_KINDS
from worker.core.records import OTHER_DOMAIN, Decision, RoutedRecord, SourceRecord
from worker.core.scorer import Scorer, build_scorer
from worker.core.scoring import DIMENSION_NAMES, NoveltySource
from worker.settings import load_settings
from worker.stream import metrics
from worker.stream.processor import StreamScorer
from worker.stream.timing import STAGES

from support.metric_families import exported_metrics, scraped_name
from support.traces import make_trace

TRACES = 10_000
BATCH = 200
PARTITIONS = 4
TOPIC = "labels-test"
# Domains an operator gave a threshold (KP_DOMAIN_THRESHOLDS): configured, so bounded.
DOMAIN_THRESHOLDS = {"finance": 0.8, "not-a-profile": 0.6}
# Malformed values, one every MALFORMED_EVERY records: dead letters of several kinds.
MALFORMED = [b"", b"{", b"[]", b'{"a":1,"a":1}', b"\xff\xfe", b'{"x": 1}']
MALFORMED_EVERY = 50

Bounds = dict[str, Callable[[Scorer], set[str]]]
# Where each label's values come from, whatever the input holds.
BOUNDS: Bounds = {
    # Scorer.domain_label: the configured profiles, else "other"; and the configured thresholds.
    "domain": lambda scorer: {*scorer.profiles.names, OTHER_DOMAIN, *DOMAIN_THRESHOLDS},
    # The partitions owned: the input topic's.
    "topic": lambda scorer: {TOPIC},
    "partition": lambda scorer: {str(partition) for partition in range(PARTITIONS)},
    "kind": lambda scorer: set(ERROR_KINDS),
    "stage": lambda scorer: set(STAGES),
    "dimension": lambda scorer: set(DIMENSION_NAMES),
    "source": lambda scorer: {source.value for source in NoveltySource},
    "decision": lambda scorer: {decision.value for decision in Decision},
    # MetricsObserver.transaction_committed and transaction_aborted.
    "outcome": lambda scorer: {"committed", "aborted"},
    # MetricsObserver.cache_rebuilt: vectors read from the cache store, or embedded again.
    "origin": lambda scorer: {"store", "model"},
}
# Labels a histogram's series add: its buckets, fixed in code.
SERIES_LABELS = {"le"}


class EmptyLog:
    """A log with nothing before the first delivered record and no committed offset."""

    async def committed(self, topic: str, partition: int) -> int | None:
        return None

    async def first_offset(self, topic: str, partition: int) -> int:
        return 0

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        return []


class DiscardingPublisher:
    def __init__(self) -> None:
        self.published = 0

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        self.published += len(routed)


def random_domain(rng: random.Random, profiles: Sequence[str]) -> str:
    """Profile names, near misses, and arbitrary (often unique) strings."""
    roll = rng.random()
    if roll < 0.2:
        return rng.choice(profiles)
    if roll < 0.35:  # near misses of a profile name
        name = rng.choice(profiles)
        return rng.choice(
            [name.upper(), f" {name}", f"{name} ", f"{name}\x00", f"{name}/x", name[:-1], ""]
        )
    alphabet = string.printable + "ñ漢字ключ🙂\u200b"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 64)))


Series = set[tuple[str, tuple[tuple[str, str], ...]]]


def kp_series() -> dict[str, Series]:
    """Every series of every kp_ metric in the registry, by the metric's scraped name."""
    found: dict[str, Series] = {}
    for family in REGISTRY.collect():
        if family.name.startswith("kp_"):
            series = found.setdefault(scraped_name(family.name, family.type), set())
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items()))
                series.add((sample.name, labels))
    return found


def label_values(metric: str, label: str) -> dict[str, float]:
    """Sample value per value of ``label`` of the samples named ``metric`` in the registry."""
    values: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == metric:
                key = sample.labels[label]
                values[key] = values.get(key, 0.0) + sample.value
    return values


def test_every_label_of_every_metric_has_a_bound() -> None:
    exported = exported_metrics()
    info = {name for name in exported if name.endswith("_info")}
    unbounded = sorted(
        f"{name}{{{label}}}"
        for name, labels in exported.items()
        if name not in info
        for label in labels
        if label not in BOUNDS
    )
    assert not unbounded, f"say in BOUNDS what bounds the values of: {unbounded}"
    assert {name for name in exported if exported[name]} - info, "labelled metrics exist"


def test_every_label_stays_bounded_under_hostile_input() -> None:
    settings = load_settings()
    scorer = build_scorer(settings, use_embedder=False)
    bounds = {label: bound(scorer) for label, bound in BOUNDS.items()}
    publisher = DiscardingPublisher()
    stream = StreamScorer(scorer, EmptyLog(), publisher)
    observer = stream.observer
    rng = random.Random(20240501)
    profiles = sorted(scorer.profiles.names)
    domains = [random_domain(rng, profiles) for _ in range(TRACES)]
    records = []
    for index, domain in enumerate(domains):
        document = make_trace(domain=domain, id=f"kp:trace:labels-{index}")
        value = orjson.dumps(document)
        if index % MALFORMED_EVERY == MALFORMED_EVERY - 1:
            value = MALFORMED[index // MALFORMED_EVERY % len(MALFORMED)]
        partition = index % PARTITIONS
        records.append(
            SourceRecord(
                TOPIC, partition, index // PARTITIONS, 1_700_000_000_000 + index, None, value
            )
        )
    before = kp_series()
    records_before = label_values("kp_records_total", "domain")
    owned = [(TOPIC, partition) for partition in range(PARTITIONS)]

    async def run() -> None:
        observer.partitions_assigned(owned)
        observer.configured_thresholds(settings.accept_threshold, DOMAIN_THRESHOLDS)
        for start in range(0, len(records), BATCH):
            await stream.process(records[start : start + BATCH])
        observer.transaction_committed(0.01)
        observer.transaction_aborted()
        for tp in owned:  # as after a rebuild (without a model, no record fills a cache)
            observer.cache_filled(tp, 0)
        observer.cache_rebuilt(0.1, restored=3, embedded=1)
        observer.lag.log_ends({tp: TRACES for tp in owned})

    lag_source = metrics.consumer_lag.source
    metrics.consumer_lag.source = observer.lag.snapshot
    try:
        asyncio.run(run())
        after = kp_series()
    finally:
        metrics.consumer_lag.source = lag_source
        for domain in DOMAIN_THRESHOLDS:  # not this process's configuration
            metrics.domain_accept_threshold.remove(domain)
        for tp in owned:
            observer.partition_forgotten(tp)

    assert publisher.published == TRACES
    exported = exported_metrics()
    undriven = sorted(
        name
        for name, labels in exported.items()
        if labels and not name.endswith("_info") and not after.get(name)
    )
    assert not undriven, f"drive these metrics in this test too: {undriven}"
    escaped: set[str] = set()
    for name, series in after.items():
        if name.endswith("_info"):
            assert len({labels for _, labels in series}) <= 1, name
            continue
        for _, labels in series - before.get(name, set()):
            for label, value in labels:
                if label not in SERIES_LABELS and value not in bounds[label]:
                    escaped.add(f"{name}{{{label}={value!r}}}")
    assert not escaped, f"{len(escaped)} unbounded label values, e.g. {sorted(escaped)[:10]}"

    records_after = label_values("kp_records_total", "domain")
    added = {d: records_after[d] - records_before.get(d, 0.0) for d in records_after}
    assert sum(added.values()) == TRACES
    malformed = sum(1 for i in range(TRACES) if i % MALFORMED_EVERY == MALFORMED_EVERY - 1)
    expected_other = malformed + sum(
        1
        for i, d in enumerate(domains)
        if d not in scorer.profiles.names and i % MALFORMED_EVERY != MALFORMED_EVERY - 1
    )
    assert added.get(OTHER_DOMAIN, 0) == expected_other
    distinct = len(set(domains))
    print(
        f"\n{TRACES} traces, {distinct} distinct domains -> "
        f"{len(records_after)} kp_records_total domain labels {sorted(records_after)}"
    )
    assert distinct > 5_000, "the input really is high-cardinality"
