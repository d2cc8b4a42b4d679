"""What the scorer publishes conforms to the schemas in schemas/ (checked with the real files)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from worker.pipeline import Decision, SourceRecord, build_scorer
from worker.settings import load_settings
from worker.trace import ERROR_KINDS

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces.jsonl"


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


def test_error_kinds_in_schema_match_the_code() -> None:
    schema = orjson.loads((SCHEMAS / "dead-letter-headers.schema.json").read_bytes())
    assert set(schema["properties"]["kp-error-kind"]["enum"]) == {*ERROR_KINDS, "internal"}
