"""A record batch the Kafka client cannot read becomes dead letters instead of ending the
consumer (``worker/io/unreadable.py``); aiokafka's own reading is checked too, so these tests
fail when the library changes what the override builds on."""

from __future__ import annotations

import inspect

import pytest
from aiokafka import TopicPartition
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords

from worker.core.records import Decision, SourceRecord, UnreadableValue
from worker.core.scorer import build_scorer
from worker.io import unreadable
from worker.settings import Settings

from support.traces import trace_bytes

TP = TopicPartition("kp.traces.raw", 0)
LIMIT = 4 << 20
# aiokafka's own reading, which the override extends.
AIOKAFKA_RECORDS = unreadable.TolerantPartitionRecords.__mro__[1]
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.fixture(autouse=True)
def installed() -> None:
    """As every consumer the product builds installs it (here with a 4 MiB bound)."""
    unreadable.install(LIMIT)


class NotUtf8Name(str):
    """A header name whose bytes on the wire are not UTF-8, as a Go or C producer can send."""

    def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
        return b"\xff\xfe-name"


def batch(
    headers_of: dict[int, list[tuple[str, bytes]]],
    count: int = 3,
    codec: str | None = None,
    value_of: dict[int, bytes] | None = None,
) -> bytes:
    """One record batch of ``count`` records (offsets 0..count-1), values ``v0``, ``v1``, ..."""
    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=CODECS[codec] if codec else 0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 26,
    )
    for offset in range(count):
        value = (value_of or {}).get(offset, f"v{offset}".encode())
        appended = builder.append(
            offset, 1_700_000_000_000, b"k", value, headers_of.get(offset, [])
        )
        assert appended is not None, "the batch is full"
    return bytes(builder.build())


def read(raw: bytes, records_class: type) -> list:
    records = records_class(TP, MemoryRecords(raw), None, 0, None, None, True, "read_uncommitted")
    return list(records)


def test_aiokafka_still_refuses_a_header_name_that_is_not_utf8() -> None:
    """Why the override exists: aiokafka's own reading raises, which ends a consumer."""
    raw = batch({1: [(NotUtf8Name("h"), b"v")]})
    with pytest.raises(Exception, match=r"utf-8|UnicodeDecodeError"):
        read(raw, AIOKAFKA_RECORDS)


def test_the_override_is_installed_for_every_consumer() -> None:
    assert fetcher.PartitionRecords is unreadable.TolerantPartitionRecords
    assert issubclass(fetcher.PartitionRecords, AIOKAFKA_RECORDS)


def test_a_readable_batch_reads_as_aiokafka_reads_it() -> None:
    raw = batch({0: [("trace", b"t")], 2: [("a", b"1"), ("b", b"2")]})
    plain = read(raw, AIOKAFKA_RECORDS)
    tolerant = read(raw, fetcher.PartitionRecords)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in tolerant] == [
        (r.offset, r.key, r.value, r.headers, r.timestamp) for r in plain
    ]
    assert [r.value for r in tolerant] == [b"v0", b"v1", b"v2"]


def test_an_unreadable_batch_is_one_unreadable_record_per_offset() -> None:
    raw = batch({1: [(NotUtf8Name("h"), b"v")]})
    records = read(raw, fetcher.PartitionRecords)
    assert [r.offset for r in records] == [0, 1, 2]
    for record in records:
        assert isinstance(record.value, UnreadableValue)
        assert record.value == b"" and record.key is None and record.headers == ()
        assert "cannot read this record's batch" in record.value.reason
        assert "UnicodeDecodeError" in record.value.reason or "utf-8" in record.value.reason
        assert record.timestamp == 1_700_000_000_000


def test_an_unreadable_record_is_dead_lettered_without_a_value() -> None:
    scorer = build_scorer(Settings(), use_embedder=False)
    unreadable_record = SourceRecord(
        "kp.traces.raw", 0, 7, 1_000, None, UnreadableValue("the Kafka client cannot read it")
    )
    readable = SourceRecord("kp.traces.raw", 0, 8, 1_000, b"k", trace_bytes())
    dead, scored = scorer.score_batch([unreadable_record, readable]).routed
    assert dead.decision is Decision.DEAD_LETTER and dead.error is not None
    assert dead.error.kind == "unreadable"
    assert dead.value is None and dead.key == b""  # publishable: see kp-key-null
    headers = dict(dead.headers)
    assert headers["kp-error-kind"] == b"unreadable"
    assert headers["kp-source-offset"] == b"7"
    assert b"read the original" in headers["kp-value-omitted"]
    assert headers["kp-key-null"] == b"true"
    assert scored.decision is not Decision.DEAD_LETTER


@pytest.mark.parametrize("codec", list(CODECS))
def test_compressed_batches_within_the_bound_read_as_aiokafka_reads_them(codec: str) -> None:
    values = {0: b"x" * (LIMIT // 2), 1: orjson_trace()}
    raw = batch({1: [("h", b"v")]}, codec=codec, value_of=values)
    plain = read(raw, AIOKAFKA_RECORDS)
    assert [(r.offset, r.value, r.headers) for r in read(raw, fetcher.PartitionRecords)] == [
        (r.offset, r.value, r.headers) for r in plain
    ]
    assert plain[0].value == values[0]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_compression_bomb_is_unreadable_records_not_a_whole_decompression(codec: str) -> None:
    """A batch decompressing past the bound is stopped there: its records are dead letters."""
    raw = batch({}, count=2, codec=codec, value_of={0: b"\0" * (3 * LIMIT)})
    assert len(raw) < LIMIT // 20  # small on the wire
    records = read(raw, fetcher.PartitionRecords)
    assert [r.offset for r in records] == [0, 1]
    assert all(isinstance(r.value, UnreadableValue) for r in records)
    assert "KP_MAX_BATCH_BYTES" in records[0].value.reason


def test_the_codecs_of_both_record_modules_are_bounded() -> None:
    """aiokafka decodes batches in its compiled module, or its Python one where that is
    missing: both must use the bounded codecs (the names it calls are still these)."""
    from aiokafka.record import default_records
    from aiokafka.record._crecords import default_records as compiled

    for module in (default_records, compiled):
        for name in ("gzip_decode", "lz4_decode", "zstd_decode"):
            assert getattr(module, name).__module__ == unreadable.__name__, (module, name)


def test_batches_are_still_read_through_partition_records_and_the_codec_functions() -> None:
    """aiokafka still builds each partition's records by the module's name, which the override
    replaces, with the arguments it passes on; the codecs it replaces are still functions."""
    from aiokafka.record import default_records
    from aiokafka.record._crecords import default_records as compiled

    assert list(inspect.signature(AIOKAFKA_RECORDS.__init__).parameters)[:3] == [
        "self",
        "tp",
        "records",
    ]
    assert "PartitionRecords(" in inspect.getsource(fetcher)
    for module in (default_records, compiled):
        for name in ("gzip_decode", "lz4_decode", "zstd_decode"):
            assert callable(getattr(module, name)), f"{module.__name__}.{name}"
    assert AIOKAFKA_RECORDS.__name__ == "PartitionRecords"


def orjson_trace() -> bytes:
    return trace_bytes()


class _ControlBatchBuilder(_DefaultRecordBatchBuilderPy):
    """Writes control batches: a transaction's commit or abort marker."""

    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return int(super()._get_attributes(include_compression_type)) | 0x20


def transactional(offsets: range, producer_id: int = 7, control: bool = False) -> bytes:
    builder = (_ControlBatchBuilder if control else _DefaultRecordBatchBuilderPy)(
        magic=2,
        compression_type=0,
        is_transactional=1,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=-1 if control else offsets[0],
        batch_size=1 << 20,
    )
    for offset in offsets:
        # A control record's key is its version (0) and type (0: abort).
        key = b"\x00\x00\x00\x00" if control else b"k"
        builder.append(offset, 1_700_000_000_000, key, b"" if control else b"v", [])
    return bytes(builder.build())


def test_a_read_committed_fetch_skips_an_aborted_transaction_as_aiokafka_does() -> None:
    """A transaction's marker is read with ``next`` on its batch; the override must allow it."""
    raw = transactional(range(0, 2)) + transactional(range(2, 3), control=True)
    raw += transactional(range(3, 5))
    aborted = [(7, 0)]  # producer 7's transaction from offset 0 was aborted
    read_committed = 1

    def offsets(records_class: type) -> list[int]:
        records = records_class(
            TP, MemoryRecords(raw), aborted, 0, None, None, True, read_committed
        )
        return [r.offset for r in records]

    assert offsets(AIOKAFKA_RECORDS) == [3, 4]
    assert offsets(fetcher.PartitionRecords) == [3, 4]
