"""A header without a value (null on the wire; librdkafka and Java producers send one) keeps
no value on the outputs, which keep the input's headers: a consumer of the outputs reads null,
as it would on the input, not an empty value."""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from worker.core.records import RoutedRecord
from worker.core.scorer import build_scorer
from worker.io.kafka import source_record
from worker.settings import load_settings

from support.traces import trace_bytes

INPUT_HEADERS = [("x-null", None), ("x-empty", b""), ("x-set", b"1")]


def _as_published(routed: RoutedRecord) -> list[tuple[str, bytes | None]]:
    """The headers as aiokafka writes them into a record batch, read back."""
    builder = DefaultRecordBatchBuilder(2, 0, False, 0, 0, 0, 1 << 20)
    builder.append(0, 0, routed.source.key or b"", routed.value, list(routed.headers))
    batch = MemoryRecords(bytes(builder.build())).next_batch()
    assert batch is not None
    (record,) = list(batch)
    return list(record.headers)


def test_a_null_header_value_stays_null_on_every_output(isolated_settings: None) -> None:
    consumed = [
        SimpleNamespace(
            topic="raw",
            partition=0,
            offset=offset,
            timestamp=1_000,
            key=b"k",
            value=value,
            headers=INPUT_HEADERS,
        )
        for offset, value in enumerate([trace_bytes(), b"not json"])
    ]
    records = [source_record(message) for message in consumed]
    assert records[0].headers == tuple(INPUT_HEADERS)
    scorer = build_scorer(load_settings(), use_embedder=False)
    scored, dead_letter = scorer.score_batch(records).routed
    assert scored.breakdown is not None and dead_letter.error is not None
    for routed in (scored, dead_letter):
        assert _as_published(routed)[-3:] == INPUT_HEADERS  # after the scorer's own
