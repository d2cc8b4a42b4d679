"""Property tests: every valid trace scores in [0, 1]; no bytes make the parser crash."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import orjson
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from worker.core.cache import PartitionCaches, VectorCache
from worker.core.errors import TraceError
from worker.core.records import Decision, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import (
    BUILTIN_PROFILES,
    Novelty,
    NoveltySource,
    Profile,
    ProfileSet,
    score_trace,
)
from worker.core.trace import Trace, parse_trace, validate_trace

from support.traces import CONTEXT_DEV, CONTEXT_ORG, code_review_example, finance_example

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEWER = settings(PROPERTY_SETTINGS, max_examples=100)
BUILTIN = ProfileSet(BUILTIN_PROFILES)

# Text that orjson can serialise (no lone surrogates).
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
non_empty_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | unit | text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
STEP_TYPES = ["thought", "tool_call", "observation", "error_recovery"]


@st.composite
def steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=1, max_value=40))
    tool_names = st.sampled_from(["search", "calc", "grep", "browser"]) | non_empty_text
    out = []
    for index in range(count):
        item: dict[str, Any] = {"step_id": index, "type": draw(st.sampled_from(STEP_TYPES))}
        if draw(st.booleans()):
            item["content"] = draw(text)
        if draw(st.integers(0, 2)) == 0:
            tool: dict[str, Any] = {"name": draw(tool_names)}
            if draw(st.booleans()):
                tool["mcp_server"] = draw(text)
            item["tool"] = tool
        if draw(st.integers(0, 4)) == 0:
            item["input"] = draw(st.dictionaries(text, json_values, max_size=2))
        if draw(st.integers(0, 4)) == 0:
            item["output_summary"] = draw(text)
        if draw(st.integers(0, 4)) == 0:
            item["latency_ms"] = draw(st.integers(0, 10_000) | st.floats(0, 1e6))
        out.append(item)
    return out


@st.composite
def valid_traces(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "created_at": draw(st.datetimes()).isoformat(timespec="seconds") + "Z",
        "task_domain": draw(st.sampled_from(sorted(BUILTIN_PROFILES)) | non_empty_text),
        "success": draw(st.booleans()),
        "quality_score": draw(unit),
        "visibility": draw(st.sampled_from(["private", "org", "network"])),
        "privacy_level": draw(st.sampled_from(["aggregated", "federated", "private"])),
    }
    if draw(st.booleans()):
        metadata["agent_id"] = draw(text)
    document: dict[str, Any] = {
        "@context": draw(st.sampled_from([CONTEXT_ORG, CONTEXT_DEV])),
        "@type": "ReasoningTrace",
        "id": "kp:trace:" + draw(st.text(st.characters(categories=("L", "N")), min_size=1)),
        "metadata": metadata,
        "task": {"objective": draw(non_empty_text)},
        "steps": draw(steps()),
        "outcome": {"result_summary": draw(text), "confidence": draw(unit)},
    }
    if draw(st.booleans()):
        document["x_extra"] = draw(json_values)
    return document


@st.composite
def profile_sets(draw: st.DrawFn) -> ProfileSet:
    """Builtins or random profiles whose weights are thousandths summing to exactly 1."""
    if draw(st.booleans()):
        return BUILTIN
    profiles = {}
    for name in ["default", *draw(st.lists(st.sampled_from(sorted(BUILTIN_PROFILES)), max_size=3))]:
        cuts = sorted(draw(st.lists(st.integers(0, 1000), min_size=3, max_size=3)))
        parts = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], 1000 - cuts[2]]
        profiles[name] = Profile(name, *(p / 1000 for p in parts))
    return ProfileSet(profiles)


@PROPERTY_SETTINGS
@given(
    document=valid_traces(),
    novelty=unit,
    source=st.sampled_from(list(NoveltySource)),
    profiles=profile_sets(),
)
def test_every_valid_trace_scores_in_unit_interval(
    document: dict[str, Any], novelty: float, source: NoveltySource, profiles: ProfileSet
) -> None:
    trace = parse_trace(orjson.dumps(document))
    assert trace.document == document
    breakdown = score_trace(trace, Novelty(novelty, source), profiles)
    assert 0.0 <= breakdown.score <= 1.0
    for value in (
        breakdown.dimensions.complexity,
        breakdown.dimensions.novelty,
        breakdown.dimensions.tool_diversity,
        breakdown.dimensions.outcome,
    ):
        assert 0.0 <= value <= 1.0
    assert breakdown.dimensions.novelty == novelty
    assert breakdown.novelty_source is source
    if len(document["steps"]) == 1 and document["steps"][0]["type"] == "thought":
        assert breakdown.score in (0.1, 0.0)
    assert orjson.loads(orjson.dumps(breakdown.to_json()))["score"] == breakdown.score


@FEWER
@given(document=valid_traces(), novelty=st.floats(allow_nan=False) | st.just(math.nan))
def test_any_novelty_value_still_gives_a_unit_score(
    document: dict[str, Any], novelty: float
) -> None:
    breakdown = score_trace(
        validate_trace(document), Novelty(novelty, NoveltySource.EMBEDDING), BUILTIN
    )
    assert 0.0 <= breakdown.score <= 1.0
    assert 0.0 <= breakdown.dimensions.novelty <= 1.0


@FEWER
@given(document=valid_traces(), threshold=unit)
def test_every_valid_trace_is_routed_and_published(
    document: dict[str, Any], threshold: float
) -> None:
    scorer = Scorer(BUILTIN, Thresholds(threshold), PartitionCaches(), embedder=None)
    raw = orjson.dumps(document)
    (routed,) = scorer.score_batch([SourceRecord("t", 0, 0, 0, b"k", raw)]).routed
    assert routed.decision is not Decision.DEAD_LETTER, routed.error
    assert routed.breakdown is not None
    assert (routed.decision is Decision.ACCEPTED) == (routed.breakdown.score >= threshold)
    assert routed.value is not None
    out = orjson.loads(routed.value)
    assert out["trace"]["metadata"]["quality_score"] == routed.breakdown.score
    expected = {**document, "metadata": {**document["metadata"]}}
    expected["metadata"]["quality_score"] = routed.breakdown.score
    assert out["trace"] == expected


def check_parse(raw: bytes) -> None:
    """parse_trace either returns a Trace or raises a TraceError with a short reason."""
    try:
        trace = parse_trace(raw)
    except TraceError as error:
        assert error.kind
        assert isinstance(error.reason, str)
        assert len(error.reason) < 300, error.reason
        return
    assert isinstance(trace, Trace)
    score = score_trace(trace, Novelty.unavailable(), BUILTIN).score
    assert 0.0 <= score <= 1.0


@PROPERTY_SETTINGS
@given(raw=st.binary(max_size=2_000))
def test_arbitrary_bytes_raise_only_trace_errors(raw: bytes) -> None:
    check_parse(raw)


SEED_BYTES = [orjson.dumps(code_review_example()), orjson.dumps(finance_example())]


@PROPERTY_SETTINGS
@given(
    base=st.sampled_from(SEED_BYTES),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 3), st.binary(min_size=1, max_size=4)),
        min_size=1,
        max_size=4,
    ),
)
def test_byte_mutations_of_valid_json_raise_only_trace_errors(
    base: bytes, edits: list[tuple[int, int, bytes]]
) -> None:
    raw = bytearray(base)
    for position, action, blob in edits:
        where = position % (len(raw) + 1)
        if action == 0:
            raw[where:where] = blob  # insert
        elif action == 1:
            del raw[where : where + len(blob)]  # delete
        elif action == 2:
            raw[where : where + len(blob)] = blob  # overwrite
        else:
            raw[where:where] = raw[where : where + 8]  # duplicate a stretch
    check_parse(bytes(raw))


def all_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths.extend(all_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths.extend(all_paths(item, (*prefix, index)))
    return paths


@PROPERTY_SETTINGS
@given(
    base=st.sampled_from([code_review_example, finance_example]),
    data=st.data(),
)
def test_structural_mutations_raise_only_trace_errors(base: Any, data: st.DataObject) -> None:
    document = copy.deepcopy(base())
    for _ in range(data.draw(st.integers(1, 3))):
        paths = all_paths(document)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        if data.draw(st.booleans()):
            del parent[path[-1]]  # field deletion
        else:
            parent[path[-1]] = data.draw(json_values)  # type swap / new value
    check_parse(orjson.dumps(document))


@FEWER
@given(
    document=valid_traces(),
    duplicate=st.sampled_from(["id", "@type", "metadata", "steps"]),
)
def test_duplicated_top_level_key_is_always_caught(
    document: dict[str, Any], duplicate: str
) -> None:
    raw = orjson.dumps(document)
    value = orjson.dumps(document[duplicate])
    injected = raw[:-1] + b"," + orjson.dumps(duplicate) + b":" + value + b"}"
    try:
        parse_trace(injected)
    except TraceError as error:
        assert error.kind == "duplicate_key"
    else:
        raise AssertionError("duplicate key accepted")


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 8),
    ttl=st.none() | st.integers(1, 50),
    prefill=st.integers(0, 12),
    batch=st.integers(1, 16),
    seed=st.integers(0, 2**32 - 1),
)
def test_cache_batch_equals_sequential(
    capacity: int, ttl: int | None, prefill: int, batch: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    dims = 6
    vectors = rng.integers(-3, 4, size=(prefill + batch, dims)).astype(np.float32)
    times = [int(t) for t in rng.integers(0, 80, size=prefill + batch)]
    assume(len(vectors) > 0)
    batched, single = VectorCache(capacity, dims, ttl), VectorCache(capacity, dims, ttl)
    if prefill:
        batched.add_batch(vectors[:prefill], times[:prefill])
        single.add_batch(vectors[:prefill], times[:prefill])
    got = batched.query_then_add_batch(vectors[prefill:], times[prefill:])
    expected = []
    for vector, when in zip(vectors[prefill:], times[prefill:], strict=True):
        expected.append(single.max_cosine_similarity(vector, now_ms=when))
        single.add(vector, when)
    assert got == expected
    for value in got:
        assert value is None or -1.0 - 1e-5 <= value <= 1.0 + 1e-5
