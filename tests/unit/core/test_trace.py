"""Bytes -> validated trace, or an error whose kind is stable and whose reason names the field.
(What the schema refuses, and how its reasons read: ``test_schema.py``.)"""

from __future__ import annotations

import orjson
import pytest

from worker.core.errors import (
    ERROR_KINDS,
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
    code_review_example,
    finance_example,
    make_trace,
    step,
    steps_of,
    thin_steps,
    trace_bytes,
)

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


def test_every_error_class_has_its_own_kind_in_error_kinds() -> None:
    """ERROR_KINDS names every TraceError, each once (the published list, which the kinds'
    stability rests on, is the dead-letter schema's: test_output_schemas.py)."""

    def subclasses(cls: type[TraceError]) -> list[type[TraceError]]:
        return [sub for direct in cls.__subclasses__() for sub in (direct, *subclasses(direct))]

    kinds = [cls.kind for cls in subclasses(TraceError) if cls.__module__.startswith("worker.")]
    assert sorted(kinds) == sorted(ERROR_KINDS)
    assert set(INPUT_ERROR_KINDS) < set(ERROR_KINDS)


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


def test_a_ten_thousand_step_trace_parses() -> None:
    document = make_trace(steps=steps_of(*["thought", "tool_call"] * 5_000, tools={1: "grep"}))
    trace = parse_trace(orjson.dumps(document))
    assert len(trace.steps) == 10_000
    assert trace.document == document


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
