"""Hostile domains cannot explode metric cardinality: domain labels stay profiles + "other".

10,000 traces with random ``metadata.task_domain`` strings go through the Scorer and the
StreamScorer's metrics path (fake log reader and publisher, no broker); the ``domain`` label
values of kp_records_total and kp_score are then read from the process's registry.
"""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import Sequence

import orjson
from prometheus_client import REGISTRY

from worker.core.records import OTHER_DOMAIN, RoutedRecord, SourceRecord
from worker.core.scorer import build_scorer
from worker.settings import load_settings
from worker.stream.processor import StreamScorer

from support.traces import make_trace

TRACES = 10_000
BATCH = 200
PARTITIONS = 4
TOPIC = "labels-test"


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


def label_values(metric: str, label: str) -> dict[str, float]:
    """Sample value per value of ``label`` of the samples named ``metric`` in the registry."""
    values: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == metric:
                key = sample.labels[label]
                values[key] = values.get(key, 0.0) + sample.value
    return values


def test_domain_labels_stay_bounded_under_random_domains() -> None:
    scorer = build_scorer(load_settings(), use_embedder=False)
    allowed = set(scorer.profiles.names) | {OTHER_DOMAIN}
    publisher = DiscardingPublisher()
    stream = StreamScorer(scorer, EmptyLog(), publisher)
    rng = random.Random(20240501)
    profiles = sorted(scorer.profiles.names)
    domains = [random_domain(rng, profiles) for _ in range(TRACES)]
    records = []
    for index, domain in enumerate(domains):
        document = make_trace(domain=domain, id=f"kp:trace:labels-{index}")
        partition = index % PARTITIONS
        records.append(
            SourceRecord(
                TOPIC,
                partition,
                index // PARTITIONS,
                1_700_000_000_000 + index,
                None,
                orjson.dumps(document),
            )
        )
    before = label_values("kp_records_total", "domain")

    async def run() -> None:
        for start in range(0, len(records), BATCH):
            await stream.process(records[start : start + BATCH])

    asyncio.run(run())

    after = label_values("kp_records_total", "domain")
    assert publisher.published == TRACES
    assert sum(after.values()) - sum(before.values()) == TRACES
    assert set(after) <= allowed, sorted(set(after) - allowed)[:10]
    score_domains = set(label_values("kp_score_count", "domain"))
    assert score_domains <= allowed, sorted(score_domains - allowed)[:10]

    expected_other = sum(1 for d in domains if d not in scorer.profiles.names)
    assert after.get(OTHER_DOMAIN, 0) - before.get(OTHER_DOMAIN, 0) == expected_other
    distinct = len(set(domains))
    print(
        f"\n{TRACES} traces, {distinct} distinct domains -> "
        f"{len(after)} kp_records_total domain labels {sorted(after)}"
    )
    assert distinct > 5_000, "the input really is high-cardinality"
