"""Fuzzing decode + validate + score: no input may raise anything but a TraceError.

Two sources of input, both through ``parse_trace``, then (when it parses) ``score_trace`` and
the whole pure pipeline (``Scorer.score_batch`` without an embedder, which also writes the
scored output):

- mutations of valid traces: fields deleted, renamed, added; values swapped for other JSON
  types, numeric extremes, odd unicode (controls, NUL, RTL, astral, lone surrogates); lists
  duplicated; serialised with orjson or ``json`` (NaN, Infinity, surrogates) and sometimes
  damaged at the byte level (truncated, a byte flipped, junk inserted, a BOM);
- random bytes.

Invariants: only TraceError subclasses with a known kind and a non-empty one-line reason;
every score, dimension and composite of a parsed trace in [0, 1]; a trace that parses is
scored (accepted or rejected), never dead-lettered as an internal error.

The default suite runs ~2,000 examples; ``-m slow`` runs over 100,000 (derandomized, so a
run is reproducible).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.core.cache import PartitionCaches
from worker.core.errors import INPUT_ERROR_KINDS, TraceError
from worker.core.records import Decision, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import BUILTIN_PROFILES, Novelty, ProfileSet, score_trace
from worker.core.trace import parse_trace

from support.paths import EXAMPLES
from support.traces import code_review_example, finance_example, make_trace, steps_of

BUILTIN = ProfileSet(BUILTIN_PROFILES)
SCORER = Scorer(BUILTIN, Thresholds(), PartitionCaches(1000), embedder=None)

SEEDS: list[dict[str, Any]] = [
    make_trace(),
    make_trace(steps=steps_of("thought")),
    make_trace(
        domain="code",
        steps=steps_of(
            "thought",
            "tool_call",
            "error_recovery",
            "error_recovery",
            "error_recovery",
            "observation",
            tools={1: "grep", 2: "grep"},
        ),
    ),
    code_review_example(),
    finance_example(),
    *(orjson.loads(line) for line in EXAMPLES.read_bytes().splitlines()[:10] if line.strip()),
]

EXTREMES: list[Any] = [
    0,
    -0.0,
    -1,
    1,
    2,
    0.5,
    1.0000000001,
    -1e-300,
    5e-324,
    1e308,
    -1e308,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    True,
    False,
    None,
    "",
    " ",
    "kp:trace:",
    "ReasoningTrace",
    "thought",
    "error_recovery",
    "2025-13-45T99:99:99Z",
    "\u0000",
    "\u202e\u200b\ufeff",
    "𝕏" * 40,
    "a" * 5000,
    [],
    {},
    [None],
    {"name": ""},
    {"name": "x" * 300},
]
# Any code point except surrogates (those come from the sampled list, written by ``json``).
ODD_TEXT = st.text(max_size=40) | st.sampled_from(
    ["\x00", "\ud800", "\udfff x", "\u202e", "\U0010ffff", "é" * 10, "\r\n\t"]
)
DOMAINS = st.sampled_from([*BUILTIN_PROFILES, "other", "", "Code", "finance "])

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(EXTREMES).map(copy.deepcopy)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((*prefix, key))
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out.append((*prefix, index))
            out += _paths(value, (*prefix, index))
    return out


def _parent(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        document = document[part]
    return document


OPS = st.sampled_from(
    ["delete", "swap", "extreme", "text", "add", "rename", "dup", "domain", "nest"]
)
SEED_INDEX = st.integers(0, len(SEEDS) - 1)
# Copies: a later mutation must not change the shared list (hypothesis needs determinism).
EXTREME = st.sampled_from(EXTREMES).map(copy.deepcopy)
NEW_KEY = st.text(max_size=10) | st.sampled_from(["tool", "content", "@id", "steps"])
RENAME = st.sampled_from([str.upper, lambda k: f" {k}", lambda k: f"{k}_", lambda k: "@" + k])
SERIALISER = st.sampled_from(["orjson", "orjson", "json", "json_ascii"])
DAMAGE = st.sampled_from(["none"] * 6 + ["truncate", "flip", "insert", "bom", "nan", "dupkey"])
NON_FINITE = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999"])
DUP_KEY = st.sampled_from([b'"id":', b'"type":', b'"success":', b'"name":'])


@st.composite
def mutated_trace(draw: st.DrawFn) -> bytes:
    document = copy.deepcopy(SEEDS[draw(SEED_INDEX)])
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(document)
        if not paths:
            break
        path = paths[draw(st.integers(0, len(paths) - 1))]
        parent, last = _parent(document, path), path[-1]
        op = draw(OPS)
        if op == "delete":
            del parent[last]
        elif op == "swap":
            parent[last] = draw(json_value)
        elif op == "extreme":
            parent[last] = draw(EXTREME)
        elif op == "text":
            parent[last] = draw(ODD_TEXT)
        elif op == "add" and isinstance(parent, dict):
            parent[draw(NEW_KEY)] = draw(json_value)
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(RENAME)(str(last))] = parent.pop(last)
        elif op == "dup" and isinstance(parent[last], list) and parent[last]:
            parent[last] = parent[last] * draw(st.integers(2, 30))
        elif op == "domain" and isinstance(document.get("metadata"), dict):
            document["metadata"]["task_domain"] = draw(DOMAINS)
        elif op == "nest":
            value: Any = parent[last]
            as_list = draw(st.booleans())
            for _ in range(draw(st.integers(1, 200))):
                value = [value] if as_list else {"k": value}
            parent[last] = value
    raw = _serialise(draw(SERIALISER), document)
    return _damage(draw, raw)


def _serialise(how: str, document: Any) -> bytes:
    if how == "orjson":
        try:
            return orjson.dumps(document)
        except (orjson.JSONEncodeError, TypeError):
            how = "json"  # lone surrogates, ints over 64 bits, too deep: the stdlib writes them
    try:
        text = json.dumps(document, ensure_ascii=how == "json_ascii", allow_nan=True)
    except (RecursionError, ValueError):
        return b"{}"
    return text.encode("utf-8", "surrogatepass")


def _damage(draw: st.DrawFn, raw: bytes) -> bytes:
    how = draw(DAMAGE)
    if how == "none" or not raw:
        return raw
    at = draw(st.integers(0, len(raw) - 1))
    if how == "truncate":
        return raw[:at]
    if how == "flip":
        return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    if how == "insert":
        return raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "nan":
        return raw.replace(b"0.9", draw(NON_FINITE), 1)
    key = draw(DUP_KEY)
    return raw.replace(key, key + b'"x",' + key, 1)


NOVELTIES = st.sampled_from([Novelty.unavailable(), Novelty.empty_cache()]) | st.builds(
    Novelty.from_similarity, st.floats(-1.5, 1.5)
)


def check(raw: bytes, novelty: Novelty) -> str:
    """One input through the whole pure path; returns its outcome for the statistics."""
    try:
        trace = parse_trace(raw)
    except TraceError as error:
        assert error.kind in INPUT_ERROR_KINDS, error.kind
        assert isinstance(error.reason, str) and error.reason.strip()
        assert "\n" not in error.reason and len(error.reason) <= 1000
        return error.kind
    breakdown = score_trace(trace, novelty, BUILTIN)
    dims = breakdown.dimensions
    for value in (
        breakdown.score,
        breakdown.composite,
        dims.complexity,
        dims.novelty,
        dims.tool_diversity,
        dims.outcome,
    ):
        assert math.isfinite(value) and 0.0 <= value <= 1.0, breakdown
    routed = SCORER.score_batch([SourceRecord("fuzz", 0, 0, 0, None, raw)]).routed[0]
    assert routed.decision in (Decision.ACCEPTED, Decision.REJECTED), routed.error
    assert routed.value is not None
    published = orjson.loads(routed.value)
    assert 0.0 <= published["score"]["score"] <= 1.0
    assert published["trace"]["metadata"]["quality_score"] == published["score"]["score"]
    return routed.decision.value


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


def run_fuzz(mutations: int, random_bytes: int) -> Counter[str]:
    stats: Counter[str] = Counter()

    @_settings(mutations)
    @given(mutated_trace(), NOVELTIES)
    def fuzz_mutations(raw: bytes, novelty: Novelty) -> None:
        stats[check(raw, novelty)] += 1
        stats["inputs"] += 1

    @_settings(random_bytes)
    @given(st.binary(max_size=4096) | st.binary(max_size=64), NOVELTIES)
    def fuzz_bytes(raw: bytes, novelty: Novelty) -> None:
        stats[check(raw, novelty)] += 1
        stats["inputs"] += 1

    fuzz_mutations()
    fuzz_bytes()
    return stats


def _report(stats: Counter[str], seconds: float) -> str:
    outcomes = {k: v for k, v in sorted(stats.items()) if k != "inputs"}
    return f"{stats['inputs']:,} fuzzed inputs in {seconds:.1f} s: {outcomes}"


def test_fuzz_decode_validate_score() -> None:
    started = time.perf_counter()
    stats = run_fuzz(mutations=1_600, random_bytes=400)
    print("\n" + _report(stats, time.perf_counter() - started))
    assert stats["inputs"] >= 2_000
    assert stats["accepted"] + stats["rejected"] > 0, "some mutations stay valid"
    assert stats["schema"] > 0 and stats["invalid_json"] > 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fuzz_decode_validate_score_100k() -> None:
    started = time.perf_counter()
    stats = run_fuzz(mutations=70_000, random_bytes=30_000)
    print("\n" + _report(stats, time.perf_counter() - started))
    assert stats["inputs"] >= 100_000
