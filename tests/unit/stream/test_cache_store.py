"""The novelty cache store: entries published with outputs, read back bit for bit on takeover,
and whatever the store cannot vouch for embedded again, against a fake log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import numpy as np
import orjson
import pytest

from worker.core.cache import PartitionCaches, is_grid_row
from worker.core.cache_store import StoreTopic, embedder_tag, entry, stored_rows
from worker.core.records import RoutedRecord, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.stream.processor import StreamScorer

from support.embedders import HashEmbedder
from support.traces import make_trace

TOPIC = "raw"
STORE = StoreTopic("raw.cache", 2)
CAPACITY = 8


class Log:
    """The input log and the store's, by topic; the input's committed offset."""

    def __init__(self, records: list[SourceRecord], committed: int | None = None) -> None:
        self.topics: dict[str, list[SourceRecord]] = {TOPIC: records, STORE.name: []}
        self.committed_offset = committed
        self.blocked: dict[int, asyncio.Event] = {}  # input partitions whose reads wait

    async def committed(self, topic: str, partition: int) -> int | None:
        return self.committed_offset

    async def first_offset(self, topic: str, partition: int) -> int:
        return 0

    async def log_end(self, topic: str, partition: int, near: int) -> int:
        return 1 + max(
            (r.offset for r in self.topics[topic] if r.partition == partition), default=-1
        )

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        if topic == TOPIC and partition in self.blocked:
            await self.blocked[partition].wait()
        records = self.topics[topic]
        return [r for r in records if r.partition == partition and start <= r.offset < end]

    async def partitions(self, topic: str) -> list[int]:
        if topic not in self.topics:
            return []
        return list(range(STORE.partitions))

    def store(self, routed: Sequence[RoutedRecord]) -> None:
        """Append the routed records' entries to the store, as the publisher does."""
        for record in routed:
            if record.cache_entry is not None:
                partition = STORE.partition_of(record.source.partition)
                offset = asyncio.run(self.log_end(STORE.name, partition, 0))
                key, value = record.cache_entry
                self.topics[STORE.name].append(
                    SourceRecord(STORE.name, partition, offset, 0, key, value)
                )


class Publisher:
    def __init__(self) -> None:
        self.published: list[RoutedRecord] = []

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        self.published.extend(routed)


def inputs(count: int, partitions: int = 1) -> list[SourceRecord]:
    """Traces with repeated texts, one not JSON, spread over ``partitions``."""
    records = []
    for index in range(count):
        partition, offset = index % partitions, index // partitions
        value = orjson.dumps(make_trace(task={"objective": f"task {index % 5}-{index % 7}"}))
        records.append(
            SourceRecord(
                TOPIC, partition, offset, 1000 + index, b"k", b"{" if offset == 3 else value
            )
        )
    return records


def stream(log: Log, store: StoreTopic | None = STORE) -> tuple[StreamScorer, Publisher]:
    embedder = HashEmbedder()
    scorer = Scorer(load_profiles(None), Thresholds(), PartitionCaches(CAPACITY), embedder)
    publisher = Publisher()
    return StreamScorer(scorer, log, publisher, store=store), publisher


def scores(routed: Sequence[RoutedRecord]) -> dict[tuple[int, int], bytes | None]:
    return {(r.source.partition, r.source.offset): r.value for r in routed}


def scored_live(records: list[SourceRecord], upto: int) -> tuple[Log, dict]:
    """A log whose first ``upto`` offsets a first owner scored (its entries in the store), and
    the outputs of one worker scoring every record without a break."""
    log = Log(records, committed=upto)
    first, published = stream(log)
    asyncio.run(first.process([r for r in records if r.offset < upto]))
    log.store(published.published)
    whole, all_published = stream(Log(records))
    asyncio.run(whole.process(records))
    return log, scores(all_published.published)


def test_an_entry_reads_back_bit_for_bit_for_its_own_embedder_only() -> None:
    caches = PartitionCaches(4)
    caches.warm((TOPIC, 0), np.random.default_rng(1).normal(size=(1, 384)), [0], [b"t" * 16])
    row = caches.row_for_text((TOPIC, 0), b"t" * 16)
    assert row is not None and is_grid_row(row, 384)
    key, value = entry(embedder_tag("model a"), b"t" * 16, row)
    stored = SourceRecord(STORE.name, 0, 0, 0, key, value)
    (read,) = stored_rows([stored], embedder_tag("model a"), 384).values()
    assert read.tobytes() == row.tobytes()
    assert stored_rows([stored], embedder_tag("model b"), 384) == {}


def test_unsound_entries_are_not_used() -> None:
    tag = embedder_tag("model a")
    unit = np.zeros(384, dtype=np.float32)
    unit[0] = 1.0
    bad_rows = [unit * 2, unit + np.float32(2**-30), np.full(384, np.nan, dtype=np.float32)]
    records = [
        SourceRecord(STORE.name, 0, i, 0, tag + b"%16d" % i, r.tobytes())
        for i, r in enumerate(bad_rows)
    ]
    records += [
        SourceRecord(STORE.name, 0, 7, 0, tag + b"k" * 16, unit.tobytes()[:-4]),  # too short
        SourceRecord(STORE.name, 0, 8, 0, tag + b"n" * 16, None),  # a tombstone
        SourceRecord(STORE.name, 0, 9, 0, None, unit.tobytes()),
    ]
    assert stored_rows(records, tag, 384) == {}
    assert list(
        stored_rows([SourceRecord(STORE.name, 0, 0, 0, tag + b"u" * 16, unit.tobytes())], tag, 384)
    ) == [b"u" * 16]


def cache_state(owner: StreamScorer) -> tuple:
    """Everything a cache holds, slot for slot."""
    rows, times, keys = owner.scorer.caches.get((TOPIC, 0)).entries()
    return rows.tobytes(), times.tobytes(), keys


def test_a_new_owner_restores_its_cache_from_the_store_bit_for_bit() -> None:
    records = inputs(30)
    log, expected = scored_live(records, upto=20)
    restored, published = stream(log)
    restored.partitions.assigned([(TOPIC, 0)])
    asyncio.run(restored.partitions.prepare([(TOPIC, 0)]))
    assert restored.scorer.embedder.embedded == 0  # type: ignore[union-attr]
    embedded, _ = stream(Log(records, committed=20), store=None)
    embedded.partitions.assigned([(TOPIC, 0)])
    asyncio.run(embedded.partitions.prepare([(TOPIC, 0)]))
    assert embedded.scorer.embedder.embedded > 0  # type: ignore[union-attr]
    assert cache_state(restored) == cache_state(embedded)
    asyncio.run(restored.process(records[20:]))
    assert scores(published.published) == {k: v for k, v in expected.items() if k[1] >= 20}


def test_entries_the_store_lacks_are_embedded_and_scores_stay_equal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = inputs(30)
    log, expected = scored_live(records, upto=20)
    log.topics[STORE.name] = log.topics[STORE.name][::2]  # every other entry lost
    caplog.set_level(logging.INFO, logger="worker")
    restored, published = stream(log)
    asyncio.run(restored.process(records[20:]))
    (line,) = [r for r in caplog.records if r.getMessage() == "rebuilt novelty cache"]
    assert line.restored and line.embedded  # type: ignore[attr-defined]
    assert line.restored + line.embedded == CAPACITY  # type: ignore[attr-defined]
    assert scores(published.published) == {k: v for k, v in expected.items() if k[1] >= 20}


def test_a_store_that_is_gone_means_embedding_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = inputs(30)
    log, expected = scored_live(records, upto=20)
    del log.topics[STORE.name]
    restored, published = stream(log)
    asyncio.run(restored.process(records[20:]))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [
        "novelty cache store unreadable; embedding the partition's cache instead"
    ]
    assert scores(published.published) == {k: v for k, v in expected.items() if k[1] >= 20}


def test_a_partition_is_scored_while_another_is_still_rebuilding() -> None:
    records = inputs(40, partitions=2)
    log, expected = scored_live(records, upto=15)

    async def scenario() -> dict:
        restored, published = stream(log)
        log.blocked[1] = asyncio.Event()  # partition 1's log answers only when told
        restored.assigned([(TOPIC, 0), (TOPIC, 1)])
        await asyncio.wait_for(
            restored.process([r for r in records if r.partition == 0 and r.offset >= 15]), 5
        )
        done = scores(published.published)
        log.blocked[1].set()
        await restored.process([r for r in records if r.partition == 1 and r.offset >= 15])
        return done

    done = asyncio.run(scenario())
    assert done == {k: v for k, v in expected.items() if k[0] == 0 and k[1] >= 15}


def test_a_partition_is_not_fetched_until_its_cache_is_ready() -> None:
    log, _ = scored_live(inputs(30), upto=20)
    owner, _ = stream(log)
    held: list[tuple[tuple[str, int], bool, int | None]] = []
    owner.partitions.hold_fetching = lambda tp, on: held.append(
        (tp, on, owner.scorer.cache_size(tp))
    )
    owner.partitions.assigned([(TOPIC, 0)])
    asyncio.run(owner.partitions.prepare([(TOPIC, 0)]))
    assert held == [((TOPIC, 0), True, None), ((TOPIC, 0), False, CAPACITY)]


def test_lag_is_counted_while_a_cache_is_being_rebuilt() -> None:
    records = inputs(30)
    log, _ = scored_live(records, upto=20)

    async def scenario() -> tuple[list, list]:
        owner, _ = stream(log)
        log.blocked[0] = asyncio.Event()
        owner.assigned([(TOPIC, 0)])  # the rebuild waits on the log
        await asyncio.sleep(0.05)
        assert owner.partitions.held() == [(TOPIC, 0)] and owner.partitions.owned() == []
        owner.observer.lag.log_ends({(TOPIC, 0): 30})
        during = [(lag.partition, lag.records) for lag in owner.observer.lag.snapshot()]
        log.blocked[0].set()
        await owner.process(records[20:])
        owner.observer.lag.log_ends({(TOPIC, 0): 30})
        after = [(lag.partition, lag.records) for lag in owner.observer.lag.snapshot()]
        return during, after

    assert asyncio.run(scenario()) == ([(0, 10)], [(0, 0)])
