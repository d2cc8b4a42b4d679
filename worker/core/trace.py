"""Bytes -> validated Trace, or a specific error saying what is wrong and where.

Strict JSON (UTF-8 without BOM, no NaN or Infinity, no key given twice, no integer beyond 64
bits, at most MAX_DEPTH levels) in time bounded by the input's size: the size and the number of
containers are counted before decoding, orjson decodes, :mod:`worker.core.schema` then checks the
schema's rules. Target (``python bench/hostile_inputs.py``): <= 50 ms for any input up to the
size limit, decoded and validated; <= 0.2 ms for a typical trace.

The standard decoder with hooks (object_pairs_hook, parse_int, parse_constant) is strict but
for 1e400, lone surrogates and depth, and it calls Python for every object and integer. Its
column ``json`` against ``decode`` in that bench (EPYC, 2 CPUs at load 2.9, 2026-11-29): 1 MiB
of zeros 131 vs 12 ms, the most steps that fit 37 vs 9 ms, a root key given twice 57 vs 14 ms,
a typical trace 0.09 vs 0.06 ms. So orjson decodes, and one orjson write-back of the result
checks what it is not exact on:

- nesting: orjson reads 1024 levels and writes 254; wrapped in 254 - MAX_DEPTH arrays, the
  write-back fails exactly when the document nests deeper than MAX_DEPTH.
- a key given twice: orjson keeps the last; ``raw`` then holds more colons than the write-back
  (writing back takes 2-3 ms a MiB, counting 1-9). The exact pass that names the key costs
  what ``json`` does, so it runs only on messages up to NAMED_DUPLICATES_UP_TO.
- an integer beyond 64 bits: orjson reads it as a float. The exact pass (``json.loads``, which
  reads integers exactly) runs only when the write-back holds a float written with "e+" and
  ``raw`` a run of 19 digits: "bad: integer beyond 64 bits, last step", which pays it, decodes
  in 39 ms against 9 for the most steps that fit.

A value framed by a Confluent Schema Registry serializer (magic byte 0, a 4-byte big-endian
schema id, then the document) is unwrapped here, in the one decode path of the worker and of
``replay``: :func:`unframe`.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import orjson

from worker.core.errors import (
    DuplicateKeyError,
    EmptyMessageError,
    EncodingError,
    FramingError,
    IntegerOutOfRangeError,
    InvalidJsonError,
    NotAnObjectError,
    TooLargeError,
    snippet,
)
from worker.core.schema import check_trace_document, json_path
from worker.settings import RepeatedKeyError, unique_keys

DEFAULT_MAX_BYTES = 1_048_576
# How input values are framed (KP_INPUT_FRAMING); :func:`unframe` says what each one does.
Framing = Literal["auto", "json", "confluent"]
# The Confluent wire format: magic byte 0, then the schema id as 4 big-endian bytes. A JSON
# text never starts with byte 0 (only whitespace or a value may open it, and a NUL byte is
# neither), so "auto" cannot take a plain document for a framed one.
_MAGIC = b"\x00"
FRAME_HEADER_BYTES = 5
# Objects and arrays a message may hold, counted before decoding as its "{" and "[" bytes
# (those inside strings too: a bound found in about a millisecond). Building the Python
# objects of a container-dense 1 MiB message takes 30-50 ms, whatever the decoder; a trace
# of 10,000 realistic steps has about 10,000-30,000.
DEFAULT_MAX_CONTAINERS = 131_072
MAX_DEPTH = 128  # nesting levels of arrays/objects, the document itself being level 1
# Up to this size the key given twice is named by a second, exact pass (about 1 ms at most);
# over it the reason is general: naming it costs a pass that builds every object in Python.
NAMED_DUPLICATES_UP_TO = 65_536
_COLON_ESCAPE = re.compile(rb"\\u003[aA]")
INT_RANGE = (-(2**63), 2**64 - 1)  # the integers orjson keeps; any other becomes a float
_INT_DIGITS = 19  # digits of the shortest integer out of that range
_INT_CHARS = 21  # "-" and the 20 digits of the longest in it
_DIGITS_AS_ZERO = bytes(48 if 48 <= code <= 57 else 32 for code in range(256))


@dataclass(frozen=True, slots=True)
class Trace:
    """A schema-valid ReasoningTrace. ``document`` is the parsed JSON, extra fields included."""

    document: dict[str, Any]
    # The Schema Registry id the value was framed with; None for a plain JSON value.
    schema_id: int | None = None

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


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cycle collection while a decoder builds containers: each one counts towards the
    collector's thresholds, and a container-dense message would start full collections that
    walk the whole process heap (the model included) several times: orjson.loads of 131,000
    empty arrays beside 2 million other objects takes 14 ms paused, 22 ms not."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@cache
def _orjson_write_depth() -> int:
    """How many nesting levels orjson writes (254 in 3.x), measured rather than assumed."""
    nested: list[Any] = []
    written = 0
    while True:
        try:
            orjson.dumps(nested)
        except orjson.JSONEncodeError:
            return written
        nested, written = [nested], written + 1


def _write_back(document: dict[str, Any] | list[Any]) -> bytes:
    """orjson's text of ``document``, checking its depth on the way.

    orjson reads 1024 levels but writes only ``_orjson_write_depth``: wrapped in that many
    minus MAX_DEPTH arrays, the document fails to write exactly when it nests deeper than
    MAX_DEPTH (a deeper trace could be parsed and then not published).
    """
    spare = _orjson_write_depth() - MAX_DEPTH
    wrapped: Any = document
    for _ in range(spare):
        wrapped = [wrapped]
    try:
        written = orjson.dumps(wrapped)
    except orjson.JSONEncodeError:  # the depth: orjson writes any other value it read
        raise InvalidJsonError(f"not valid JSON: nested deeper than {MAX_DEPTH} levels") from None
    return written[spare:-spare] if spare else written


def _dropped_a_key(raw: bytes, written: bytes) -> bool:
    """Whether orjson kept only the last of a repeated key somewhere in ``raw``.

    Each key has one colon after it, outside strings, and colons inside strings are written
    back as they decode: so ``raw`` has more colons (counting each escape \\u003a as one) than
    orjson's write-back exactly when a key was lost. A run of backslashes pairs from its start,
    as JSON reads it: with each escaped backslash removed, one left before "u003a" escapes it.
    """
    colons = raw.count(b":")
    if _COLON_ESCAPE.search(raw):  # re: 0.3 ms a MiB, bytes.count 0.6-1.7 ms a spelling
        unpaired = raw.replace(b"\\\\", b"")
        colons += unpaired.count(b"\\u003a") + unpaired.count(b"\\u003A")
    return colons > written.count(b":")


def _duplicate_key_error(raw: bytes) -> DuplicateKeyError:
    if len(raw) <= NAMED_DUPLICATES_UP_TO:
        try:
            json.loads(raw, object_pairs_hook=unique_keys)  # the first object with a repeated key
        except RepeatedKeyError as exc:
            return DuplicateKeyError(
                f"key {snippet(exc.key)} appears twice in one object; its meaning is ambiguous"
            )
    return DuplicateKeyError(
        "a key appears twice in one object; its meaning is ambiguous (the key is named only "
        f"in messages up to {NAMED_DUPLICATES_UP_TO} bytes)"
    )


class _OutOfRange:
    """An integer literal too long for ``int()`` (4300 digits), where the exact pass read it."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _long_literal(literal: str) -> int | _OutOfRange:
    return int(literal) if len(literal) <= _INT_CHARS else _OutOfRange(literal)


def _writable(values: list[Any]) -> bool:
    """Whether orjson writes ``values``: not if they hold an integer beyond 64 bits."""
    try:
        orjson.dumps(values)
    except orjson.JSONEncodeError:
        return False
    return True


def _out_of_range_path(node: Any) -> tuple[list[str | int], str]:
    """The path and literal of the first integer beyond 64 bits in ``node``, in document order.

    Each container is halved to the first part that orjson cannot write, at C speed: a few
    passes over the document, not a Python call per value (3-5 ms for the bench's "integer
    beyond 64 bits, last step", 38 ms for a walk in Python).
    """
    path: list[str | int] = []
    while isinstance(node, dict | list):
        keys = list(node) if isinstance(node, dict) else range(len(node))
        values = list(node.values()) if isinstance(node, dict) else node
        low, high = 0, len(values)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if _writable(values[low:middle]) else (low, middle)
        path.append(keys[low])
        node = values[low]
    if isinstance(node, _OutOfRange):
        return path, node.literal
    if isinstance(node, int) and not INT_RANGE[0] <= node <= INT_RANGE[1]:
        return path, str(node)
    raise ValueError("no integer beyond 64 bits found")  # a part nested past orjson's limit


def _may_hold_big_integer(raw: bytes, written: bytes) -> bool:
    """Whether ``raw`` may hold an integer beyond 64 bits, in about a millisecond per MiB: orjson
    writes one as a float with an exponent (``1.2345678901234568e+29``), and its literal has 19
    digits or more in a row. A "+" is rare in traces and found at memchr speed: 0.03 ms a MiB
    of steps, "e+" 1 ms."""
    return (
        b"+" in written
        and b"e+" in written
        and b"0" * _INT_DIGITS in raw.translate(_DIGITS_AS_ZERO)
    )


def _reject_big_integers(raw: bytes) -> None:
    """Raise IntegerOutOfRangeError naming the first integer beyond 64 bits in ``raw``: unknown
    fields pass through untouched, and orjson would publish 123456789012345678901234567890 as
    1.2345678901234568e+29. This exact pass reads the integers' own text."""
    with _gc_paused():
        try:
            document = json.loads(raw)  # Python reads integers exactly, at C speed
        except ValueError:  # but refuses one of over 4300 digits
            document = json.loads(raw, parse_int=_long_literal)
    if not _writable([document]):
        raise integer_out_of_range(*_out_of_range_path(document))


def integer_out_of_range(path: list[str | int], literal: str) -> IntegerOutOfRangeError:
    """The error for an integer beyond 64 bits at ``path``, quoting at most 20 of its digits."""
    digits = len(literal.lstrip("-"))
    shown = literal if digits <= 40 else f"{literal[:20]}... ({digits} digits)"
    return IntegerOutOfRangeError(
        f"{json_path(path)}: integer {shown} is outside the 64-bit range "
        f"({INT_RANGE[0]} to {INT_RANGE[1]}) and cannot be passed through exactly"
    )


def decode_json(
    raw: bytes | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_containers: int = DEFAULT_MAX_CONTAINERS,
) -> Any:
    """Strict JSON: UTF-8 without BOM, no NaN/Infinity, no duplicate keys, no integer beyond
    64 bits (it would not be passed through exactly), size-limited."""
    if raw is None or len(raw) == 0:
        raise EmptyMessageError("message has no value (empty or tombstone)")
    _check_size(raw, max_bytes)
    brackets = raw.count(b"{") + raw.count(b"[")
    if brackets > max_containers:
        raise TooLargeError(
            f"message has {brackets} '{{' and '[' characters, over the limit of "
            f"{max_containers} objects and arrays (counted before decoding, in strings too)"
        )
    try:
        with _gc_paused():
            document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = str(exc)
        if "UTF-8" in message or "surrogate" in message:
            raise EncodingError(f"not valid UTF-8 JSON text: {message}") from None
        if "infinity" in message:  # an integer too long even for a float: name its path
            with suppress(ValueError, RecursionError):
                _reject_big_integers(raw)
        raise InvalidJsonError(f"not valid JSON: {message}") from None
    if not isinstance(document, dict | list):
        return document
    written = _write_back(document)
    if isinstance(document, dict) and _dropped_a_key(raw, written):
        raise _duplicate_key_error(raw)
    if isinstance(document, dict) and _may_hold_big_integer(raw, written):
        _reject_big_integers(raw)
    return document


def _check_size(raw: bytes, max_bytes: int) -> None:
    if len(raw) > max_bytes:
        raise TooLargeError(f"message is {len(raw)} bytes, over the {max_bytes}-byte limit")


def unframe(raw: bytes, framing: Framing = "auto") -> tuple[bytes, int | None]:
    """The JSON document of a non-empty value and its Schema Registry id (None if unframed).

    ``json`` returns the value as it is (a framed one then fails as ``invalid_json``);
    ``auto`` unwraps a value that starts with the magic byte 0; ``confluent`` requires it.
    """
    if framing == "json":
        return raw, None
    if raw[:1] != _MAGIC:
        if framing == "confluent":
            raise FramingError(
                f"expected Schema Registry framing (magic byte 0, then a 4-byte schema id), "
                f"got a value starting with {snippet(raw[:8])} (KP_INPUT_FRAMING=confluent)"
            )
        return raw, None
    if len(raw) < FRAME_HEADER_BYTES:
        raise FramingError(
            f"Schema Registry frame cut short: magic byte 0 and {len(raw) - 1} of the 4 "
            f"schema-id bytes, no document"
        )
    schema_id = int.from_bytes(raw[1:FRAME_HEADER_BYTES], "big")
    if len(raw) == FRAME_HEADER_BYTES:
        raise FramingError(f"Schema Registry frame (schema id {schema_id}) holds no document")
    return raw[FRAME_HEADER_BYTES:], schema_id


def parse_trace(
    raw: bytes | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_containers: int = DEFAULT_MAX_CONTAINERS,
    framing: Framing = "auto",
) -> Trace:
    """Decode and validate one message; raises a TraceError subclass on any problem.

    The size limit applies to the value as received, frame included.
    """
    schema_id = None
    if raw:
        _check_size(raw, max_bytes)
        raw, schema_id = unframe(raw, framing)
    document = decode_json(raw, max_bytes, max_containers)
    if not isinstance(document, dict):
        raise NotAnObjectError(
            f"expected a JSON object (ReasoningTrace), got {type(document).__name__}"
        )
    check_trace_document(document)
    return Trace(document, schema_id)


def validate_trace(document: dict[str, Any]) -> Trace:
    """Schema-check an already decoded document."""
    check_trace_document(document)
    return Trace(document)
