"""Record timestamps are integer milliseconds end to end: every value a producer can send
(int64, -1 for none) reaches the outputs exactly, through the worker's own path (the record
batch as aiokafka reads it, the scorer, its outputs and the cache), and none stops the worker.
A timestamp taken as seconds in a float would not be: 2**53 + 1 came back as 2**53, and
2**63 - 1 as 2**63, which overflowed the cache's int64 times."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt
import orjson
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord
from hypothesis import example, given, settings
from hypothesis import strategies as st

from worker.core.cache import PartitionCaches
from worker.core.records import Decision
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.embedding.protocol import RunTiming
from worker.io.kafka import source_record

from support.traces import trace_bytes

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
TTL_MS = 60_000
DIMS = 8
TIMESTAMPS = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from(
    [-1, 0, 2**53 + 1, INT64_MAX - 511, INT64_MAX, INT64_MIN, INT64_MIN + TTL_MS]
)


class TextEmbedder:
    """Equal texts give equal vectors: a trace seen again has novelty 0 while it is live."""

    model_id = "text-digest"
    dimensions = DIMS

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        digests = [hashlib.sha256(text.encode()).digest()[:DIMS] for text in texts]
        return np.array([list(d) for d in digests], dtype=np.float32) + 1

    def submit(
        self, texts: Sequence[str], timing: RunTiming | None = None
    ) -> Future[npt.NDArray[np.float32]]:
        future: Future[npt.NDArray[np.float32]] = Future()
        future.set_result(self.embed(texts))
        return future

    def close(self) -> None:
        pass


def consumed(offset: int, timestamp_ms: int, value: bytes) -> ConsumerRecord[bytes, bytes]:
    """The record as aiokafka reads it from a record batch on the wire."""
    builder = DefaultRecordBatchBuilder(2, 0, False, 0, 0, 0, 1 << 20)
    builder.append(offset, timestamp_ms, b"k", value, [("x-producer", b"p")])
    batch = MemoryRecords(bytes(builder.build())).next_batch()
    assert batch is not None
    (read,) = list(batch)
    return ConsumerRecord(
        "raw", 0, read.offset, read.timestamp, read.timestamp_type, read.key, read.value,
        read.checksum, len(read.key or b""), len(read.value or b""), tuple(read.headers),
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(first=TIMESTAMPS, second=TIMESTAMPS)
@example(first=2**53 + 1, second=INT64_MAX)
@example(first=-1, second=INT64_MAX)
@example(first=INT64_MAX, second=INT64_MIN)
def test_every_record_timestamp_reaches_the_outputs_exactly(first: int, second: int) -> None:
    scorer = Scorer(
        load_profiles(None), Thresholds(), PartitionCaches(4, DIMS, TTL_MS), TextEmbedder()
    )
    novelty = []
    for offset, timestamp in enumerate((first, second)):
        consumed_records = [consumed(2 * offset, timestamp, trace_bytes())]
        consumed_records.append(consumed(2 * offset + 1, timestamp, b"not json"))
        # The group consumer and the log reader (the cache's rebuild, replay) alike.
        records = [source_record(record) for record in consumed_records]
        scored, dead = scorer.score_batch(records).routed
        assert scored.decision is not Decision.DEAD_LETTER and scored.breakdown is not None
        assert orjson.loads(scored.value or b"")["source"]["timestamp"] == timestamp
        assert dead.decision is Decision.DEAD_LETTER
        assert dict(dead.headers)["kp-source-timestamp"] == str(timestamp).encode()
        novelty.append(scored.breakdown.dimensions.novelty)
    # The same trace again: seen (novelty ~0) iff the first is still live at the second's time.
    assert novelty[0] == 0.5
    assert (novelty[1] < 1e-3) == (first >= second - TTL_MS), novelty[1]


def test_a_record_without_a_timestamp_is_minus_one_on_every_path() -> None:
    """A message format v0 record has none (aiokafka reads None): Kafka's -1, not 0."""
    record = consumed(0, 1, b"{}")
    record.timestamp = None  # type: ignore[assignment]
    assert source_record(record).timestamp_ms == -1
