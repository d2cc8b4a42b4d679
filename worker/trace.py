"""Bytes -> validated ReasoningTrace, or a specific error saying what is wrong and where.

Validation uses ``schemas/reasoning-trace.schema.json`` through ``jsonschema``; the rules
live only in that file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import orjson
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match

SCHEMA_DIR = Path(__file__).parent / "schemas"
TRACE_SCHEMA_PATH = SCHEMA_DIR / "reasoning-trace.schema.json"
DEFAULT_MAX_BYTES = 1_048_576
MAX_DEPTH = 128  # nesting levels of arrays/objects, the document itself being level 1
_SNIPPET_CHARS = 60


class TraceError(Exception):
    """Input that cannot be scored: ``kind`` is stable (metrics, headers), ``reason`` for people."""

    kind: ClassVar[str] = "invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EmptyMessageError(TraceError):
    kind = "empty"


class TooLargeError(TraceError):
    kind = "too_large"


class EncodingError(TraceError):
    kind = "invalid_encoding"


class InvalidJsonError(TraceError):
    kind = "invalid_json"


class DuplicateKeyError(TraceError):
    kind = "duplicate_key"


class NotAnObjectError(TraceError):
    kind = "not_object"


class SchemaViolationError(TraceError):
    kind = "schema"


ERROR_KINDS: tuple[str, ...] = tuple(
    cls.kind
    for cls in (
        EmptyMessageError,
        TooLargeError,
        EncodingError,
        InvalidJsonError,
        DuplicateKeyError,
        NotAnObjectError,
        SchemaViolationError,
    )
)


@dataclass(frozen=True, slots=True)
class Trace:
    """A schema-valid ReasoningTrace. ``document`` is the parsed JSON, extra fields included."""

    document: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.document["id"])

    @property
    def domain(self) -> str:
        return str(self.document["metadata"]["task_domain"])

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.document["steps"]  # type: ignore[no-any-return]

    @property
    def success(self) -> bool:
        return bool(self.document["metadata"]["success"])

    @property
    def confidence(self) -> float:
        return float(self.document["outcome"]["confidence"])

    def embedding_text(self) -> str:
        """Objective, a space, then each step's content joined by spaces, as the reference does."""
        contents = " ".join(step.get("content", "") for step in self.steps)
        return f"{self.document['task']['objective']} {contents}"


def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return "T" in value or " " in value


@cache
def _validator() -> Draft202012Validator:
    schema = orjson.loads(TRACE_SCHEMA_PATH.read_bytes())
    Draft202012Validator.check_schema(schema)
    checker = FormatChecker(formats=())
    checker.checks("date-time")(_is_date_time)
    return Draft202012Validator(schema, format_checker=checker)


def _snippet(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."


def _json_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _describe(error: ValidationError) -> str:
    """One line a producer can act on, never quoting more than a snippet of their data."""
    where = _json_path(error.absolute_path)
    rule, expected, got = error.validator, error.validator_value, error.instance
    if rule == "enum":
        return f"{where}: {_snippet(got)} is not one of {', '.join(map(str, expected))}"
    if rule == "const":
        return f"{where}: expected {expected!r}, got {_snippet(got)}"
    if rule == "type":
        return f"{where}: expected {expected}, got {type(got).__name__} {_snippet(got)}"
    if rule == "required":
        missing = [name for name in expected if isinstance(got, dict) and name not in got]
        return f"{where}: missing required field {', '.join(map(repr, missing))}"
    if rule in ("minimum", "maximum"):
        bound = "at least" if rule == "minimum" else "at most"
        return f"{where}: {_snippet(got)} must be {bound} {expected}"
    if rule == "minLength":
        return f"{where}: must not be empty"
    if rule == "maxLength":
        return f"{where}: longer than {expected} characters"
    if rule == "minItems":
        return f"{where}: needs at least {expected} item(s)"
    if rule == "pattern":
        return f"{where}: {_snippet(got)} does not match {expected}"
    if rule == "format":
        return f"{where}: {_snippet(got)} is not a valid {expected}"
    return f"{where}: {error.message[:200]}"


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKeyError(
                f"key {_snippet(key)} appears twice in one object; its meaning is ambiguous"
            )
        seen[key] = value
    return seen


def _nested_deeper_than(document: Any, raw: bytes, limit: int) -> bool:
    """Whether arrays/objects nest more than ``limit`` levels (cheap unless the input could)."""
    if not isinstance(document, dict | list) or raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    level: list[Any] = [document]
    for _ in range(limit):
        level = [
            child
            for container in level
            for child in (container.values() if isinstance(container, dict) else container)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def decode_json(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Strict JSON: UTF-8 without BOM, no NaN/Infinity, no duplicate keys, size-limited."""
    if raw is None or len(raw) == 0:
        raise EmptyMessageError("message has no value (empty or tombstone)")
    if len(raw) > max_bytes:
        raise TooLargeError(f"message is {len(raw)} bytes, over the {max_bytes}-byte limit")
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = str(exc)
        if "UTF-8" in message or "surrogate" in message:
            raise EncodingError(f"not valid UTF-8 JSON text: {message}") from None
        raise InvalidJsonError(f"not valid JSON: {message}") from None
    if _nested_deeper_than(document, raw, MAX_DEPTH):
        # orjson reads 1024 levels but writes only 254, so a deeper trace could be parsed and
        # then not published; the scored output also wraps the trace in one more object.
        raise InvalidJsonError(f"not valid JSON: nested deeper than {MAX_DEPTH} levels")
    if isinstance(document, dict) and b'"' in raw:
        # orjson keeps the last of duplicate keys silently; a second strict pass catches them.
        try:
            json.loads(raw, object_pairs_hook=_reject_duplicate_keys)
        except RecursionError:
            raise InvalidJsonError("not valid JSON: nesting too deep") from None
    return document


def parse_trace(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Decode and validate one message; raises a TraceError subclass on any problem."""
    document = decode_json(raw, max_bytes)
    if not isinstance(document, dict):
        raise NotAnObjectError(
            f"expected a JSON object (ReasoningTrace), got {type(document).__name__}"
        )
    return validate_trace(document)


def validate_trace(document: dict[str, Any]) -> Trace:
    """Schema-check an already decoded document (the fast path never builds error objects)."""
    validator = _validator()
    if not validator.is_valid(document):
        # best_match picks the most specific error, so the path points at the bad field.
        error = best_match(validator.iter_errors(document))
        raise SchemaViolationError(_describe(error) if error else "does not match the schema")
    return Trace(document)
