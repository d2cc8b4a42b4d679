"""Each published record's time, split into stages that add up to its latency.

The stream pipeline stamps each boundary; the model pool stamps when a thread takes a run,
when it is tokenized and when it ends. Waiting for a model thread (``embed_wait``) and for the
partition's earlier records (``order_wait``) are stages of their own, apart from the model's
run (``embed``), and ``KP_TIMING_HEADER`` puts the stages on the outputs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import orjson
import pytest

from worker.core.cache import PartitionCaches
from worker.core.records import RoutedRecord, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.embedding import EmbedderConfig, open_embedder
from worker.embedding.protocol import RunTiming
from worker.settings import Settings
from worker.stream.observer import MetricsObserver
from worker.stream.processor import StreamScorer
from worker.stream.timing import STAGES, TIMING_HEADER, RecordTiming

from support.traces import make_trace

TOPIC = "timed"
TOKENIZE_SECONDS = 0.005
LONG_RUN_SECONDS = 0.08
SHORT_RUN_SECONDS = 0.01
FETCH_SECONDS = 0.05  # the records' timestamps are this long before their receipt
SLACK = 0.02  # a sleep may overrun on a loaded machine


class TimedEmbedder:
    """Two model threads; a text with "long" in it runs 80 ms, others 10 ms. Stamps the
    timing it is given as the model pool does."""

    model_id = "timed"
    dimensions = 384

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(2)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._run(texts, None)

    def submit(self, texts: Sequence[str], timing: RunTiming | None = None) -> Future[np.ndarray]:
        return self.pool.submit(self._run, texts, timing)

    def _run(self, texts: Sequence[str], timing: RunTiming | None) -> np.ndarray:
        if timing is not None:
            timing.started = time.monotonic()
        time.sleep(TOKENIZE_SECONDS)
        if timing is not None:
            timing.tokenized = time.monotonic()
        time.sleep(LONG_RUN_SECONDS if any("long" in t for t in texts) else SHORT_RUN_SECONDS)
        if timing is not None:
            timing.finished = time.monotonic()
        rng = np.random.default_rng(len(texts[0]))
        out = rng.normal(size=(len(texts), self.dimensions)).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def close(self) -> None:
        self.pool.shutdown()


class RecordingObserver(MetricsObserver):
    """The metrics observer, remembering each record's stages and latency as well."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, tuple[dict[str, float], list[str], float]] = {}

    def record_published(
        self,
        routed: RoutedRecord,
        timing: RecordTiming,
        reused_vector: bool,
        cache_size: int | None,
    ) -> None:
        stages = timing.stages()
        names = [name for name, _ in stages]
        self.seen[routed.source.offset] = (dict(stages), names, timing.latency)
        super().record_published(routed, timing, reused_vector, cache_size)


class Publisher:
    def __init__(self) -> None:
        self.published: list[RoutedRecord] = []

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        await asyncio.sleep(0.002)
        self.published.extend(routed)


class EmptyLog:
    async def committed(self, topic: str, partition: int) -> int | None:
        return 0

    async def first_offset(self, topic: str, partition: int) -> int:
        return 0

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        return []


def records(objectives: Sequence[str], timestamp_ms: int) -> list[SourceRecord]:
    return [
        SourceRecord(
            TOPIC,
            0,
            offset,
            timestamp_ms,
            b"k",
            orjson.dumps(make_trace(objective=objective)) if objective else b"not json",
        )
        for offset, objective in enumerate(objectives)
    ]


def publish_timed(
    objectives: Sequence[str], timing_header: bool = False
) -> tuple[RecordingObserver, list[RoutedRecord]]:
    """The records, all received at once, through a pipeline on the timed embedder."""
    observer = RecordingObserver()
    publisher = Publisher()
    stream = StreamScorer(
        Scorer(load_profiles(None), Thresholds(), PartitionCaches(), TimedEmbedder()),
        EmptyLog(),
        publisher,
        observer=observer,
        timing_header=timing_header,
    )
    delivered = records(objectives, round((time.time() - FETCH_SECONDS) * 1000))
    asyncio.run(stream.process(delivered, [time.monotonic()] * len(delivered)))
    return observer, publisher.published


def test_every_stage_is_observed_and_waits_and_work_add_up_to_the_latency() -> None:
    # Offset 0 runs long on one thread; 1, 2 and 3 run short one after another on the other,
    # then wait for offset 0 (novelty goes in offset order); 4 repeats 1's text while it is
    # in flight (no run of its own); 5 is not JSON (no vector).
    objectives = ["long task", "short a", "short b", "short c", "short a", ""]
    observer, _ = publish_timed(objectives)
    assert sorted(observer.seen) == list(range(len(objectives)))
    for offset, (stages, names, latency) in observer.seen.items():
        assert names == list(STAGES), "every stage, in pipeline order"
        assert all(seconds >= 0 for seconds in stages.values())
        assert FETCH_SECONDS - 0.002 <= stages["fetch"] <= FETCH_SECONDS + 0.5
        after_receipt = sum(s for name, s in stages.items() if name != "fetch")
        assert after_receipt == pytest.approx(latency, abs=0.002), offset
    stage = {offset: seen[0] for offset, seen in observer.seen.items()}
    # The model run alone, without the wait for a thread.
    assert LONG_RUN_SECONDS <= stage[0]["embed"] <= LONG_RUN_SECONDS + SLACK
    assert stage[0]["embed_wait"] <= SLACK
    order = list(STAGES)

    def until(offset: int, last: str) -> float:
        """When stage ``last`` of ``offset`` ended, from the receipt (every record's, at once)."""
        return sum(
            seconds
            for name, seconds in stage[offset].items()
            if name != "fetch" and order.index(name) <= order.index(last)
        )

    third = stage[3]
    # Offset 3 runs once offset 2's run has freed the thread (offset 0 holds the other): until
    # then it waits, in embed_wait. How long depends on when it was submitted (later on a
    # loaded machine: 1.7 ms once, beside three test workers on 2 cores), not on the pipeline.
    assert until(3, "embed_wait") >= until(2, "embed") - 0.001
    assert SHORT_RUN_SECONDS <= third["embed"] <= SHORT_RUN_SECONDS + SLACK
    assert third["tokenize"] >= TOKENIZE_SECONDS
    # Short runs finish long before offset 0's vector: offset 1 waits for it, in order_wait.
    assert until(1, "order_wait") >= until(0, "embed") - 0.001
    assert stage[1]["order_wait"] > 0
    # A text in flight is waited for, not run again; a dead letter runs nothing.
    for offset in (4, 5):
        assert stage[offset]["tokenize"] == stage[offset]["embed"] == 0.0
    assert stage[4]["embed_wait"] >= SHORT_RUN_SECONDS


def test_the_stages_are_exported_per_stage_label() -> None:
    from prometheus_client import REGISTRY

    def counts() -> dict[str, float]:
        return {
            stage: REGISTRY.get_sample_value("kp_stage_latency_seconds_count", {"stage": stage})
            or 0.0
            for stage in STAGES
        }

    before = counts()
    publish_timed(["long one", "short one"])
    after = counts()
    assert {stage: after[stage] - before[stage] for stage in STAGES} == dict.fromkeys(STAGES, 2)


def test_timing_header_carries_the_stages_before_publish_only_when_asked() -> None:
    observer, published = publish_timed(["long two", "short two", ""], timing_header=True)
    assert len(published) == 3
    for routed in published:
        headers = dict(routed.headers)
        timing = orjson.loads(headers[TIMING_HEADER])
        stages = observer.seen[routed.source.offset][0]
        assert list(timing) == [stage for stage in STAGES if stage != "publish"]
        for stage, millis in timing.items():
            assert millis == pytest.approx(stages[stage] * 1000, abs=0.01)
    _, plain = publish_timed(["long three"])
    assert TIMING_HEADER not in dict(plain[0].headers)
    assert Settings().timing_header is False
    assert Settings(timing_header="true").timing_header is True  # type: ignore[arg-type]


def test_the_model_pool_stamps_when_a_thread_takes_a_run_tokenizes_and_ends() -> None:
    embedder = open_embedder(EmbedderConfig(threads=1, batch_size=1, concurrency=1))
    try:
        embedder.embed(["warm"])
        first, second = RunTiming(), RunTiming()
        submitted = time.monotonic()
        runs = [
            embedder.submit([" ".join(["word"] * 200)], first),
            embedder.submit(["a short text"], second),
        ]
        vectors = [run.result() for run in runs]
        done = time.monotonic()
    finally:
        embedder.close()
    assert all(vector.shape == (1, 384) for vector in vectors)
    for timing in (first, second):
        assert submitted <= timing.started <= timing.tokenized < timing.finished <= done
    # One thread: the second run waits for the first, and that wait is before it starts.
    assert second.started >= first.finished
