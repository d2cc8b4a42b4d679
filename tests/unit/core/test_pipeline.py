"""Scorer: routing, dead-letter, output format, and novelty through a fake embedder."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

import worker.core.scorer as pipeline_module
from worker import __version__
from worker.core.cache import PartitionCaches
from worker.core.records import OTHER_DOMAIN, Decision, RoutedRecord, SourceRecord
from worker.core.scorer import Scorer, Thresholds, build_scorer
from worker.core.scoring import Novelty, NoveltySource, ProfileSet, load_profiles
from worker.embedding.protocol import RunTiming
from worker.settings import Settings

from support.traces import (
    BUILTIN,
    CODE_REVIEW_EXPECTED_SCORE,
    FINANCE_EXPECTED_SCORE,
    code_review_example,
    finance_example,
    make_trace,
    score_of,
    steps_of,
    trace_bytes,
)

FAKE_DIMS = 32
TOPIC = "kp.traces.raw"


class FakeEmbedder:
    """Deterministic vectors from a hash of the text; records every call."""

    model_id = "fake-sha256"
    dimensions = FAKE_DIMS

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(list(texts))
        rows = []
        for text in texts:
            digest = hashlib.sha256(text.encode()).digest()  # 32 bytes
            rows.append(np.frombuffer(digest, dtype=np.uint8).astype(np.float32) - 127.5)
        return np.stack(rows).astype(np.float32)

    def submit(
        self, texts: Sequence[str], timing: RunTiming | None = None
    ) -> Future[npt.NDArray[np.float32]]:
        future: Future[npt.NDArray[np.float32]] = Future()
        future.set_result(self.embed(texts))
        return future

    def close(self) -> None:
        pass


def record(
    value: bytes | None,
    *,
    offset: int = 0,
    partition: int = 0,
    timestamp_ms: int = 1_000,
    key: bytes | None = b"k",
    headers: tuple[tuple[str, bytes], ...] = (),
    topic: str = TOPIC,
) -> SourceRecord:
    return SourceRecord(topic, partition, offset, timestamp_ms, key, value, headers)


def scorer(
    *,
    embedder: FakeEmbedder | None = None,
    thresholds: Thresholds | None = None,
    profiles: ProfileSet = BUILTIN,
    ttl_ms: int | None = None,
    capacity: int = 1000,
    max_message_bytes: int = 1_048_576,
) -> Scorer:
    return Scorer(
        profiles=profiles,
        thresholds=thresholds or Thresholds(),
        caches=PartitionCaches(capacity, FAKE_DIMS, ttl_ms),
        embedder=embedder,
        max_message_bytes=max_message_bytes,
    )


def score_one(s: Scorer, rec: SourceRecord) -> RoutedRecord:
    result = s.score_batch([rec])
    assert len(result.routed) == 1
    return result.routed[0]


def payload(routed: RoutedRecord) -> dict[str, Any]:
    assert routed.value is not None
    return orjson.loads(routed.value)  # type: ignore[no-any-return]


def headers_of(routed: RoutedRecord) -> dict[str, bytes]:
    return dict(routed.headers)


# --- routing without an embedder ---------------------------------------------------------


def test_valid_and_invalid_records_are_routed() -> None:
    s = scorer(thresholds=Thresholds(0.7))
    records = [
        record(orjson.dumps(finance_example()), offset=0),  # 0.724 -> accepted
        record(orjson.dumps(code_review_example()), offset=1),  # 0.66875 -> rejected
        record(b"{broken", offset=2),
        record(None, offset=3),  # tombstone
        record(trace_bytes(steps=[]), offset=4),  # schema
        record(b"", offset=5),
    ]
    result = s.score_batch(records)
    decisions = [r.decision for r in result.routed]
    assert decisions == [
        Decision.ACCEPTED,
        Decision.REJECTED,
        Decision.DEAD_LETTER,
        Decision.DEAD_LETTER,
        Decision.DEAD_LETTER,
        Decision.DEAD_LETTER,
    ]
    assert [r.source for r in result.routed] == records  # one output per input, in order
    assert result.embedded == 2
    assert [r.error.kind for r in result.routed[2:] if r.error] == [
        "invalid_json",
        "empty",
        "schema",
        "empty",
    ]
    assert result.routed[0].breakdown is not None
    assert result.routed[0].breakdown.score == pytest.approx(FINANCE_EXPECTED_SCORE, abs=1e-9)
    assert result.routed[1].breakdown is not None
    assert result.routed[1].breakdown.score == pytest.approx(CODE_REVIEW_EXPECTED_SCORE, abs=1e-9)
    assert orjson.loads(result.routed[0].value or b"")["trace"]["id"] == "kp:trace:finance-demo-001"
    assert result.routed[0].domain_label == "finance"
    assert result.routed[1].domain_label == OTHER_DOMAIN  # code-review is not a profile
    assert result.routed[2].domain_label == OTHER_DOMAIN


def test_default_threshold_is_0_75() -> None:
    assert Thresholds().default == 0.75
    routed = score_one(scorer(), record(orjson.dumps(finance_example())))
    assert routed.decision is Decision.REJECTED  # 0.724 < 0.75


def test_score_equal_to_threshold_is_accepted() -> None:
    raw = orjson.dumps(code_review_example())
    exact = score_of(code_review_example()).score
    assert score_one(scorer(thresholds=Thresholds(exact)), record(raw)).decision is (
        Decision.ACCEPTED
    )
    above = float(np.nextafter(exact, 1.0))
    assert score_one(scorer(thresholds=Thresholds(above)), record(raw)).decision is (
        Decision.REJECTED
    )


def test_per_domain_threshold_overrides_the_default() -> None:
    thresholds = Thresholds(0.99, {"finance": 0.5, "code-review": 0.7})
    assert thresholds.for_domain("finance") == 0.5
    assert thresholds.for_domain("medical") == 0.99
    s = scorer(thresholds=thresholds)
    finance = score_one(s, record(orjson.dumps(finance_example())))
    review = score_one(s, record(orjson.dumps(code_review_example())))
    other = score_one(s, record(orjson.dumps(finance_example() | {"id": "kp:trace:x"})))
    assert finance.decision is Decision.ACCEPTED
    assert payload(finance)["score"]["threshold"] == 0.5
    assert review.decision is Decision.REJECTED  # 0.66875 < 0.7
    assert payload(review)["score"]["threshold"] == 0.7
    assert other.decision is Decision.ACCEPTED
    medical = finance_example()
    medical["metadata"]["task_domain"] = "medical"
    routed = score_one(s, record(orjson.dumps(medical)))
    assert routed.decision is Decision.REJECTED
    assert payload(routed)["score"]["threshold"] == 0.99


# --- dead letter --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (b"not json at all", "invalid_json"),
        (b"[1,2,3]", "not_object"),
        (b'{"a":1,"a":2}', "duplicate_key"),
        (b"\xff\xfe\x00", "invalid_encoding"),
        (trace_bytes(metadata={"visibility": "public"}), "schema"),
        (b"", "empty"),
        (None, "empty"),
    ],
)
def test_dead_letter_keeps_bytes_and_explains(value: bytes | None, kind: str) -> None:
    rec = record(
        value, offset=41, partition=3, timestamp_ms=1234, key=b"agent-1", headers=(("h", b"v"),)
    )
    routed = score_one(scorer(), rec)
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.value == value  # original bytes untouched (None stays None)
    assert routed.key == b"agent-1"
    assert routed.breakdown is None
    assert routed.error is not None and routed.error.kind == kind
    headers = headers_of(routed)
    assert routed.headers[-1] == ("h", b"v")  # input headers kept, after the scorer's
    assert headers["kp-error-kind"] == kind.encode()
    assert headers["kp-error-reason"].decode() == routed.error.reason
    assert headers["kp-source-topic"] == TOPIC.encode()
    assert headers["kp-source-partition"] == b"3"
    assert headers["kp-source-offset"] == b"41"
    assert headers["kp-source-timestamp"] == b"1234"
    assert headers["kp-scorer-version"] == __version__.encode()


def test_schema_dead_letter_reason_names_the_field() -> None:
    routed = score_one(scorer(), record(trace_bytes(metadata={"visibility": "public"})))
    assert headers_of(routed)["kp-error-reason"] == (
        b"metadata.visibility: 'public' is not one of private, org, network"
    )


@pytest.mark.parametrize(
    ("key", "path"),
    [
        (b"a\\nb", r"['a\nb']"),
        (b"cr\\r\\nlf", r"['cr\r\nlf']"),
        (b"x\\u2028y", r"['x\u2028y']"),
        (b"\\u0085", r"['\x85']"),
        (b"plain key", "plain key"),
    ],
)
def test_a_reason_stays_one_line_whatever_the_keys_on_its_path(key: bytes, path: str) -> None:
    """A producer's key goes into the reason's JSON path: escaped where it would break it."""
    raw = trace_bytes()[:-1] + b',"' + key + b'":{"n":123456789012345678901234567890}}'
    routed = score_one(scorer(), record(raw))
    reason = headers_of(routed)["kp-error-reason"].decode()
    assert reason.startswith(f"{path}.n: integer 123456789012345678901234567890 "), reason
    assert reason.isprintable(), reason  # no line break, whatever a log or a viewer takes as one


def test_too_large_uses_the_scorers_limit() -> None:
    raw = trace_bytes()
    routed = score_one(scorer(max_message_bytes=len(raw) - 1), record(raw))
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.value == raw
    assert headers_of(routed)["kp-error-kind"] == b"too_large"
    assert score_one(scorer(max_message_bytes=len(raw)), record(raw)).decision is not (
        Decision.DEAD_LETTER
    )


@pytest.mark.parametrize("levels", [127, 128, 260, 1000])
def test_deeply_nested_extra_field_is_never_an_internal_error(levels: int) -> None:
    raw = trace_bytes()[:-1] + b',"x":' + b"[" * levels + b"]" * levels + b"}"
    routed = score_one(scorer(thresholds=Thresholds(0.0)), record(raw))
    if levels < 128:
        assert routed.decision is Decision.ACCEPTED
        assert payload(routed)["trace"]["x"] == orjson.loads(raw)["x"]
    else:
        assert routed.decision is Decision.DEAD_LETTER
        assert routed.error is not None and routed.error.kind == "invalid_json"
        assert routed.value == raw


def test_internal_error_is_dead_lettered_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(pipeline_module, "score_trace", broken)
    raw = trace_bytes()
    routed = score_one(scorer(), record(raw))
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.value == raw
    assert headers_of(routed)["kp-error-kind"] == b"internal"
    assert b"boom" in headers_of(routed)["kp-error-reason"]


# --- scored output ------------------------------------------------------------------------


def test_scored_value_format() -> None:
    document = make_trace(
        domain="code",
        x_extra={"keep": [1, 2]},
        metadata={"agent_id": "a-1", "quality_score": 0.42},
    )
    rec = record(
        orjson.dumps(document),
        offset=17,
        partition=2,
        timestamp_ms=99,
        key=b"agent",
        headers=(("trace", b"t"),),
    )
    routed = score_one(scorer(thresholds=Thresholds(0.5)), rec)
    assert routed.breakdown is not None
    out = payload(routed)
    assert set(out) == {"trace", "score", "scorer", "source"}
    # the trace, unchanged except for metadata.quality_score
    assert out["trace"]["metadata"]["quality_score"] == routed.breakdown.score
    expected_trace = {**document, "metadata": {**document["metadata"]}}
    expected_trace["metadata"]["quality_score"] = routed.breakdown.score
    assert out["trace"] == expected_trace
    assert out["trace"]["x_extra"] == {"keep": [1, 2]}
    assert document["metadata"]["quality_score"] == 0.42  # input document not mutated

    score = out["score"]
    assert score["score"] == routed.breakdown.score
    assert set(score["dimensions"]) == {"complexity", "novelty", "tool_diversity", "outcome"}
    assert score["dimensions"]["novelty"] == 0.5
    assert score["profile"] == "code"
    assert score["weights"] == {
        "complexity": 0.2,
        "novelty": 0.3,
        "tool_diversity": 0.3,
        "outcome": 0.2,
    }
    assert score["overrides"] == ["low_tool_diversity"]  # one tool ("search")
    assert score["novelty_source"] == "no_embedder"
    assert score["threshold"] == 0.5
    assert score["decision"] == routed.decision.value
    assert score["composite"] == pytest.approx(score["score"] + 0.1, abs=1e-12)
    assert out["scorer"] == {"version": __version__, "model": None, "embedder_available": False}
    assert out["source"] == {"topic": TOPIC, "partition": 2, "offset": 17, "timestamp": 99}

    assert routed.key == b"agent"
    headers = headers_of(routed)
    assert routed.headers[0][0] == "kp-decision" and routed.headers[-1] == ("trace", b"t")
    assert headers["kp-decision"] == routed.decision.value.encode()
    assert float(headers["kp-score"]) == routed.breakdown.score
    assert headers["kp-scorer-version"] == __version__.encode()


SPOOFED_HEADERS = (
    ("kp-decision", b"accepted"),
    ("KP-Score", b"1.0"),
    ("kp-error-kind", b"none"),
    ("trace", b"t"),
)


@pytest.mark.parametrize(
    "value",
    [trace_bytes(metadata={"success": False}), b"{not json", None],
    ids=["rejected", "dead_letter", "tombstone"],
)
def test_producer_kp_headers_never_reach_an_output(value: bytes | None) -> None:
    """``kp-*`` headers are the scorer's: a producer's own are dropped, in any case."""
    routed = score_one(scorer(), record(value, headers=SPOOFED_HEADERS))
    names = [name for name, _ in routed.headers]
    assert routed.headers[-1] == ("trace", b"t")  # other input headers kept, after the scorer's
    assert "KP-Score" not in names
    assert len(names) == len(set(names))  # each scorer header once
    if routed.decision is Decision.DEAD_LETTER:
        assert headers_of(routed)["kp-error-kind"] != b"none"
        assert "kp-decision" not in names
    else:
        assert headers_of(routed)["kp-decision"] == routed.decision.value.encode()


def test_overrides_listed_in_output() -> None:
    raw = trace_bytes(steps=steps_of("thought"))
    out = payload(score_one(scorer(), record(raw)))
    assert out["score"]["overrides"] == ["single_thought"]
    assert out["score"]["score"] == 0.1
    assert out["trace"]["metadata"]["quality_score"] == 0.1


def test_domain_labels_are_bounded() -> None:
    s = scorer()
    assert s.domain_label("finance") == "finance"
    assert s.domain_label("default") == "default"
    assert s.domain_label("x" * 1000) == OTHER_DOMAIN
    assert s.domain_label(None) == OTHER_DOMAIN


# --- novelty through the pipeline (fake embedder) -----------------------------------------


def texts_record(objective: str, offset: int, partition: int = 0, ts: int = 1_000) -> SourceRecord:
    raw = trace_bytes(objective=objective, steps=steps_of("thought", "observation"))
    return record(raw, offset=offset, partition=partition, timestamp_ms=ts)


def novelty_of(routed: RoutedRecord) -> tuple[float, NoveltySource]:
    assert routed.breakdown is not None
    return routed.breakdown.dimensions.novelty, routed.breakdown.novelty_source


def test_first_record_gets_empty_cache_then_duplicate_is_not_novel() -> None:
    embedder = FakeEmbedder()
    s = scorer(embedder=embedder)
    first = score_one(s, texts_record("Investigate the outage", 0))
    assert novelty_of(first) == (0.5, NoveltySource.EMPTY_CACHE)
    duplicate = score_one(s, texts_record("Investigate the outage", 1))
    value, source = novelty_of(duplicate)
    assert source is NoveltySource.EMBEDDING
    assert value == pytest.approx(0.0, abs=1e-5)
    different = score_one(s, texts_record("Plan the migration", 2))
    value, source = novelty_of(different)
    assert source is NoveltySource.EMBEDDING
    assert value > 0.3
    out = payload(different)
    assert out["score"]["novelty_source"] == "embedding"
    assert out["scorer"] == {
        "version": __version__,
        "model": "fake-sha256",
        "embedder_available": True,
    }
    # the text embedded is the objective and the step contents
    assert embedder.calls[0] == ["Investigate the outage thought 0 observation 1"]


def test_partitions_are_isolated() -> None:
    s = scorer(embedder=FakeEmbedder())
    assert novelty_of(score_one(s, texts_record("same", 0, partition=0)))[1] is (
        NoveltySource.EMPTY_CACHE
    )
    assert novelty_of(score_one(s, texts_record("same", 0, partition=1)))[1] is (
        NoveltySource.EMPTY_CACHE
    )
    assert novelty_of(score_one(s, texts_record("same", 1, partition=1)))[0] == pytest.approx(
        0.0, abs=1e-5
    )
    assert s.caches.sizes() == {(TOPIC, 0): 1, (TOPIC, 1): 2}


def test_ttl_on_record_time() -> None:
    s = scorer(embedder=FakeEmbedder(), ttl_ms=1_000)
    score_one(s, texts_record("same", 0, ts=0))
    assert novelty_of(score_one(s, texts_record("same", 1, ts=1_000)))[0] == pytest.approx(
        0.0, abs=1e-5
    )
    # 2_001 - 1_000 > ttl: every earlier entry has expired
    assert novelty_of(score_one(s, texts_record("same", 2, ts=2_001))) == (
        0.5,
        NoveltySource.EMPTY_CACHE,
    )


def test_dead_letters_never_touch_the_cache() -> None:
    embedder = FakeEmbedder()
    s = scorer(embedder=embedder)
    result = s.score_batch([record(b"nope", offset=0), record(None, offset=1)])
    assert result.embedded == 0
    assert embedder.calls == []
    assert s.caches.sizes() == {}
    score_one(s, texts_record("x", 2))
    score_one(s, record(b"{}", offset=3))
    assert s.caches.sizes() == {(TOPIC, 0): 1}


def test_rejected_traces_still_enter_the_cache() -> None:
    s = scorer(embedder=FakeEmbedder(), thresholds=Thresholds(1.0))
    assert score_one(s, texts_record("a", 0)).decision is Decision.REJECTED
    assert s.caches.sizes() == {(TOPIC, 0): 1}


def mixed_records() -> list[SourceRecord]:
    rng = np.random.default_rng(5)
    objectives = ["alpha", "beta", "gamma", "delta"]
    out = []
    for offset in range(40):
        partition = int(rng.integers(0, 3))
        roll = rng.random()
        if roll < 0.1:
            value = b"garbage"
        elif roll < 0.15:
            value = None
        else:
            value = trace_bytes(
                objective=str(rng.choice(objectives)),
                steps=steps_of("thought", "tool_call", tools={1: str(rng.choice(["a", "b"]))}),
                domain=str(rng.choice(["finance", "code", "misc"])),
            )
        out.append(
            record(
                value,
                offset=offset,
                partition=partition,
                timestamp_ms=int(rng.integers(0, 5_000)),
            )
        )
    return out


def test_batch_equals_one_at_a_time() -> None:
    records = mixed_records()
    batched = scorer(embedder=FakeEmbedder(), ttl_ms=2_000, capacity=3)
    single = scorer(embedder=FakeEmbedder(), ttl_ms=2_000, capacity=3)
    together = batched.score_batch(records).routed
    alone = [score_one(single, rec) for rec in records]
    assert [r.value for r in together] == [r.value for r in alone]  # byte-identical output
    assert [r.headers for r in together] == [r.headers for r in alone]
    assert [r.decision for r in together] == [r.decision for r in alone]
    sources = {novelty_of(r)[1] for r in together if r.breakdown is not None}
    assert sources == {NoveltySource.EMPTY_CACHE, NoveltySource.EMBEDDING}
    # uneven chunks agree as well
    chunked = scorer(embedder=FakeEmbedder(), ttl_ms=2_000, capacity=3)
    pieces = [records[:7], records[7:8], records[8:30], records[30:]]
    in_chunks = [r for piece in pieces for r in chunked.score_batch(piece).routed]
    assert [r.value for r in in_chunks] == [r.value for r in together]


def test_warm_partition_rebuilds_the_cache() -> None:
    history = [texts_record("seen before", 0), record(b"bad", offset=1), texts_record("x", 2)]
    s = scorer(embedder=FakeEmbedder())
    traces = s.valid_traces(history)
    assert [rec.offset for rec, _ in traces] == [0, 2]  # dead-lettered input is skipped
    assert s.warm_partition((TOPIC, 0), traces) == (0, 2)
    assert s.caches.sizes() == {(TOPIC, 0): 2}
    routed = score_one(s, texts_record("seen before", 3))
    assert novelty_of(routed)[0] == pytest.approx(0.0, abs=1e-5)
    # the same as a worker that scored the history live
    live = scorer(embedder=FakeEmbedder())
    live.score_batch(history)
    assert score_one(live, texts_record("seen before", 3)).value == routed.value
    assert scorer().warm_partition((TOPIC, 0), traces) == (0, 0)  # no embedder: nothing to rebuild
    assert scorer(embedder=FakeEmbedder()).warm_partition((TOPIC, 0), []) == (0, 0)


def test_warm_partition_with_expiry_matches_the_live_run() -> None:
    # Insertion order P, Q, R with Q out of order in time; capacity 2 evicts P.
    history = [
        texts_record("P", 0, ts=3_500),
        texts_record("Q", 1, ts=0),
        texts_record("R", 2, ts=3_600),
    ]
    # The first is stamped back in time: Q, too old for the others, is live for it.
    upcoming = [
        texts_record("Q", 3, ts=500),
        texts_record("P", 4, ts=4_000),
        texts_record("R", 5, ts=4_100),
    ]
    live = scorer(embedder=FakeEmbedder(), ttl_ms=1_000, capacity=2)
    live.score_batch(history)
    expected = live.score_batch(upcoming).routed

    rebuilt = scorer(embedder=FakeEmbedder(), ttl_ms=1_000, capacity=2)
    traces = rebuilt.valid_traces(history)
    assert rebuilt.warm_partition((TOPIC, 0), traces) == (0, 3)
    got = rebuilt.score_batch(upcoming).routed
    assert [r.value for r in got] == [r.value for r in expected]
    assert novelty_of(got[0])[0] == pytest.approx(0.0, abs=1e-5)
    # P was evicted in the live run: its duplicate is novel against R only
    assert novelty_of(got[1])[1] is NoveltySource.EMBEDDING
    assert novelty_of(got[1])[0] > 0.3


# --- build_scorer -------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("KP_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_build_scorer_without_embedder(tmp_path: Any) -> None:
    s = build_scorer(Settings(), use_embedder=False)
    assert s.embedder is None
    assert s.embedder_reason == "disabled by flag"
    assert s.thresholds == Thresholds(0.75, {})
    assert s.caches.capacity == 1000
    assert s.caches.ttl_ms is None
    assert s.profiles.names == frozenset(BUILTIN.names)
    assert s.max_message_bytes == 1_048_576

    profiles = tmp_path / "p.json"
    profiles.write_bytes(
        orjson.dumps(
            {"default": {"complexity": 0.5, "novelty": 0.0, "tool_diversity": 0.0, "outcome": 0.5}}
        )
    )
    settings = Settings(
        cache_ttl_seconds=1.5,
        cache_capacity=7,
        accept_threshold=0.6,
        domain_thresholds={"finance": 0.2},
        profiles_file=profiles,
        max_message_bytes=100,
    )
    s = build_scorer(settings, use_embedder=False)
    assert s.caches.ttl_ms == 1500
    assert s.caches.capacity == 7
    assert s.thresholds.for_domain("finance") == 0.2
    assert s.thresholds.for_domain("code") == 0.6
    assert s.profiles.names == load_profiles(profiles).names == frozenset({"default"})
    assert s.max_message_bytes == 100


def test_novelty_helpers_feed_the_breakdown() -> None:
    # the pipeline passes novelty through untouched: N = 1 - similarity
    breakdown = score_of(make_trace(), Novelty.from_similarity(0.25))
    assert breakdown.dimensions.novelty == 0.75
    assert breakdown.novelty_source is NoveltySource.EMBEDDING


# --- exact-duplicate reuse ------------------------------------------------------------------


def repeated_texts_log() -> list[SourceRecord]:
    """Two partitions, texts that repeat within a batch and across batches, with a small
    cache so some repeats are evicted before they come back."""
    objectives = ["alpha", "beta", "alpha", "gamma", "beta", "delta", "alpha", "epsilon"] * 3
    return [
        texts_record(objective, offset=i // 2, partition=i % 2, ts=1_000 + i)
        for i, objective in enumerate(objectives)
    ]


def in_offset_batches(s: Scorer, records: list[SourceRecord], size: int) -> list[RoutedRecord]:
    routed: list[RoutedRecord] = []
    for start in range(0, len(records), size):
        routed += s.score_batch(records[start : start + size]).routed
    return routed


@pytest.mark.parametrize("batch", [1, 3, 48])
def test_identical_texts_reuse_vectors_with_bit_identical_scores(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = repeated_texts_log()
    embedder = FakeEmbedder()
    reused = scorer(embedder=embedder, capacity=3)
    with_reuse = in_offset_batches(reused, records, batch)
    distinct_runs = sum(len(call) for call in embedder.calls)

    monkeypatch.setattr(PartitionCaches, "row_for_text", lambda *_: None)
    without_reuse = [
        score_one(fresh, rec)
        for fresh in [scorer(embedder=FakeEmbedder(), capacity=3)]
        for rec in records
    ]
    assert [r.breakdown for r in with_reuse] == [r.breakdown for r in without_reuse]
    assert [r.value for r in with_reuse] == [r.value for r in without_reuse]
    assert distinct_runs < len(records), "repeated texts did not run the model again"


def test_reuse_is_counted_and_an_evicted_text_runs_the_model_again() -> None:
    embedder = FakeEmbedder()
    s = scorer(embedder=embedder, capacity=2)
    first = s.score_batch([texts_record("alpha", 0), texts_record("beta", 1)])
    assert (first.reused, len(embedder.calls)) == (0, 1)
    again = s.score_batch([texts_record("alpha", 2)])  # still cached
    assert (again.reused, len(embedder.calls)) == (1, 1)
    s.score_batch([texts_record("gamma", 3), texts_record("delta", 4)])  # evicts alpha
    evicted = s.score_batch([texts_record("alpha", 5)])
    assert evicted.reused == 0 and embedder.calls[-1] == [embedder.calls[0][0]]
    other_partition = s.score_batch([texts_record("delta", 0, partition=1)])
    assert other_partition.reused == 0, "reuse is per partition: the cache is partition-local"
