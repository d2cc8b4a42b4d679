"""StreamScorer bookkeeping against a fake log: gaps, redeliveries, rebuilds, revocation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import orjson
import pytest
from prometheus_client import REGISTRY

from worker.core.cache import PartitionCaches
from worker.core.records import RoutedRecord, SourceRecord
from worker.core.scorer import Prepared, Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.embedding.protocol import RunTiming
from worker.stream.observer import MetricsObserver
from worker.stream.processor import INLINE_DECODE_BYTES, StreamScorer

from support.embedders import HashEmbedder
from support.traces import make_trace

TOPIC = "raw"


class FakeLog:
    def __init__(self, records: list[SourceRecord], committed: int | None = None) -> None:
        self.records = records
        self.committed_offset = committed
        self.reads: list[tuple[int, int]] = []

    async def committed(self, topic: str, partition: int) -> int | None:
        return self.committed_offset

    async def first_offset(self, topic: str, partition: int) -> int:
        return 0

    async def log_end(self, topic: str, partition: int, near: int) -> int:
        return 1 + max((r.offset for r in self.records if r.partition == partition), default=-1)

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        self.reads.append((start, end))
        return [r for r in self.records if r.partition == partition and start <= r.offset < end]


class FakePublisher:
    def __init__(self) -> None:
        self.published: list[RoutedRecord] = []
        self.fail = False

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        if self.fail:
            raise ConnectionError("broker gone")
        self.published.extend(routed)


def log_of(count: int, partition: int = 0, repeat_every: int = 3) -> list[SourceRecord]:
    records = []
    for offset in range(count):
        objective = f"task {offset % repeat_every}"
        value = orjson.dumps(make_trace(task={"objective": objective}))
        if offset == 4:
            value = b"not json"
        records.append(SourceRecord(TOPIC, partition, offset, 1000 + offset, b"k", value))
    return records


def scorer(capacity: int = 1000) -> Scorer:
    return Scorer(load_profiles(None), Thresholds(), PartitionCaches(capacity), HashEmbedder())


def scores(routed: Sequence[RoutedRecord]) -> dict[int, float | None]:
    return {r.source.offset: r.breakdown.score if r.breakdown else None for r in routed}


def run(coro):
    return asyncio.run(coro)


def continuous(records: list[SourceRecord], capacity: int = 1000) -> dict[int, float | None]:
    return scores(scorer(capacity).score_batch(records).routed)


def test_gap_before_first_delivery_is_read_from_the_log() -> None:
    log = FakeLog(log_of(12), committed=0)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(), log, publisher)
    run(stream.process(log.records[5:8]))  # the consumer skipped offsets 0..4
    assert sorted(scores(publisher.published)) == list(range(8))
    assert scores(publisher.published) == {
        k: v for k, v in continuous(log.records).items() if k < 8
    }


def test_gap_inside_and_between_batches() -> None:
    log = FakeLog(log_of(20), committed=0)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(), log, publisher)
    run(stream.process([log.records[i] for i in (0, 1, 2, 6, 7)]))  # hole 3..5 in a batch
    run(stream.process(log.records[10:14]))  # hole 8..9 between batches
    assert scores(publisher.published) == {
        k: v for k, v in continuous(log.records).items() if k < 14
    }


def test_redelivered_records_are_not_scored_twice() -> None:
    log = FakeLog(log_of(10), committed=0)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(), log, publisher)
    run(stream.process(log.records[0:6]))
    run(stream.process(log.records[3:10]))  # 3..5 again, as after a rebalance
    offsets = [r.source.offset for r in publisher.published]
    assert offsets == list(range(10))
    assert scores(publisher.published) == continuous(log.records)


def test_takeover_rebuilds_the_cache_from_before_the_committed_offset() -> None:
    records = log_of(30, repeat_every=7)
    expected = continuous(records, capacity=5)
    log = FakeLog(records, committed=17)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(capacity=5), log, publisher)
    run(stream.process(records[17:30]))
    assert scores(publisher.published) == {k: v for k, v in expected.items() if k >= 17}
    assert log.reads[0] == (12, 17), "reads back `capacity` records first"


def test_a_rebuilt_cache_is_reported_before_a_record_is_scored() -> None:
    """kp_cache_entries tells the truth after a rebalance: a partition taken over holds its
    rebuilt cache while no new record has come yet."""
    records = log_of(30, repeat_every=7)
    stream = StreamScorer(scorer(capacity=5), FakeLog(records, committed=30), FakePublisher())

    async def assign(partitions: list[tuple[str, int]]) -> None:
        stream.assigned(partitions)
        await stream.checkpoint.drain()

    run(assign([(TOPIC, 0)]))
    labels = {"topic": TOPIC, "partition": "0"}
    assert REGISTRY.get_sample_value("kp_cache_entries", labels) == 5
    run(assign([]))
    assert REGISTRY.get_sample_value("kp_cache_entries", labels) is None


def test_rebuild_reads_further_back_past_dead_lettered_records() -> None:
    records = log_of(12, repeat_every=12)  # offset 4 is not json
    expected = continuous(records, capacity=8)
    log = FakeLog(records, committed=10)
    stream = StreamScorer(scorer(capacity=8), log, FakePublisher())
    run(stream.process(records[10:12]))
    assert stream.checkpoint.publisher.published and scores(
        stream.checkpoint.publisher.published
    ) == {
        10: expected[10],
        11: expected[11],
    }
    assert log.reads[0] == (2, 10) and log.reads[1][1] == 2


def test_takeover_with_a_ttl_matches_the_live_run_when_timestamps_go_back() -> None:
    """With a TTL, whether a cached vector is live depends on each later record's timestamp,
    and producers' clocks differ: the record after the committed offset may be stamped far
    ahead and the one after it back in time, which still sees the older entries."""
    ttl_ms = 60_000
    stamped = [
        ("first objective", 1_000_000),  # scored before the takeover
        ("second objective", 1_000_000 + 3_600_000),  # the committed offset: an hour ahead
        ("first objective", 1_000_000 + 10_000),  # back in time: the first is live for it
    ]
    records = [
        SourceRecord(TOPIC, 0, offset, ts, b"k", orjson.dumps(make_trace(objective=text)))
        for offset, (text, ts) in enumerate(stamped)
    ]

    def ttl_scorer() -> Scorer:
        caches = PartitionCaches(1000, ttl_ms=ttl_ms)
        return Scorer(load_profiles(None), Thresholds(), caches, HashEmbedder())

    live = scores(ttl_scorer().score_batch(records).routed)
    log = FakeLog(records, committed=1)
    publisher = FakePublisher()
    run(StreamScorer(ttl_scorer(), log, publisher).process(records[1:]))
    assert novelty_of(publisher.published[-1]) == pytest.approx(0.0, abs=1e-6)
    assert scores(publisher.published) == {k: v for k, v in live.items() if k >= 1}


def novelty_of(routed: RoutedRecord) -> float:
    assert routed.breakdown is not None
    return routed.breakdown.dimensions.novelty


def test_a_partition_revoked_while_a_rebuild_runs_is_not_kept() -> None:
    """A rebalance that takes partitions away while this worker still rebuilds caches must
    leave nothing of them: when the partition comes back, after another worker scored and
    committed some of its records, it starts again from that commit, republishing nothing."""
    records = log_of(5, partition=0) + log_of(12, partition=1)
    committed = {0: 5, 1: 0}
    rebuilding = asyncio.Event()

    class SlowLog(FakeLog):
        async def committed(self, topic: str, partition: int) -> int | None:
            return committed[partition]

        async def read(
            self, topic: str, partition: int, start: int, end: int
        ) -> list[SourceRecord]:
            if partition == 0:
                await rebuilding.wait()  # partition 0's rebuild takes a while
            return await super().read(topic, partition, start, end)

    log = SlowLog(records)
    publisher = FakePublisher()

    async def scenario() -> None:
        stream = StreamScorer(scorer(), log, publisher)
        stream.assigned([(TOPIC, 0), (TOPIC, 1)])
        for _ in range(10):
            await asyncio.sleep(0)  # the rebuild of partition 0 is under way
        stream.assigned([])  # both go to other workers: 0 in its rebuild, 1 before its own
        rebuilding.set()
        await stream.checkpoint.drain()
        assert stream.partitions.owned() == []
        assert stream.scorer.caches.partitions() == []
        committed[1] = 10  # the other worker scored 0..9 and left
        stream.assigned([(TOPIC, 0), (TOPIC, 1)])
        await stream.checkpoint.drain()
        await stream.process([r for r in records if r.partition == 1 and r.offset >= 10])

    run(scenario())
    assert [r.source.offset for r in publisher.published if r.source.partition == 1] == [10, 11]


class CountingEmbedder(HashEmbedder):
    """Takes ``seconds`` per text, as a model does, and counts the texts it embedded."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(self.seconds * len(texts))
        self.texts += len(texts)
        return super().embed(texts)


HISTORY = 400  # traces before the committed offset: 4 s to embed them all at 10 ms each


def _rebuilding_stream() -> tuple[StreamScorer, CountingEmbedder]:
    embedder = CountingEmbedder(0.01)
    records = [
        SourceRecord(TOPIC, 0, i, 1000 + i, b"k", orjson.dumps(make_trace(objective=f"task {i}")))
        for i in range(HISTORY)
    ]
    caches = PartitionCaches(HISTORY)
    scorer = Scorer(load_profiles(None), Thresholds(), caches, embedder)
    return StreamScorer(scorer, FakeLog(records, committed=HISTORY), FakePublisher()), embedder


async def _rebuild_under_way(embedder: CountingEmbedder) -> None:
    while not embedder.texts:
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("how", ["revoked", "stopping"])
def test_a_rebuild_is_given_up_when_its_partition_is_revoked_or_the_worker_stops(
    how: str,
) -> None:
    """Neither a rebalance nor a stop waits for a rebuild whose partition is given up: the
    rebuild stops within a step, keeps nothing, and leaves the partition to its next owner."""
    stream, embedder = _rebuilding_stream()

    async def scenario() -> float:
        stream.assigned([(TOPIC, 0)])
        await _rebuild_under_way(embedder)
        began = time.monotonic()
        if how == "revoked":
            stream.assigned([])
            await stream.checkpoint.drain()
        else:
            await stream.close(5.0)
        return time.monotonic() - began

    waited = run(scenario())
    assert embedder.texts < HISTORY / 4, f"embedded {embedder.texts} of {HISTORY}"
    assert waited < 1.0, f"{how}: waited {waited:.1f} s for the rebuild"
    assert stream.partitions.owned() == []
    assert stream.scorer.caches.partitions() == []


def test_a_record_waiting_on_a_rebuild_given_up_at_a_stop_is_left_unscored() -> None:
    """The partition's first record came before its rebuild ended: at a stop it is neither
    scored with a partial cache nor acknowledged, so its partition's next owner scores it."""
    stream, embedder = _rebuilding_stream()
    record = SourceRecord(TOPIC, 0, HISTORY, 9999, b"k", orjson.dumps(make_trace()))
    acknowledged: list[int] = []

    async def acknowledge() -> None:
        acknowledged.append(record.offset)

    async def scenario() -> list[asyncio.Future[RoutedRecord | None]]:
        submitted = asyncio.ensure_future(stream.submit([record], None, [acknowledge]))
        await _rebuild_under_way(embedder)
        await stream.close(5.0)
        return await asyncio.wait_for(submitted, 1.0)

    assert run(scenario()) == []
    assert embedder.texts < HISTORY / 4
    assert stream.checkpoint.publisher.published == [] and acknowledged == []


def test_partition_revoked_while_scoring_leaves_no_state() -> None:
    log = FakeLog(log_of(6), committed=0)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(), log, publisher)

    async def revoke_during_publish(routed: Sequence[RoutedRecord]) -> None:
        stream.partitions.forget([(TOPIC, 0)])
        publisher.published.extend(routed)

    stream.checkpoint.publisher = type("P", (), {"publish": staticmethod(revoke_during_publish)})()
    run(stream.process(log.records[0:3]))
    assert stream.partitions.owned() == []
    assert (TOPIC, 0) not in stream.scorer.caches


def test_failed_publish_forgets_the_partition_and_raises() -> None:
    log = FakeLog(log_of(6), committed=0)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(), log, publisher)
    publisher.fail = True
    with pytest.raises(ConnectionError):
        run(stream.process(log.records[0:3]))
    assert stream.partitions.owned() == []
    publisher.fail = False
    run(stream.process(log.records[0:6]))  # redelivered after the failure: scored afresh
    assert scores(publisher.published) == continuous(log.records)


@pytest.mark.parametrize("in_flight", [1, 3, 8, 100])
def test_pipelined_scoring_equals_one_batch_and_publishes_in_offset_order(in_flight: int) -> None:
    records = log_of(8, 0) + log_of(8, 1)
    log = FakeLog(records, committed=0)
    publisher = FakePublisher()
    stream = StreamScorer(scorer(), log, publisher, max_in_flight_records=in_flight)
    published = run(stream.process(records))
    expected = scorer().score_batch(records).routed
    assert [(r.source.partition, r.source.offset) for r in published] == [
        (r.source.partition, r.source.offset) for r in expected
    ]
    for partition in (0, 1):
        assert [r.breakdown for r in publisher.published if r.source.partition == partition] == [
            r.breakdown for r in expected if r.source.partition == partition
        ]


def test_a_record_that_fails_to_publish_fails_its_partition() -> None:
    log = FakeLog(log_of(6), committed=0)
    stream = StreamScorer(scorer(), log, FakePublisher(), max_in_flight_records=2)
    calls = 0

    async def fail_second_chunk(routed: Sequence[RoutedRecord]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ConnectionError("broker gone")

    stream.checkpoint.publisher = type("P", (), {"publish": staticmethod(fail_second_chunk)})()
    with pytest.raises(ConnectionError):
        run(stream.process(log.records))
    assert stream.partitions.owned() == [] and (TOPIC, 0) not in stream.scorer.caches


class SlowEmbedder(HashEmbedder):
    """Runs on two threads and takes a while, like the model; counts the texts it ran."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(2)
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.05)
        self.texts += texts
        return super().embed(texts)

    def submit(self, texts: Sequence[str], timing: RunTiming | None = None) -> Future[np.ndarray]:
        return self.pool.submit(self.embed, texts)


def test_records_embed_side_by_side_and_identical_texts_in_flight_run_once() -> None:
    # offsets 0-5 of two partitions; "task 0" and "task 1" appear in both partitions.
    records = log_of(3, 0, repeat_every=3) + log_of(3, 1, repeat_every=3)
    embedder = SlowEmbedder()
    stream = StreamScorer(
        Scorer(load_profiles(None), Thresholds(), PartitionCaches(), embedder),
        FakeLog(records, committed=0),
        FakePublisher(),
    )
    reused_before = REGISTRY.get_sample_value("kp_embeddings_reused_total") or 0.0
    started = time.monotonic()
    published = run(stream.process(records))
    elapsed = time.monotonic() - started
    assert scores(published) == continuous(records)
    assert sorted(embedder.texts) == sorted(set(embedder.texts)), "each text ran once"
    assert len(embedder.texts) == 3
    reused = REGISTRY.get_sample_value("kp_embeddings_reused_total") - reused_before
    assert reused == 3
    assert elapsed < 6 * 0.05, "the runs overlapped"


def test_close_publishes_what_is_in_the_pipeline_and_takes_nothing_new() -> None:
    records = log_of(8, 0, repeat_every=8)
    first, later = records[:4], records[4:]
    publisher = FakePublisher()
    acknowledged: list[int] = []

    def ack(offset: int):
        async def acknowledge() -> None:
            acknowledged.append(offset)

        return acknowledge

    async def scenario() -> list[RoutedRecord | None]:
        stream = StreamScorer(
            Scorer(load_profiles(None), Thresholds(), PartitionCaches(), SlowEmbedder()),
            FakeLog(records, committed=0),
            publisher,
            max_in_flight_records=4,
        )
        pending = await stream.submit(first, acknowledgements=[ack(r.offset) for r in first])
        await stream.close(timeout=5)
        late = await stream.submit(later, acknowledgements=[ack(r.offset) for r in later])
        return await asyncio.gather(*pending, *late)

    results = run(asyncio.wait_for(scenario(), timeout=10))
    assert [r.source.offset for r in publisher.published] == [0, 1, 2, 3]
    assert acknowledged == [0, 1, 2, 3], "everything published is acknowledged before the stop"
    assert results[4:] == [None] * 4, "records after the stop are left for the next worker"


def test_close_abandons_what_cannot_be_published_in_time() -> None:
    records = log_of(2, 0)

    class StuckPublisher(FakePublisher):
        async def publish(self, routed: Sequence[RoutedRecord]) -> None:
            await asyncio.sleep(60)

    async def scenario() -> float:
        stream = StreamScorer(scorer(), FakeLog(records, committed=0), StuckPublisher())
        await stream.submit(records)
        started = time.monotonic()
        await stream.close(timeout=0.2)
        assert stream.checkpoint.idle
        return time.monotonic() - started

    assert run(scenario()) < 2


class InFlight(MetricsObserver):
    """How many records the pipeline tells its observer are in it (kp_records_in_flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.depths: list[int] = []
        self.left = 0

    def record_entered(self, depth: int) -> None:
        super().record_entered(depth)
        self.depths.append(depth)

    def record_left(self) -> None:
        super().record_left()
        self.left += 1


def test_stop_before_jobs_start_settles_them_and_frees_their_slots() -> None:
    """Abandoned records resolve as dropped (None), so nothing awaiting them hangs, the
    pipeline counts none of them as still in flight, and their slots are free: a pipeline of
    three slots, stopped with three records in it, still takes (and drops) a fourth."""
    records = log_of(4, 0)
    observer = InFlight()

    async def scenario() -> tuple[list[RoutedRecord | None], list[RoutedRecord | None]]:
        log = FakeLog(records, committed=0)
        stream = StreamScorer(
            scorer(), log, FakePublisher(), max_in_flight_records=3, observer=observer
        )
        pending = await stream.submit(records[:3])  # spawned, none has run a step yet
        await stream.stop()
        abandoned = await asyncio.wait_for(asyncio.gather(*pending), timeout=2)
        assert stream.checkpoint.in_flight() == 0
        later = await asyncio.wait_for(stream.submit(records[3:]), timeout=2)
        return abandoned, await asyncio.wait_for(asyncio.gather(*later), timeout=2)

    abandoned, later = run(scenario())
    assert abandoned == [None, None, None] and later == [None]
    assert observer.depths == [1, 2, 3] and observer.left == 3


def test_large_records_are_decoded_off_the_event_loop_small_ones_on_it() -> None:
    small = orjson.dumps(make_trace(task={"objective": "short"}))
    large = orjson.dumps(make_trace(task={"objective": "long " * INLINE_DECODE_BYTES}))
    assert len(small) <= INLINE_DECODE_BYTES < len(large)
    records = [
        SourceRecord(TOPIC, 0, offset, 1000 + offset, b"k", value)
        for offset, value in enumerate([small, large, small, large])
    ]
    stream = StreamScorer(scorer(), FakeLog(records, committed=0), FakePublisher())
    decoded_on: dict[int, bool] = {}
    prepare = stream.scorer.prepare

    def watched(batch: Sequence[SourceRecord]) -> list[Prepared]:
        on_loop = threading.current_thread() is threading.main_thread()
        decoded_on.update({item.offset: on_loop for item in batch})
        return prepare(batch)

    stream.scorer.prepare = watched  # type: ignore[method-assign]
    published = run(stream.process(records))
    assert decoded_on == {0: True, 1: False, 2: True, 3: False}
    assert scores(published) == continuous(records)
