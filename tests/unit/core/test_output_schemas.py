"""What the scorer publishes conforms to the schemas in schemas/ (checked with the real files)."""

from __future__ import annotations

import orjson
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from worker.core.errors import ERROR_KINDS
from worker.core.output import without_value
from worker.core.records import Decision, SourceRecord
from worker.core.schema import output_violation
from worker.core.scorer import build_scorer
from worker.settings import load_settings

from support.paths import EXAMPLES, REPO

SCHEMAS = REPO / "schemas"


def validator(name: str) -> Draft202012Validator:
    registry = Registry()
    for path in SCHEMAS.glob("*.json"):
        schema = orjson.loads(path.read_bytes())
        registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
        registry = registry.with_resource(path.name, Resource.from_contents(schema))
    schema = orjson.loads((SCHEMAS / name).read_bytes())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry)


@pytest.fixture(scope="module")
def routed():
    scorer = build_scorer(load_settings(), use_embedder=False)
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    bad = [b"", b"{", b"[]", b'{"a":1,"a":1}', b"\xef\xbb\xbf{}", b'{"x": 1}', b"x" * 2_000_000]
    records = [
        SourceRecord("raw", 0, offset, 1_700_000_000_000, b"k", value)
        for offset, value in enumerate([*lines, *bad, None])
    ]
    return scorer.score_batch(records).routed


def test_scored_values_follow_the_scored_trace_schema(routed) -> None:
    check = validator("scored-trace.schema.json")
    scored = [r for r in routed if r.decision is not Decision.DEAD_LETTER]
    assert len(scored) == 50
    for record in scored:
        errors = list(check.iter_errors(orjson.loads(record.value)))
        assert not errors, errors[0].message
        # The worker's own validator of the schema (re-scoring's) agrees.
        assert output_violation(orjson.loads(record.value)) is None


def test_scored_trace_schema_rejects_a_wrong_output(routed) -> None:
    check = validator("scored-trace.schema.json")
    value = orjson.loads(next(r for r in routed if r.breakdown is not None).value)
    value["score"]["decision"] = "maybe"
    assert not check.is_valid(value)


def test_dead_letter_headers_follow_their_schema(routed) -> None:
    check = validator("dead-letter-headers.schema.json")
    dead = [r for r in routed if r.decision is Decision.DEAD_LETTER]
    assert len(dead) == 8
    for record in dead:
        headers = {k: v.decode() for k, v in record.headers}
        errors = list(check.iter_errors(headers))
        assert not errors, errors[0].message


def test_error_kinds_in_schema_are_error_kinds_in_order() -> None:
    """The schema's enum is the published list of kinds: the code's, in its order (docs/output.md's
    table is generated from the code: tests/docs/test_reference_tables.py)."""
    schema = orjson.loads((SCHEMAS / "dead-letter-headers.schema.json").read_bytes())
    assert schema["properties"]["kp-error-kind"]["enum"] == list(ERROR_KINDS)


def test_oversized_scored_output_is_dead_lettered_with_its_original_bytes() -> None:
    scorer = build_scorer(load_settings(), use_embedder=False)
    scorer.max_output_bytes = 2_000
    line = EXAMPLES.read_bytes().splitlines()[0]
    trace = orjson.loads(line)
    trace["padding"] = "x" * 3_000  # valid (extra field), but the scored output is too big
    value = orjson.dumps(trace)
    (routed,) = scorer.score_batch([SourceRecord("raw", 0, 7, 1, b"k", value)]).routed
    assert routed.decision is Decision.DEAD_LETTER
    assert routed.value == value
    headers = dict(routed.headers)
    assert headers["kp-error-kind"] == b"output_too_large"
    assert b"2000-byte publish limit" in headers["kp-error-reason"]
    assert validator("dead-letter-headers.schema.json").is_valid(
        {k: v.decode() for k, v in routed.headers}
    )


def test_a_record_too_large_to_publish_points_at_its_original(routed) -> None:
    scored = next(r for r in routed if r.breakdown is not None)
    dead = without_value(scored, 1_000)
    assert dead.decision is Decision.DEAD_LETTER and dead.value is None
    headers = {k: v.decode() for k, v in dead.headers}
    assert headers["kp-error-kind"] == "output_too_large"
    assert headers["kp-source-offset"] == str(scored.source.offset)
    assert "kp-decision" not in headers
    assert "publish limit" in headers["kp-value-omitted"]
    assert validator("dead-letter-headers.schema.json").is_valid(headers)
    too_big_input = next(r for r in routed if r.error is not None and r.error.kind == "too_large")
    kept = without_value(too_big_input, 1_000)
    assert dict(kept.headers)["kp-error-kind"] == b"too_large", "the original reason is kept"
