"""The trace schema: a document is accepted whole, or refused with the first error the schema
names, at a JSON path the document holds, quoting no more than a snippet of its data."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.core.errors import SchemaViolationError
from worker.core.schema import json_path
from worker.core.trace import parse_trace, validate_trace

from support.traces import (
    CONTEXT_DEV,
    DELETE,
    make_trace,
    steps_of,
    thin_steps,
    trace_bytes,
)

Mutation = Callable[[dict[str, Any]], object]


def base_document() -> dict[str, Any]:
    """Five steps (one with a tool) so that deep paths such as steps[3] exist."""
    return make_trace(
        steps=steps_of(
            "thought", "tool_call", "observation", "thought", "observation", tools={1: "search"}
        )
    )


def mutated(mutation: Mutation) -> bytes:
    document = base_document()
    mutation(document)
    return orjson.dumps(document)


def setter(*path: Any) -> Callable[[Any], Mutation]:
    """``setter("metadata", "success")(value)`` sets document["metadata"]["success"] = value."""

    def with_value(value: Any) -> Mutation:
        def apply(document: dict[str, Any]) -> None:
            target: Any = document
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = value

        return apply

    return with_value


def deleter(*path: Any) -> Mutation:
    def apply(document: dict[str, Any]) -> None:
        target: Any = document
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return apply


SCHEMA_CASES: list[tuple[str, Mutation, str]] = [
    (
        "step type not in enum",
        setter("steps", 3, "type")("plan"),
        "steps[3].type: 'plan' is not one of thought, tool_call, observation, error_recovery",
    ),
    ("missing @context", deleter("@context"), "(root): missing required field '@context'"),
    (
        "unknown @context",
        setter("@context")("https://example.org"),
        "@context: 'https://example.org' is not one of "
        "https://openknowledgepulse.org/schema/v1, https://knowledgepulse.dev/schema/v1",
    ),
    ("wrong @type", setter("@type")("Trace"), "@type: expected 'ReasoningTrace', got 'Trace'"),
    ("id without prefix", setter("id")("trace:1"), "id: 'trace:1' does not match ^kp:trace:.+"),
    ("id prefix only", setter("id")("kp:trace:"), "id: 'kp:trace:' does not match ^kp:trace:.+"),
    ("id not a string", setter("id")(42), "id: expected string, got int 42"),
    ("missing metadata", deleter("metadata"), "(root): missing required field 'metadata'"),
    ("metadata null", setter("metadata")(None), "metadata: expected object, got NoneType None"),
    (
        "created_at not a date",
        setter("metadata", "created_at")("yesterday"),
        "metadata.created_at: 'yesterday' is not a valid date-time",
    ),
    (
        "created_at date only",
        setter("metadata", "created_at")("2024-01-01"),
        "metadata.created_at: '2024-01-01' is not a valid date-time",
    ),
    (
        "created_at missing",
        deleter("metadata", "created_at"),
        "metadata: missing required field 'created_at'",
    ),
    (
        "empty task_domain",
        setter("metadata", "task_domain")(""),
        "metadata.task_domain: must not be empty",
    ),
    (
        "success not bool",
        setter("metadata", "success")("yes"),
        "metadata.success: expected boolean, got str 'yes'",
    ),
    (
        "quality_score above 1",
        setter("metadata", "quality_score")(1.5),
        "metadata.quality_score: 1.5 must be at most 1",
    ),
    (
        "quality_score below 0",
        setter("metadata", "quality_score")(-0.1),
        "metadata.quality_score: -0.1 must be at least 0",
    ),
    (
        "quality_score bool",
        setter("metadata", "quality_score")(True),
        "metadata.quality_score: expected number, got bool True",
    ),
    (
        "visibility not in enum",
        setter("metadata", "visibility")("public"),
        "metadata.visibility: 'public' is not one of private, org, network",
    ),
    (
        "privacy_level not in enum",
        setter("metadata", "privacy_level")("none"),
        "metadata.privacy_level: 'none' is not one of aggregated, federated, private",
    ),
    (
        "agent_id not a string",
        setter("metadata", "agent_id")(5),
        "metadata.agent_id: expected string, got int 5",
    ),
    ("empty objective", setter("task", "objective")(""), "task.objective: must not be empty"),
    ("missing objective", deleter("task", "objective"), "task: missing required field 'objective'"),
    (
        "input_schema not an object",
        setter("task", "input_schema")("x"),
        "task.input_schema: expected object, got str 'x'",
    ),
    ("no steps", setter("steps")([]), "steps: needs at least 1 item(s)"),
    ("steps an object", setter("steps")({}), "steps: expected array, got dict {}"),
    ("step not an object", setter("steps", 4)("x"), "steps[4]: expected object, got str 'x'"),
    (
        "negative step_id",
        setter("steps", 0, "step_id")(-1),
        "steps[0].step_id: -1 must be at least 0",
    ),
    (
        "fractional step_id",
        setter("steps", 1, "step_id")(1.5),
        "steps[1].step_id: expected integer, got float 1.5",
    ),
    ("step without type", deleter("steps", 0, "type"), "steps[0]: missing required field 'type'"),
    (
        "tool without name",
        setter("steps", 2, "tool")({}),
        "steps[2].tool: missing required field 'name'",
    ),
    (
        "empty tool name",
        setter("steps", 1, "tool", "name")(""),
        "steps[1].tool.name: must not be empty",
    ),
    (
        "mcp_server not a string",
        setter("steps", 1, "tool", "mcp_server")(1),
        "steps[1].tool.mcp_server: expected string, got int 1",
    ),
    (
        "input not an object",
        setter("steps", 1, "input")([1]),
        "steps[1].input: expected object, got list [1]",
    ),
    (
        "negative latency",
        setter("steps", 0, "latency_ms")(-5),
        "steps[0].latency_ms: -5 must be at least 0",
    ),
    (
        "content not a string",
        setter("steps", 0, "content")(7),
        "steps[0].content: expected string, got int 7",
    ),
    (
        "output_summary not a string",
        setter("steps", 2, "output_summary")(["x"]),
        "steps[2].output_summary: expected string, got list ['x']",
    ),
    (
        "confidence above 1",
        setter("outcome", "confidence")(1.01),
        "outcome.confidence: 1.01 must be at most 1",
    ),
    (
        "confidence a string",
        setter("outcome", "confidence")("high"),
        "outcome.confidence: expected number, got str 'high'",
    ),
    (
        "missing result_summary",
        deleter("outcome", "result_summary"),
        "outcome: missing required field 'result_summary'",
    ),
    ("missing outcome", deleter("outcome"), "(root): missing required field 'outcome'"),
]


def test_enough_distinct_schema_cases() -> None:
    assert len(SCHEMA_CASES) >= 20
    assert len({reason for _, _, reason in SCHEMA_CASES}) == len(SCHEMA_CASES)


@pytest.mark.parametrize(
    ("mutation", "reason"),
    [pytest.param(m, r, id=name) for name, m, r in SCHEMA_CASES],
)
def test_schema_violation_names_the_path(mutation: Mutation, reason: str) -> None:
    with pytest.raises(SchemaViolationError) as excinfo:
        parse_trace(mutated(mutation))
    assert excinfo.value.kind == "schema"
    assert excinfo.value.reason == reason
    assert str(excinfo.value) == reason


def test_of_several_missing_fields_the_first_the_schema_requires_is_named() -> None:
    def drop_two(document: dict[str, Any]) -> None:
        del document["task"]
        del document["id"]

    with pytest.raises(SchemaViolationError) as excinfo:
        parse_trace(mutated(drop_two))
    assert excinfo.value.reason == "(root): missing required field 'id'"


def test_schema_error_on_an_already_decoded_document() -> None:
    document = base_document()
    document["steps"][3]["type"] = "plan"
    with pytest.raises(SchemaViolationError, match=r"^steps\[3\]\.type: 'plan'"):
        validate_trace(document)


# --- reasons stay short -------------------------------------------------------------------

HUGE = "z" * 100_000


@pytest.mark.parametrize(
    "mutation",
    [
        setter("metadata", "visibility")(HUGE),
        setter("steps", 0, "type")(HUGE),
        setter("id")(HUGE),
        setter("@type")(HUGE),
        setter("@context")(HUGE),
        setter("metadata", "created_at")(HUGE),
        setter("metadata", "success")(HUGE),
        setter("metadata", "quality_score")([HUGE]),
        setter("outcome", "confidence")({"v": HUGE}),
        setter("steps", 1, "tool")(HUGE),
        setter("steps")(HUGE),
    ],
)
def test_reason_quotes_only_a_snippet_of_a_huge_value(mutation: Mutation) -> None:
    with pytest.raises(SchemaViolationError) as excinfo:
        parse_trace(mutated(mutation))
    assert len(excinfo.value.reason) < 300
    assert "..." in excinfo.value.reason or HUGE[:10] not in excinfo.value.reason


def test_delete_helper_really_deletes() -> None:
    # guards the helper the rejection cases rely on
    assert "outcome" not in make_trace(outcome=DELETE)
    with pytest.raises(SchemaViolationError, match="'outcome'"):
        validate_trace(make_trace(outcome=DELETE))


# --- any document: accepted whole, or refused with a reason that names a path it holds ---


def rich_document() -> dict[str, Any]:
    """Every field of the schema present somewhere, so that any of them can be broken."""
    document = base_document()
    document["metadata"].update(agent_id="a-1", framework="lg", validated_by=["x"])
    document["task"]["input_schema"] = {"type": "object"}
    document["steps"][1].update(input={"q": "kafka"}, output_summary="ok", latency_ms=3)
    document["steps"][1]["tool"]["mcp_server"] = "fs"
    document["steps"][3]["tool"] = {"name": "grep"}
    return document


def all_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            paths += all_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths += all_paths(child, (*prefix, index))
    return paths


PATHS = [
    *all_paths(rich_document()),
    ("x_extra",),
    ("metadata", "x_extra"),
    ("steps", 5),
    ("steps", 0, "tool"),
    ("steps", 2, "input"),
]
EDGE_VALUES: list[Any] = [
    *(None, True, False, 0, -1, 2, 0.5, 1.5, -0.0, 2.0, -1e20, 1e308, 2**64 - 1, -(2**63)),
    *("", "x", "plan", "thought", "tool_call", "kp:trace:", "kp:trace:1", "kp:trace:\n"),
    *("2024-01-01", "2025-01-15 12:00:00", "network", "aggregated", "ReasoningTrace"),
    CONTEXT_DEV,
    *([], ["x"], {}, {"name": ""}, {"name": "t"}, {"step_id": 0, "type": "thought"}),
    [{"step_id": 0, "type": "thought"}, "x"],
]
json_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
    max_leaves=6,
)
mutations = st.lists(
    st.tuples(st.sampled_from(PATHS), st.just(DELETE) | st.sampled_from(EDGE_VALUES) | json_values),
    min_size=1,
    max_size=5,
)


def holds(parent: Any, part: Any) -> bool:
    if isinstance(parent, dict):
        return isinstance(part, str) and part in parent
    return isinstance(parent, list) and isinstance(part, int) and part < len(parent)


def put(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set (or delete, or append) the value at ``path`` when its parent is still there."""
    parent: Any = document
    for part in path[:-1]:
        if not holds(parent, part):
            return
        parent = parent[part]
    last = path[-1]
    if value is DELETE:
        if holds(parent, last):
            del parent[last]
    elif isinstance(parent, dict) and isinstance(last, str):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list) and isinstance(last, int) and last <= len(parent):
        value = copy.deepcopy(value)
        if last == len(parent):
            parent.append(value)
        else:
            parent[last] = value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=mutations)
def test_a_document_is_accepted_whole_or_refused_at_a_path_it_holds(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    document = rich_document()
    for path, value in changes:
        put(document, path, value)
    raw = orjson.dumps(document)
    try:
        trace = parse_trace(raw)
    except SchemaViolationError as error:
        reason = error.reason
        assert "\n" not in reason and len(reason) < 300, reason
        held = {json_path(path) for path in all_paths(orjson.loads(raw))} | {"(root)"}
        assert reason.split(": ", 1)[0] in held, reason
        with pytest.raises(SchemaViolationError) as again:
            parse_trace(raw)
        assert again.value.reason == reason, "the same document, the same reason"
    else:
        assert trace.document == orjson.loads(raw)


def test_error_at_the_end_of_a_huge_array_is_named() -> None:
    document = make_trace(steps=thin_steps(10_000))
    document["steps"][-1]["type"] = "bogus"
    with pytest.raises(SchemaViolationError) as excinfo:
        parse_trace(orjson.dumps(document))
    assert excinfo.value.reason == (
        "steps[9999].type: 'bogus' is not one of thought, tool_call, observation, error_recovery"
    )


def test_when_every_item_is_bad_one_of_them_is_named() -> None:
    document = make_trace(steps=[{"step_id": i, "type": "plan"} for i in range(10_000)])
    with pytest.raises(SchemaViolationError, match=r"^steps\[\d+\]\.type: 'plan' is not one of"):
        parse_trace(orjson.dumps(document))


def test_of_several_errors_in_a_big_trace_one_is_named() -> None:
    document = make_trace(steps=thin_steps(3_000))
    document["steps"][2_999]["step_id"] = -1
    document["steps"][1_500] = "x"
    document["metadata"]["visibility"] = "public"
    with pytest.raises(SchemaViolationError) as excinfo:
        parse_trace(orjson.dumps(document))
    assert excinfo.value.reason in (
        "steps[2999].step_id: -1 must be at least 0",
        "steps[1500]: expected object, got str 'x'",
        "metadata.visibility: 'public' is not one of private, org, network",
    )


@pytest.mark.parametrize(
    ("created_at", "accepted"),
    [
        ("2025-01-15T12:00:00Z", True),
        ("2025-01-15T12:00:00.123456+00:00", True),
        ("2025-01-15T12:00:00.123456789Z", True),
        ("2025-03-01t12:00:00z", True),  # RFC 3339: T and Z may be lower case
        ("2025-01-15T12:00:00-00:00", True),  # "offset unknown"
        ("2025-01-15T12:00:00+23:59", True),
        ("2016-12-31T23:59:60Z", True),  # a leap second
        ("2016-12-31T18:59:60-05:00", True),  # the same one, at an offset
        ("2024-02-29T00:00:00Z", True),
        ("2025-01-15T12:00:00Z\u0000<script>", False),
        ("2025-01-15T12:00:00Z\n", False),
        ("2025-01-15T12:00:00Z ", False),
        ("2025-01-15T12:00:00Zjunk", False),
        ("2025-01-15T12:00:00", False),  # no offset
        ("2025-01-15 12:00:00Z", False),
        ("2025-01-15T12", False),
        ("20250115T120000Z", False),
        ("2025-01-15T12:00:00 Z", False),
        ("2025-01-15T12:00:60Z", False),  # a leap second only at 23:59:60 UTC
        ("2025-01-15T12:00:00+24:00", False),
        ("2025-01-15T12:00:00.Z", False),
        ("2024-01-01", False),
        ("", False),
        ("T", False),
        ("2025-13-01T00:00:00Z", False),
        ("2025-02-30T00:00:00Z", False),
        ("2025-02-29T00:00:00Z", False),
        (" 2025-01-15T12:00:00Z", False),
        ("\uff12025-01-15T12:00:00Z", False),  # a fullwidth digit
    ],
)
def test_created_at_is_rfc_3339(created_at: str, accepted: bool) -> None:
    """RFC 3339's date-time exactly, not Python's ISO parser (which takes ``2025-01-15 12``
    and refuses a lower-case ``t``)."""
    raw = trace_bytes(metadata={"created_at": created_at})
    if accepted:
        parse_trace(raw)
        return
    with pytest.raises(SchemaViolationError) as excinfo:
        parse_trace(raw)
    assert excinfo.value.reason == f"metadata.created_at: {created_at!r} is not a valid date-time"
