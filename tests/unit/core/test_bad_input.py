"""Hostile and malformed input: the corpus in ``tests/data/bad/`` against the parser and scorer.

The corpus and its manifest are described in ``support/bad_corpus.py``. Every entry through
``parse_trace`` (and ``Scorer.score_batch`` without an embedder) gives its manifest kind and a
one-line, bounded reason. The same corpus through a real worker is
``tests/broker/test_bad_input_broker.py``.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from worker.core.cache import PartitionCaches
from worker.core.errors import INPUT_ERROR_KINDS, OutputTooLargeError, TraceError
from worker.core.records import Decision, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.core.trace import parse_trace

from support.bad_corpus import BAD_DIR, MANIFEST, VALID, corpus_bytes

# Kinds the pipeline decides after a successful parse (the trace itself is valid).
PIPELINE_KINDS = (OutputTooLargeError.kind,)
MAX_REASON_CHARS = 300
COMMITTED_LIMIT_BYTES = 1_000_000


def _no_embedder_scorer() -> Scorer:
    return Scorer(load_profiles(None), Thresholds(), PartitionCaches(1000), embedder=None)


# -- the corpus itself ---------------------------------------------------------------------


def test_corpus_is_complete_small_and_described() -> None:
    files = {p.name for p in BAD_DIR.iterdir() if p.name != "MANIFEST.json"}
    listed = {name for name, entry in MANIFEST.items() if "generate" not in entry}
    generated = {name for name, entry in MANIFEST.items() if "generate" in entry}
    assert files == listed, f"unlisted: {files - listed}, missing: {listed - files}"
    assert not generated & files
    committed = sum((BAD_DIR / name).stat().st_size for name in files)
    assert committed < COMMITTED_LIMIT_BYTES
    bad = [n for n, e in MANIFEST.items() if e["kind"] != VALID]
    assert len(bad) >= 60
    contents = {corpus_bytes(name) for name in MANIFEST}
    assert len(contents) == len(MANIFEST), "every entry is a distinct input"
    for name, entry in MANIFEST.items():
        assert entry["kind"] in (*INPUT_ERROR_KINDS, *PIPELINE_KINDS, VALID), name
        assert entry["description"].strip(), name
    kinds = Counter(entry["kind"] for entry in MANIFEST.values())
    print(
        f"\ncorpus: {len(MANIFEST)} entries ({len(bad)} malformed), {len(files)} files, "
        f"{committed:,} bytes committed, {len(generated)} generated; "
        f"kinds: {dict(sorted(kinds.items()))}"
    )
    missing = set(INPUT_ERROR_KINDS) - set(kinds)
    assert not missing, f"kinds never exercised: {missing}"


# -- (a) pure: parser and scorer -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_parse_gives_manifest_kind_and_readable_reason(name: str) -> None:
    entry = MANIFEST[name]
    raw = corpus_bytes(name)
    started = time.perf_counter()
    if entry["kind"] in (VALID, *PIPELINE_KINDS):
        parsed = parse_trace(raw)
        assert parsed.id.startswith("kp:trace:")
        return
    with pytest.raises(TraceError) as caught:
        parse_trace(raw)
    seconds = time.perf_counter() - started
    error = caught.value
    assert error.kind == entry["kind"], f"{name}: {entry['description']}: {error.reason}"
    reason = error.reason
    assert reason.strip(), "a reason a producer can act on"
    assert "\n" not in reason and "\r" not in reason, "one line"
    assert len(reason) <= MAX_REASON_CHARS, f"{len(reason)} chars: {reason[:120]}..."
    assert "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" not in reason
    if "reason_contains" in entry:
        assert entry["reason_contains"] in reason, reason
    if len(raw) > 100_000:
        print(f"\n{name}: {len(raw):,} bytes -> {error.kind} in {seconds * 1000:.1f} ms")


def test_scorer_routes_every_entry_as_the_manifest_says() -> None:
    """The same corpus through the whole pure pipeline (decode, score, route), no Kafka."""
    scorer = _no_embedder_scorer()
    names = sorted(MANIFEST)
    records = [
        SourceRecord("bad", 0, offset, 1_700_000_000_000, name.encode(), corpus_bytes(name))
        for offset, name in enumerate(names)
    ]
    started = time.perf_counter()
    result = scorer.score_batch(records)
    seconds = time.perf_counter() - started
    assert len(result.routed) == len(records)
    for name, routed in zip(names, result.routed, strict=True):
        expected = MANIFEST[name]["kind"]
        if expected == VALID:
            assert routed.decision in (Decision.ACCEPTED, Decision.REJECTED), name
            assert routed.breakdown is not None and 0.0 <= routed.breakdown.score <= 1.0
        else:
            assert routed.decision is Decision.DEAD_LETTER, name
            assert routed.error is not None and routed.error.kind == expected, name
            assert routed.value == corpus_bytes(name), "original bytes untouched"
    print(f"\n{len(records)} corpus entries scored and routed in {seconds:.2f} s (no embedder)")
