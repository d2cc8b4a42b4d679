"""Bytes -> validated trace, or an error whose kind is stable and whose reason names the field."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.core.errors import (
    INPUT_ERROR_KINDS,
    DuplicateKeyError,
    EmptyMessageError,
    EncodingError,
    IntegerOutOfRangeError,
    InvalidJsonError,
    NotAnObjectError,
    SchemaViolationError,
    TooLargeError,
    TraceError,
)
from worker.core.schema import json_path
from worker.core.trace import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CONTAINERS,
    MAX_DEPTH,
    NAMED_DUPLICATES_UP_TO,
    Trace,
    decode_json,
    parse_trace,
    validate_trace,
)

from support.traces import (
    CONTEXT_DEV,
    CONTEXT_ORG,
    DELETE,
    code_review_example,
    finance_example,
    make_trace,
    step,
    steps_of,
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


# --- accepted input -----------------------------------------------------------------------


@pytest.mark.parametrize("context", [CONTEXT_ORG, CONTEXT_DEV])
def test_both_contexts_are_accepted(context: str) -> None:
    trace = parse_trace(trace_bytes(context=context))
    assert trace.document["@context"] == context


def test_seed_examples_are_valid() -> None:
    assert parse_trace(orjson.dumps(code_review_example())).domain == "code-review"
    assert parse_trace(orjson.dumps(finance_example())).domain == "finance"


def test_unknown_fields_are_tolerated_and_passed_through() -> None:
    document = make_trace(
        x_vendor={"nested": [1, 2, {"deep": None}]},
        source_skill={"anything": True},
        knowledge_graph_delta=[1, "two"],
        metadata={"agent_id": "agent-7", "framework": "lg", "validated_by": ["a", 1], "tz": "UTC"},
        task={"objective": "Do it", "input_schema": {"type": "object"}, "extra": 1},
        steps=[
            step(0, "tool_call", "c", tool="grep", weird=[1], output_summary="ok", latency_ms=0),
        ],
        outcome={"result_summary": "fine", "confidence": 1, "notes": "kept"},
    )
    document["steps"][0]["tool"]["mcp_server"] = "fs"
    document["steps"][0]["tool"]["version"] = 3
    trace = parse_trace(orjson.dumps(document))
    assert trace.document == document
    assert trace.document["x_vendor"] == {"nested": [1, 2, {"deep": None}]}
    assert trace.steps[0]["weird"] == [1]
    assert trace.document["metadata"]["tz"] == "UTC"


@pytest.mark.parametrize(
    "created_at",
    [
        "2025-01-15T12:00:00Z",
        "2025-01-15T12:00:00+02:00",
        "2025-01-15T12:00:00.123456+00:00",
        "2025-01-15t12:00:00z",
    ],
)
def test_iso_timestamps_are_accepted(created_at: str) -> None:
    parse_trace(trace_bytes(metadata={"created_at": created_at}))


def test_integral_float_step_id_is_an_integer() -> None:
    parse_trace(trace_bytes(steps=[{"step_id": 2.0, "type": "observation"}]))


def test_trace_accessors() -> None:
    document = make_trace(
        domain="finance",
        success=False,
        confidence=0.25,
        objective="Obj",
        steps=[
            step(0, "thought", "a"),
            step(1, "tool_call", tool="x"),
            step(2, "observation", "c"),
        ],
    )
    trace = parse_trace(orjson.dumps(document))
    assert isinstance(trace, Trace)
    assert trace.id == "kp:trace:test-0001"
    assert trace.domain == "finance"
    assert trace.success is False
    assert trace.confidence == 0.25
    assert len(trace.steps) == 3
    # objective, a space, then each step's content ("" when absent) joined by single spaces
    assert trace.embedding_text() == "Obj a  c"


def test_embedding_text_of_the_seed_example() -> None:
    trace = parse_trace(orjson.dumps(code_review_example()))
    assert trace.embedding_text() == (
        "Review PR #42 for security issues Analyzing diff for injection vectors  "
        "Found unsanitized SQL in handler.ts  Confirmed SQL injection vulnerability"
    )


# --- decode errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        (None, EmptyMessageError, "tombstone"),
        (b"", EmptyMessageError, "empty"),
        (b"   ", InvalidJsonError, "not valid JSON"),
        (b"{not json}", InvalidJsonError, "not valid JSON"),
        (b'{"a": 1', InvalidJsonError, "not valid JSON"),
        (b'{"a": 1} trailing', InvalidJsonError, "not valid JSON"),
        (b"{'single': 'quotes'}", InvalidJsonError, "not valid JSON"),
        (b'{"a": NaN}', InvalidJsonError, "not valid JSON"),
        (b'{"a": Infinity}', InvalidJsonError, "not valid JSON"),
        (b'{"a": -Infinity}', InvalidJsonError, "not valid JSON"),
        (b'{"a": 1e400}', InvalidJsonError, "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, InvalidJsonError, "not valid JSON"),
        (b"\xef\xbb\xbf" + trace_bytes(), EncodingError, "BOM"),
        (b'{"a": "\xff\xfe"}', EncodingError, "UTF-8"),
        (b'{"a": "\xc3"}', EncodingError, "UTF-8"),
        (b'{"a": "\\ud800"}', EncodingError, "surrogate"),
        (trace_bytes().decode().encode("utf-16"), EncodingError, "UTF-8"),
        (b'{"a": 1, "a": 2}', DuplicateKeyError, "'a' appears twice"),
        (b'{"m": {"b": 1, "b": 1}}', DuplicateKeyError, "'b' appears twice"),
        (b'{"m": [{"k": 1, "k": 2}]}', DuplicateKeyError, "'k' appears twice"),
        (b'{"a": 1, "\\u0061": 2}', DuplicateKeyError, "'a' appears twice"),
        (b"[1, 2]", NotAnObjectError, "got list"),
        (b'"kp:trace:1"', NotAnObjectError, "got str"),
        (b"42", NotAnObjectError, "got int"),
        (b"null", NotAnObjectError, "got NoneType"),
        (b"true", NotAnObjectError, "got bool"),
        (b"{}", SchemaViolationError, "(root): missing required field '@context'"),
    ],
)
def test_decode_errors_have_kind_and_reason(
    raw: bytes | None, error: type[TraceError], fragment: str
) -> None:
    with pytest.raises(error) as excinfo:
        parse_trace(raw)
    assert type(excinfo.value) is error
    assert isinstance(excinfo.value, TraceError)
    assert fragment in excinfo.value.reason
    assert len(excinfo.value.reason) < 300


def test_duplicate_keys_inside_a_valid_trace_are_rejected() -> None:
    raw = trace_bytes().replace(b'"success":true', b'"success":true,"success":false')
    assert raw.count(b'"success"') == 2
    with pytest.raises(DuplicateKeyError, match="'success'"):
        parse_trace(raw)


def test_duplicate_key_check_is_not_fooled_by_escaped_quotes() -> None:
    document = make_trace(objective='say "hi", "a": 1')
    assert parse_trace(orjson.dumps(document)).document["task"]["objective"] == 'say "hi", "a": 1'


def test_error_kinds_are_stable() -> None:
    assert EmptyMessageError.kind == "empty"
    assert TooLargeError.kind == "too_large"
    assert EncodingError.kind == "invalid_encoding"
    assert InvalidJsonError.kind == "invalid_json"
    assert DuplicateKeyError.kind == "duplicate_key"
    assert NotAnObjectError.kind == "not_object"
    assert SchemaViolationError.kind == "schema"
    assert IntegerOutOfRangeError.kind == "integer_out_of_range"
    assert INPUT_ERROR_KINDS == (
        "empty",
        "too_large",
        "framing",
        "invalid_encoding",
        "invalid_json",
        "duplicate_key",
        "not_object",
        "schema",
        "integer_out_of_range",
    )
    for cls in (
        EmptyMessageError,
        TooLargeError,
        EncodingError,
        InvalidJsonError,
        DuplicateKeyError,
        NotAnObjectError,
        SchemaViolationError,
    ):
        assert issubclass(cls, TraceError)


# --- size limits --------------------------------------------------------------------------


def test_default_size_limit_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_BYTES == 1_048_576
    padding = DEFAULT_MAX_BYTES - len(trace_bytes(x_pad=""))
    parse_trace(trace_bytes(x_pad="p" * padding))  # exactly at the limit
    with pytest.raises(TooLargeError) as excinfo:
        parse_trace(trace_bytes(x_pad="p" * (padding + 1)))
    assert excinfo.value.kind == "too_large"
    assert "1048577 bytes" in excinfo.value.reason
    assert "1048576-byte limit" in excinfo.value.reason


def test_size_limit_is_configurable() -> None:
    raw = trace_bytes()
    assert parse_trace(raw, max_bytes=len(raw)).id == "kp:trace:test-0001"
    with pytest.raises(TooLargeError, match=f"{len(raw)} bytes, over the {len(raw) - 1}-byte"):
        parse_trace(raw, max_bytes=len(raw) - 1)
    # the size check comes first: even garbage is reported as too large
    with pytest.raises(TooLargeError):
        decode_json(b"x" * 11, max_bytes=10)


def test_container_limit_counts_brackets_before_decoding() -> None:
    base = trace_bytes(x_lists=[])
    room = DEFAULT_MAX_CONTAINERS - (base.count(b"{") + base.count(b"["))
    at_limit = trace_bytes(x_lists=[[] for _ in range(room)])
    assert parse_trace(at_limit).id == "kp:trace:test-0001", "exactly at the limit is fine"
    over = trace_bytes(x_lists=[[] for _ in range(room + 1)])
    with pytest.raises(TooLargeError, match=f"{DEFAULT_MAX_CONTAINERS + 1} '{{' and '\\['"):
        parse_trace(over)
    # Brackets inside strings count too: the bound is found without decoding.
    in_text = trace_bytes(x_text="{" * (DEFAULT_MAX_CONTAINERS + 1))
    with pytest.raises(TooLargeError, match="in strings too"):
        parse_trace(in_text)
    assert parse_trace(in_text, max_containers=DEFAULT_MAX_CONTAINERS * 2).id
    with pytest.raises(TooLargeError):  # checked before the JSON itself
        decode_json(b"[[[[ not json", max_containers=3)


# --- nesting depth ------------------------------------------------------------------------


def nested_extra(levels: int) -> bytes:
    """A valid trace plus an extra field of ``levels`` nested arrays (the trace is level 1)."""
    return trace_bytes()[:-1] + b',"x_deep":' + b"[" * levels + b"]" * levels + b"}"


def test_nesting_up_to_the_limit_is_accepted() -> None:
    assert MAX_DEPTH == 128
    trace = parse_trace(nested_extra(MAX_DEPTH - 1))
    # it can be written back, wrapped in one more object as the scored output does
    assert orjson.loads(orjson.dumps({"trace": trace.document})) == {"trace": trace.document}


@pytest.mark.parametrize("levels", [MAX_DEPTH, 300, 900])
def test_nesting_beyond_the_limit_is_invalid_json(levels: int) -> None:
    with pytest.raises(InvalidJsonError) as excinfo:
        parse_trace(nested_extra(levels))
    assert excinfo.value.reason == f"not valid JSON: nested deeper than {MAX_DEPTH} levels"


def test_many_brackets_in_strings_are_not_nesting() -> None:
    trace = parse_trace(trace_bytes(objective="[{" * 500, x_list=[[1]] * 200))
    assert trace.document["task"]["objective"] == "[{" * 500


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


def test_reason_for_huge_duplicate_key_is_short() -> None:
    raw = b'{"' + HUGE.encode() + b'": 1, "' + HUGE.encode() + b'": 2}'
    with pytest.raises(DuplicateKeyError) as excinfo:
        parse_trace(raw)
    assert len(excinfo.value.reason) < 300


def test_reason_for_huge_broken_json_is_short() -> None:
    raw = trace_bytes(x_pad=HUGE)[:-1]
    with pytest.raises(InvalidJsonError) as excinfo:
        parse_trace(raw)
    assert len(excinfo.value.reason) < 300


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


def thin_steps(count: int) -> list[dict[str, Any]]:
    return [{"step_id": i, "type": "thought"} for i in range(count)]


def test_a_ten_thousand_step_trace_parses() -> None:
    document = make_trace(steps=steps_of(*["thought", "tool_call"] * 5_000, tools={1: "grep"}))
    trace = parse_trace(orjson.dumps(document))
    assert len(trace.steps) == 10_000
    assert trace.document == document


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


@pytest.mark.parametrize("steps", [10, 10_000])
def test_duplicate_key_deep_in_the_last_step_is_rejected_and_named_in_small_messages(
    steps: int,
) -> None:
    raw = orjson.dumps(make_trace(steps=thin_steps(steps)))
    cut = raw.rindex(b'"type":"thought"}')
    raw = raw[:cut] + b'"input":{"a":{"b":{"k":1,"k":{"c":2}}}},' + raw[cut:]
    with pytest.raises(DuplicateKeyError) as excinfo:
        parse_trace(raw)
    if len(raw) <= NAMED_DUPLICATES_UP_TO:
        assert (
            excinfo.value.reason == "key 'k' appears twice in one object; its meaning is ambiguous"
        )
    else:
        assert excinfo.value.reason.startswith("a key appears twice in one object")


def content_raw(escaped_content: bytes, extra: bytes = b"") -> bytes:
    """A valid trace whose first step's content is written as ``escaped_content`` (JSON text)."""
    raw = trace_bytes(steps=[{"step_id": 0, "type": "thought", "content": "C"}])
    return raw.replace(b'"content":"C"', b'"content":"' + escaped_content + b'"' + extra)


@pytest.mark.parametrize(
    ("escaped", "content"),
    [
        (b"\\u003a" * 500, ":" * 500),  # colons written as escapes
        (b"\\u003A:", "::"),
        (b"\\\\u003a", "\\u003a"),  # an escaped backslash, then the text u003a
        (b"\\\\\\u003a", "\\:"),
        (b"\\\\" * 50 + b"\\u003a", "\\" * 50 + ":"),  # a long run of escaped backslashes
        (b"\\\\" * 51 + b"u003a", "\\" * 51 + "u003a"),
        (b'\\":', '":'),
    ],
)
def test_colons_written_as_escapes_are_not_duplicate_keys(escaped: bytes, content: str) -> None:
    assert parse_trace(content_raw(escaped)).steps[0]["content"] == content


@pytest.mark.parametrize("escaped", [b"\\u003a" * 500, b"\\\\u003a", b"a:b", b'\\":', b""])
def test_duplicate_keys_are_found_whatever_the_strings_hold(escaped: bytes) -> None:
    with pytest.raises(DuplicateKeyError, match="'content' appears twice"):
        parse_trace(content_raw(escaped, extra=b',"content":"again"'))
    with pytest.raises(DuplicateKeyError, match="'x' appears twice"):
        parse_trace(content_raw(escaped, extra=b',"input":{"x":"' + escaped + b'","x":1}'))


def test_python_objects_json_cannot_hold_are_a_schema_error_not_a_crash() -> None:
    document = make_trace()
    document["steps"][0]["content"] = {"a", "b"}
    with pytest.raises(SchemaViolationError, match="not a JSON document"):
        validate_trace(document)


# --- integers beyond 64 bits --------------------------------------------------------------


def raw_with(field: bytes, literal: bytes, where: str = "root") -> bytes:
    """A valid trace with ``"field": literal`` written into it (as text: orjson cannot write
    an integer beyond 64 bits)."""
    raw = trace_bytes()
    if where == "root":
        return raw[:-1] + b',"' + field + b'":' + literal + b"}"
    assert where == "step_id"
    return raw.replace(b'"step_id":1', b'"step_id":' + literal, 1)


@pytest.mark.parametrize(
    "literal",
    [
        b"123456789012345678901234567890",
        b"18446744073709551616",  # 2**64
        b"-9223372036854775809",  # -2**63 - 1
        b"9" * 5000,  # longer than Python's int() reads by default
    ],
)
def test_an_integer_beyond_64_bits_in_an_unknown_field_is_refused_by_path(literal: bytes) -> None:
    """orjson reads it as a float (1.2345678901234568e+29): passed through, it would change."""
    raw = raw_with(b"x_counter", literal)
    with pytest.raises(IntegerOutOfRangeError) as excinfo:
        parse_trace(raw)
    reason = excinfo.value.reason
    assert reason.startswith(f"x_counter: integer {literal[:20].decode()}"), reason
    assert "64-bit range" in reason and len(reason) < 200


def test_an_integer_beyond_64_bits_deep_in_a_step_names_its_path() -> None:
    raw = raw_with(b"step_id", b"123456789012345678901234567890", where="step_id")
    with pytest.raises(IntegerOutOfRangeError, match=r"^steps\[1\]\.step_id: integer 1234"):
        parse_trace(raw)
    nested = trace_bytes().replace(b'"step_id":0', b'"step_id":0,"input":{"a":[1,2,-1e400]}')
    nested = nested.replace(b"-1e400", b"-" + b"7" * 25)
    with pytest.raises(IntegerOutOfRangeError, match=r"^steps\[0\]\.input\.a\[2\]: integer -777"):
        parse_trace(nested)


@pytest.mark.parametrize("first", [0, 1, 500, 998])
def test_of_several_integers_beyond_64_bits_the_first_in_the_document_is_named(
    first: int,
) -> None:
    big = b"123456789012345678901234567890"
    items = [b"1"] * 1000
    items[first], items[999] = big, b"-" + big
    raw = b'{"x":{"a":[' + b",".join(items) + b'],"b":' + big + b"}}"
    with pytest.raises(IntegerOutOfRangeError, match=rf"^x\.a\[{first}\]: integer {big.decode()}"):
        decode_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"' + b"k" * 100_000 + b'":123456789012345678901234567890}',
        b'{"a":' + b'{"key":' * 120 + b"123456789012345678901234567890" + b"}" * 121,
    ],
)
def test_the_path_of_an_integer_beyond_64_bits_is_cut_short_in_the_reason(raw: bytes) -> None:
    with pytest.raises(IntegerOutOfRangeError) as excinfo:
        decode_json(raw)
    assert len(excinfo.value.reason) < 300
    assert "...: integer 123456789012345678901234567890 is outside" in excinfo.value.reason


@pytest.mark.parametrize(
    "literal",
    [
        b"18446744073709551615",  # 2**64 - 1
        b"-9223372036854775808",  # -2**63
        b"1e+30",  # a float, written as a float: passed on as orjson writes floats
        b"12345678901234567890123.0",
    ],
)
def test_integers_within_64_bits_and_floats_pass(literal: bytes) -> None:
    document = parse_trace(raw_with(b"x_counter", literal)).document
    assert orjson.dumps(document["x_counter"]) == orjson.dumps(orjson.loads(literal))


def test_digits_and_exponents_inside_strings_are_not_numbers() -> None:
    document = make_trace(metadata={"agent_id": "123456789012345678901234567890"})
    document["steps"][0]["content"] = "1e+30 and 12345678901234567890123 are written as text"
    parse_trace(orjson.dumps(document))


@pytest.mark.parametrize("pluses", [0, 40, 5_000])  # looked at one by one, then all at once
def test_an_integer_beyond_64_bits_is_found_after_any_number_of_plus_signs(pluses: int) -> None:
    document = make_trace()
    document["steps"][0]["content"] = "a+b " * pluses
    parse_trace(orjson.dumps(document))
    raw = orjson.dumps(document)[:-1] + b',"x_after":-123456789012345678901234567890}'
    with pytest.raises(IntegerOutOfRangeError, match=r"^x_after: integer -1234"):
        parse_trace(raw)
