"""Schema Registry framing (``KP_INPUT_FRAMING``): a framed record scores as its document.

Records are framed by ``confluent_kafka``'s own JSON serializer against its in-process mock
registry (``support/registry.py``), byte for byte what a producer using a registry sends.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import orjson
import pytest

from unit.core.test_output_schemas import validator
from worker.core.cache import PartitionCaches
from worker.core.errors import FramingError, TraceError
from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.core.rescoring import Rescored, Rescorer
from worker.core.scorer import Scorer, Thresholds, build_scorer
from worker.core.scoring import load_profiles
from worker.core.trace import Framing, parse_trace, unframe
from worker.settings import SettingsError, load_settings

from support.paths import REPO
from support.registry import Registry, schema_id_of
from support.traces import varied_traces

TOPIC = "kp.traces.raw"


def documents() -> list[dict]:
    return varied_traces(12)


def plain(document: dict) -> bytes:
    return orjson.dumps(document)


def by_hand(document: dict, schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + orjson.dumps(document)


def routed_one(value: bytes | None, framing: Framing = "auto", **limits: int) -> RoutedRecord:
    scorer = Scorer(
        load_profiles(None), Thresholds(), PartitionCaches(100), None, framing=framing, **limits
    )
    record = SourceRecord(TOPIC, 0, 7, 1_700_000_000_000, b"key", value)
    return scorer.score_batch([record]).routed[0]


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry()


def test_a_framed_record_scores_as_its_plain_document(registry: Registry) -> None:
    """Same score, decision and output, field for field, but ``source.schema_id``; the model
    on (each in a fresh scorer, so novelty starts alike)."""
    settings = load_settings()
    check = validator("scored-trace.schema.json")
    framed_scorer, plain_scorer = build_scorer(settings), build_scorer(settings)
    docs = documents()
    framed_values = [registry.frame(document, TOPIC) for document in docs]
    assert all(value[:1] == b"\x00" for value in framed_values)

    def records(values: list[bytes]) -> list[SourceRecord]:
        return [
            SourceRecord(TOPIC, 0, offset, 1_700_000_000_000 + offset, b"k", value)
            for offset, value in enumerate(values)
        ]

    framed = framed_scorer.score_batch(records(framed_values)).routed
    unframed = plain_scorer.score_batch(records([plain(d) for d in docs])).routed
    assert {r.decision for r in framed} == {Decision.ACCEPTED, Decision.REJECTED}
    for framed_out, plain_out, value in zip(framed, unframed, framed_values, strict=True):
        assert framed_out.decision is plain_out.decision
        assert framed_out.breakdown == plain_out.breakdown
        assert framed_out.headers == plain_out.headers
        framed_doc, plain_doc = orjson.loads(framed_out.value), orjson.loads(plain_out.value)
        check.validate(framed_doc)
        assert framed_doc["source"].pop("schema_id") == schema_id_of(value)
        assert "schema_id" not in plain_doc["source"]
        assert framed_doc == plain_doc


def test_the_schema_id_is_read_big_endian() -> None:
    document = documents()[0]
    trace = parse_trace(by_hand(document, 70_000))
    assert trace.schema_id == 70_000
    assert trace.document == document
    assert parse_trace(plain(document)).schema_id is None
    routed = routed_one(by_hand(document, 2**32 - 1))
    assert orjson.loads(routed.value)["source"]["schema_id"] == 2**32 - 1


def test_json_framing_dead_letters_a_framed_record_as_invalid_json(registry: Registry) -> None:
    value = registry.frame(documents()[0], TOPIC)
    routed = routed_one(value, "json")
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.error is not None and routed.error.kind == "invalid_json"
    assert routed.value == value, "the framed bytes as received"
    assert routed_one(plain(documents()[0]), "json").decision is not Decision.DEAD_LETTER


def test_confluent_framing_dead_letters_a_plain_record(registry: Registry) -> None:
    value = plain(documents()[0])
    routed = routed_one(value, "confluent")
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.error is not None and routed.error.kind == "framing"
    assert "magic byte 0" in routed.error.reason and "KP_INPUT_FRAMING" in routed.error.reason
    assert routed.value == value
    framed = routed_one(registry.frame(documents()[0], TOPIC), "confluent")
    assert framed.decision is not Decision.DEAD_LETTER
    assert routed_one(None, "confluent").error.kind == "empty", "a tombstone stays empty"


@pytest.mark.parametrize("framing", ["auto", "confluent"])
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\x00", "cut short: magic byte 0 and 0 of the 4 schema-id bytes"),
        (b"\x00\x00\x00\x11", "cut short: magic byte 0 and 3 of the 4 schema-id bytes"),
        (b"\x00\x00\x00\x00\x11", "frame (schema id 17) holds no document"),
    ],
)
def test_a_truncated_frame_is_dead_lettered_with_its_reason(
    framing: Framing, value: bytes, reason: str
) -> None:
    routed = routed_one(value, framing)
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.error is not None and routed.error.kind == "framing"
    assert reason in routed.error.reason
    assert routed.value == value
    assert dict(routed.headers)["kp-error-kind"] == b"framing"


def test_a_framed_document_is_checked_as_any_other(registry: Registry) -> None:
    document = documents()[0]
    del document["steps"]
    routed = routed_one(registry.frame(document, TOPIC))
    assert routed.error is not None and routed.error.kind == "schema"
    with pytest.raises(TraceError) as caught:
        parse_trace(by_hand(documents()[0], 1)[:-1])
    assert caught.value.kind == "invalid_json"


def test_the_size_limit_counts_the_frame() -> None:
    """``KP_MAX_MESSAGE_BYTES`` is the value as received: a frame whose document alone fits
    but whose value does not is ``too_large``."""
    value = by_hand(documents()[0], 17)
    fits = routed_one(value, max_message_bytes=len(value))
    assert fits.decision is not Decision.DEAD_LETTER
    over = routed_one(value, max_message_bytes=len(value) - 1)
    assert over.error is not None and over.error.kind == "too_large"
    assert f"{len(value)} bytes" in over.error.reason


def test_unframe_is_the_one_rule() -> None:
    assert unframe(b'{"a": 1}') == (b'{"a": 1}', None)
    assert unframe(b"\x00\x00\x00\x01\x00{}") == (b"{}", 256)
    assert unframe(b"\x00\x00\x00\x01\x00{}", "json") == (b"\x00\x00\x00\x01\x00{}", None)
    with pytest.raises(FramingError):
        unframe(b" {}", "confluent")


def test_input_framing_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().input_framing == "auto"
    monkeypatch.setenv("KP_INPUT_FRAMING", "confluent")
    settings = load_settings()
    assert settings.input_framing == "confluent"
    assert build_scorer(settings, use_embedder=False).framing == "confluent"
    monkeypatch.setenv("KP_INPUT_FRAMING", "avro")
    with pytest.raises(SettingsError, match="KP_INPUT_FRAMING"):
        load_settings()


def test_offline_score_reads_plain_lines_whatever_the_input_framing(tmp_path) -> None:
    """`kp-scorer score` reads JSON lines: KP_INPUT_FRAMING=confluent does not refuse them,
    and its output has no schema_id."""
    lines = [plain(document) for document in documents()[:2]]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "score", "--no-embedder", "--quiet", "in.jsonl"],
        cwd=tmp_path,
        env={**_env(), "KP_INPUT_FRAMING": "confluent"},
        capture_output=True,
        timeout=120,
        check=True,
    )
    outputs = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert len(outputs) == 2
    for output in outputs:
        assert "score" in output
        assert set(output["source"]) == {"topic", "partition", "offset", "timestamp"}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_rescore_keeps_the_schema_id(registry: Registry) -> None:
    """`rescore` (a file or the output topics) re-scores the recorded output: its source, the
    schema id included, is carried over."""
    value = registry.frame(documents()[0], TOPIC)
    scorer = build_scorer(load_settings())
    record = SourceRecord(TOPIC, 0, 3, 1_700_000_000_000, b"k", value)
    output = scorer.score_batch([record]).routed[0]
    rescored = Rescorer(load_profiles(None), 0.0).rescore_value(output.value)
    assert isinstance(rescored, Rescored)
    assert orjson.loads(rescored.value)["source"] == orjson.loads(output.value)["source"]
    assert orjson.loads(rescored.value)["source"]["schema_id"] == schema_id_of(value)
