"""The trace and output schemas: their rules live only in ``schemas/reasoning-trace.schema.json``
and ``schemas/scored-trace.schema.json`` (which holds the trace schema for its ``trace``).

``jsonschema-rs`` checks a valid document in one call that builds no error object (~1.5 ms for
the largest trace, ``bench/hostile_inputs.py``). An invalid one is described by the first error
the validator reports, at its JSON path, quoting no more than a snippet of the producer's data.
``created_at`` is RFC 3339 by the validator's own date-time format (``T`` and ``Z`` in either
case, a leap second at 23:59:60 UTC), never a looser parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson

from worker.core.errors import SchemaViolationError, snippet

SCHEMA_DIR = Path(__file__).parent.parent / "schemas"
TRACE_SCHEMA_PATH = SCHEMA_DIR / "reasoning-trace.schema.json"
OUTPUT_SCHEMA_PATH = SCHEMA_DIR / "scored-trace.schema.json"
_PATH_CHARS = 120


@cache
def _validator(path: Path = TRACE_SCHEMA_PATH) -> jsonschema_rs.Validator:
    """The schema at ``path``, compiled once; its references to the trace schema resolve to
    the file."""
    trace = orjson.loads(TRACE_SCHEMA_PATH.read_bytes())
    registry = jsonschema_rs.Registry([(trace["$id"], trace)])
    schema = orjson.loads(path.read_bytes())
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True, registry=registry)


def json_path(path: Sequence[str | int]) -> str:
    """``steps[2].step_id``, ``x['a\\nb']`` (a key that is not printable, escaped); ``(root)``
    for the document itself. Cut past 120 characters: a reason fits one log line."""
    out = ""
    for part in path:
        quoted = isinstance(part, int) or not part.isprintable()
        out += f"[{part!r}]" if quoted else (f".{part}" if out else str(part))
    return (out if len(out) <= _PATH_CHARS else out[: _PATH_CHARS - 3] + "...") or "(root)"


def _describe(error: jsonschema_rs.ValidationError) -> str:
    """One line a producer can act on, never quoting more than a snippet of their data."""
    where, rule, got = json_path(error.instance_path), error.kind.name, error.instance
    expected = getattr(error.kind, "value", None)
    if rule == "type":
        names = " or ".join(expected) if isinstance(expected, list) else expected
        return f"{where}: expected {names}, got {type(got).__name__} {snippet(got)}"
    if rule == "required":
        return f"{where}: missing required field {expected!r}"
    if rule == "additionalProperties":
        return f"{where}: unexpected field(s) {snippet(expected)}"
    if rule == "enum":
        return f"{where}: {snippet(got)} is not one of {', '.join(map(str, expected or ()))}"
    if rule == "const":
        return f"{where}: expected {expected!r}, got {snippet(got)}"
    if rule in ("minimum", "maximum"):
        bound = "at least" if rule == "minimum" else "at most"
        return f"{where}: {snippet(got)} must be {bound} {expected}"
    if rule == "minLength" and expected == 1:
        return f"{where}: must not be empty"
    if rule == "minItems":
        return f"{where}: needs at least {expected} item(s)"
    if rule == "pattern":
        return f"{where}: {snippet(got)} does not match {expected}"
    if rule == "format":
        return f"{where}: {snippet(got)} is not a valid {expected}"
    return f"{where}: {snippet(got)} breaks the schema's {rule} rule ({snippet(expected)})"


def check_trace_document(document: dict[str, Any]) -> None:
    """Schema-check a decoded document; raises SchemaViolationError with the reason."""
    try:
        _validator().validate(document)
    except jsonschema_rs.ValidationError as error:
        raise SchemaViolationError(_describe(error)) from None
    except ValueError as exc:
        # Only Python objects that JSON cannot hold (a set, an int key) get here: parse_trace
        # never passes one.
        raise SchemaViolationError(f"(root): not a JSON document ({str(exc)[:120]})") from None


def output_violation(document: dict[str, Any]) -> tuple[bool, str] | None:
    """Why a decoded scored output breaks the output schema (its trace today's trace rules
    included), or None: whether the error is in the trace, and the reason at its path. The
    envelope's errors come before the trace's."""
    validator = _validator(OUTPUT_SCHEMA_PATH)
    try:
        if validator.is_valid(document):
            return None
        errors = sorted(validator.iter_errors(document), key=_in_trace)
    except ValueError as exc:  # a value JSON cannot hold, from a mapping given to the API
        return False, f"(root): not a JSON document ({str(exc)[:120]})"
    return _in_trace(errors[0]), _describe(errors[0])


def _in_trace(error: jsonschema_rs.ValidationError) -> bool:
    return error.instance_path[:1] == ["trace"]
