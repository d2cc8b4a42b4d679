"""Bytes -> validated ReasoningTrace, or a specific error saying what is wrong and where.

Each step costs time bounded by the size of the input, with a small constant, so that no
message can stall a partition: orjson decodes; one orjson write-back of the result checks the
nesting depth and, by counting colons, whether orjson silently dropped a repeated key (only
then does the exact pass that names the key run, over the least of the input it can);
:mod:`worker.core.schema` checks the rules of the schema file.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from itertools import islice
from typing import Any

import orjson

from worker.core.errors import (
    DuplicateKeyError,
    EmptyMessageError,
    EncodingError,
    InvalidJsonError,
    NotAnObjectError,
    TooLargeError,
    TraceError,
    snippet,
)
from worker.core.schema import check_trace_document

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_CONTAINERS",
    "MAX_DEPTH",
    "Trace",
    "TraceError",
    "parse_trace",
]

DEFAULT_MAX_BYTES = 1_048_576
# Objects and arrays a message may hold, counted before decoding as its "{" and "[" bytes
# (those inside strings too: a bound found in about a millisecond). Building the Python
# objects of a container-dense 1 MiB message takes 30-50 ms, whatever the decoder; a trace
# of 10,000 realistic steps has about 10,000-30,000.
DEFAULT_MAX_CONTAINERS = 131_072
MAX_DEPTH = 128  # nesting levels of arrays/objects, the document itself being level 1
_COLON_ESCAPE = re.compile(rb"\\u003[aA]")
_BLANKS = b" \t\n\r"  # JSON's whitespace; outside strings it means nothing
_BLANKS_AS_SPACES = bytes.maketrans(b"\t\n\r", b"   ")
# Every byte but the quote, the space and NUL: what the check for keys with spaces keeps.
_NOT_QUOTE_SPACE_NUL = bytes(byte for byte in range(256) if byte not in b'" \0')


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


# --- decoding ---------------------------------------------------------------------------------


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cycle collection while a decoder builds containers.

    A decode creates no garbage cycles, but each container it allocates counts towards the
    collector's thresholds: a 1 MiB array of small lists would start full collections that
    walk the whole process heap (the model included) several times. Collection resumes after.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@cache
def _orjson_write_depth() -> int:
    """How many nesting levels orjson writes (254 in 3.x), measured rather than assumed."""
    writable, too_deep = 1, 4096
    while too_deep - writable > 1:
        middle = (writable + too_deep) // 2
        nested: list[Any] = []
        for _ in range(middle - 1):
            nested = [nested]
        try:
            orjson.dumps(nested)
        except orjson.JSONEncodeError:
            too_deep = middle
        else:
            writable = middle
    return writable


def _nested_deeper_than(document: Any, raw: bytes, limit: int) -> bool:
    """Whether arrays/objects nest more than ``limit`` levels, by walking them level by level."""
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


def _too_deep() -> InvalidJsonError:
    # orjson reads 1024 levels but writes only 254, so a deeper trace could be parsed and then
    # not published; the scored output also wraps the trace in one more object.
    return InvalidJsonError(f"not valid JSON: nested deeper than {MAX_DEPTH} levels")


def _write_back(document: dict[str, Any] | list[Any], raw: bytes) -> bytes:
    """orjson's bytes for ``document``: its canonical text, and a depth check on the way.

    orjson refuses to write more levels than it can (``_orjson_write_depth``); wrapping the
    document in that many minus MAX_DEPTH arrays makes the write fail exactly when the
    document nests deeper than MAX_DEPTH: a depth check at the speed of a C serializer. The
    wrapping arrays are cut off again.
    """
    spare = _orjson_write_depth() - MAX_DEPTH
    if spare < 0:  # an orjson that writes fewer levels than the limit: walk instead
        if _nested_deeper_than(document, raw, MAX_DEPTH):
            raise _too_deep()
        return orjson.dumps(document)
    wrapped: Any = document
    for _ in range(spare):
        wrapped = [wrapped]
    try:
        written = orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        if "recursion" in str(exc).lower() or _nested_deeper_than(document, raw, MAX_DEPTH):
            raise _too_deep() from None
        raise InvalidJsonError(f"not valid JSON: {exc}") from None
    return written[spare:-spare] if spare else written


def _dropped_a_key(raw: bytes, written: bytes) -> bool:
    """Whether orjson kept only the last of a repeated key somewhere in ``raw``.

    Each key of the input has one colon after it, outside strings; colons inside strings are
    written back as they decode. So the input has more colons than orjson's write-back exactly
    when a key (with everything in its dropped value) was lost, once colons written as the
    escape \\u003a (one colon when decoded, none in the input) are added back. Backslash pairs
    are removed first so that an escaped backslash followed by "u003a" is not counted.
    """
    escaped = 0
    if b"\\" in raw and _COLON_ESCAPE.search(raw):  # memchr first; re beats bytes.find here
        unpaired = raw.replace(b"\\\\", b"")
        escaped = unpaired.count(b"\\u003a") + unpaired.count(b"\\u003A")
    return raw.count(b":") + escaped > written.count(b":")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> None:
    """json's object hook for the exact pass: raises for the first object with a repeated key.

    It returns nothing: only the error is wanted, and not building the objects makes the pass
    cheaper. json calls it for each object as it closes, so inner objects are checked first.
    """
    if len(dict(pairs)) == len(pairs):
        return
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKeyError(
                f"key {snippet(key)} appears twice in one object; its meaning is ambiguous"
            )
        seen.add(key)


def _common_prefix(first: bytes, second: bytes) -> int:
    """Length of the longest common prefix, by halving: a few memcmp calls, no loop per byte."""
    low, high = 0, min(len(first), len(second))
    while low < high:  # first[:low] == second[:low]; they differ somewhere before high + 1
        middle = (low + high + 1) // 2
        if first[low:middle] == second[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _offset_of_kept(text: bytes, number: int, blanks: bytes) -> int:
    """Offset in ``text`` of its byte ``number`` (from 0) among those that are not ``blanks``.

    By halving, each half's blanks counted with bytes.count: about two reads of the text for
    each kind of blank it holds (one kind, spaces, after one more read where it holds three or
    four), no loop per byte.
    """
    present = [bytes([blank]) for blank in blanks if blank in text]
    if len(present) > 2:
        text, present = text.translate(_BLANKS_AS_SPACES), [b" "]
    low, high, kept_low = 0, len(text), 0  # kept_low: bytes of text[:low] that are kept
    while high - low > 1:  # the byte is in text[low:high]
        middle = (low + high) // 2
        kept = kept_low + (middle - low) - sum(text.count(blank, low, middle) for blank in present)
        if kept > number:
            high = middle
        else:
            low, kept_low = middle, kept
    return low


def _no_key_holds_a_space(body: bytes, squeezed: bytes) -> bool:
    """Whether no key of the JSON text ``body`` holds a space (False also where unsure).

    ``squeezed`` is ``body`` without blanks: when it has as many ``":`` as ``body``, every key
    is followed by its colon with no blank between. Escaped backslashes and quotes dropped,
    those key ends are marked with NUL (so is a string that opens with a colon: unsure); of
    quotes, spaces and marks, a key holding a space then leaves a space right before its mark.
    \\u0020 anywhere answers False.
    """
    text = body
    if b"\\" in text:
        if b"\\u0020" in text:
            return False
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    marked = text.replace(b'":', b"\0")
    key_ends = len(text) - len(marked) if text is body else body.count(b'":')
    if squeezed.count(b'":') != key_ends:
        return False
    return b" \0" not in marked.translate(None, _NOT_QUOTE_SPACE_NUL)


_FEW_PAIRS = 32  # an object with no more pairs than this has each written on its own


@dataclass(slots=True)
class _Rewrites:
    """Bytes the walk to where the input differs may still write to measure children.

    Each level writes about its own container once, so a chain of nested containers, each
    nearly the whole document, would write the document once per level: past an allowance of
    twice the document the walk stops, and the exact pass starts at the container it reached
    (as exact, less narrow).
    """

    left: int

    def run_length(
        self, node: dict[str, Any] | list[Any], items: list[Any], low: int, high: int
    ) -> int:
        """Bytes orjson writes for children ``low:high`` of ``node``, commas between included."""
        run = items[low:high]
        written = orjson.dumps(dict(run) if isinstance(node, dict) else run)
        self.left -= len(written)
        return len(written) - 2


def _halve(
    node: dict[str, Any] | list[Any],
    items: list[Any],
    low: int,
    high: int,
    span: tuple[int, int],
    at: int,
    rewrites: _Rewrites,
) -> tuple[int, int, int]:
    """Index, start and end of the child among ``low:high`` (written at ``span``) reaching ``at``.

    Each step writes the first half of what is left: about one write of the run in all.
    """
    base, stop = span
    while high - low > 1:
        middle = (low + high) // 2
        split = base + rewrites.run_length(node, items, low, middle) + 1
        if at < split:
            high, stop = middle, split - 1
        else:
            low, base = middle, split
    return low, base, stop


def _child_at(
    node: dict[str, Any] | list[Any],
    items: list[Any],
    span: tuple[int, int],
    at: int,
    rewrites: _Rewrites,
) -> tuple[int, int, int]:
    """Index, start and end of the child of ``node`` (written at ``span``) reaching ``at``.

    Children are measured by writing them again with orjson, starting from the end of the run
    nearer to ``at`` with runs that double (a trace's error is as often in its last step as in
    its first), then halving the run that reaches ``at``. An object with few pairs has each
    written on its own but its largest, which is then measured by what is left: a trace's
    ``steps`` is not written again to find out that ``at`` lies inside it.
    """
    count = len(items)
    first, last = span[0] + 1, span[1] - 1  # where the children's text starts and ends
    if isinstance(node, dict) and count <= _FEW_PAIRS:
        hints = [len(value) if isinstance(value, str | list | dict) else 0 for _, value in items]
        largest = hints.index(max(hints))
        sizes = [
            rewrites.run_length(node, items, index, index + 1) if index != largest else 0
            for index in range(count)
        ]
        sizes[largest] = last - first - sum(sizes) - (count - 1)
        offset = first
        for index, size in enumerate(sizes):
            if at < offset + size + 1:
                return index, offset, offset + size
            offset += size + 1
        return count - 1, offset - sizes[-1] - 1, last
    width = 1
    if at - first <= last - at:
        low, base = 0, first
        while True:
            high = min(low + width, count)
            length = rewrites.run_length(node, items, low, high)
            if at < base + length + 1 or high == count:
                break
            low, base, width = high, base + length + 1, width * 2
    else:
        high, stop = count, last
        while True:
            low = max(high - width, 0)
            length = rewrites.run_length(node, items, low, high)
            if at >= stop - length - 1 or low == 0:
                break
            high, stop, width = low, stop - length - 1, width * 2
        base = stop - length
    return _halve(node, items, low, high, (base, base + length), at, rewrites)


def _child_holding(
    node: dict[str, Any] | list[Any], span: tuple[int, int], at: int, rewrites: _Rewrites
) -> tuple[bytes, Any, tuple[int, int]] | None:
    """The container child of ``node`` open at offset ``at`` of the canonical text, if any.

    ``node`` is written at ``span`` of the text. Returns the text that opens ``node`` up to
    that child (for an object, the keys before it, with dummy values: they closed before
    ``at``), the child, and where the child is written.
    """
    items: list[Any] = list(node.items()) if isinstance(node, dict) else node
    if not items:
        return None
    index, begin, finish = _child_at(node, items, span, at, rewrites)
    if isinstance(node, dict):
        key, child = items[index]
        written_key = orjson.dumps(key)
        before = orjson.dumps(dict.fromkeys(islice(node, index), 0))[:-1]
        opening = before + (b"," if index else b"") + written_key + b":"
        begin += len(written_key) + 1
    else:
        child, opening = items[index], b"["
    if isinstance(child, dict | list) and begin < at < finish:
        return opening, child, (begin, finish)
    return None


def _raise_first_duplicate(raw: bytes, document: dict[str, Any], written: bytes) -> None:
    """Raise the DuplicateKeyError that json's exact pass over ``raw`` raises, parsing less.

    ``written`` is orjson's canonical text of ``document``. Up to the first byte where ``raw``
    differs from it, ``raw`` holds no object with a repeated key (written has none, and the
    same text is the same objects), so every object that closes before that byte can be
    skipped: json parses from the innermost container open there, inside a stand-in for its
    ancestors that repeats their keys seen so far. The first object that closes with a
    repeated key is then the same one, with the same key, as in a pass over all of ``raw``.

    Where ``raw`` first differs by a blank (Python's json.dumps puts a space after each
    separator, an indented text a newline) and no key of it holds a space, the two texts are
    compared with their blanks dropped (spaces inside strings too: the only ones in
    ``written``). Texts alike but for blanks hold the same tokens, nested alike; their strings
    differ at most by spaces, which no key holds (nor, decoded from ``raw``, any key of
    ``written``), so every key is the same and the argument above holds as it is. A key with
    a space could pass for another key without it, so such input is compared byte for byte.

    Compact JSON with unescaped UTF-8 (orjson's, JavaScript's JSON.stringify's), or blanks
    anywhere, cost a parse of the objects around the repeated key (the latter also a few
    reads of both texts). Input that differs from orjson's text early otherwise (escapes,
    numbers written another way) costs a parse from there to the object with the repeated
    key, at worst all of it, as the exact pass always did.
    """
    body = raw.lstrip(_BLANKS)
    at = _common_prefix(body, written)
    squeezed = body.translate(None, _BLANKS) if at < len(body) and body[at] in _BLANKS else b""
    blind = bool(squeezed) and _no_key_holds_a_space(body, squeezed)
    if blind:  # `at` becomes the first byte of written that differs once blanks are dropped
        at = _offset_of_kept(written, _common_prefix(squeezed, written.translate(None, b" ")), b" ")
    node: dict[str, Any] | list[Any] = document
    heads: list[bytes] = []
    span, rewrites = (0, len(written)), _Rewrites(left=2 * len(written))
    while rewrites.left > 0 and (child := _child_holding(node, span, at, rewrites)):
        opening, node, span = child
        heads.append(opening)
    begin = span[0]
    if blind and begin:  # the same token of body: as many bytes not blank before it
        begin = _offset_of_kept(body, begin - written.count(b" ", 0, begin), _BLANKS)
    narrowed = b"".join(heads) + body[begin:]
    with _gc_paused():
        try:
            with suppress(ValueError):  # never expected: the stand-in is JSON when raw is
                json.loads(narrowed, object_pairs_hook=_reject_duplicate_keys)
            # Never reached either (the narrowed text holds the object with the repeated key),
            # but if it were: the pass over all of raw.
            json.loads(raw, object_pairs_hook=_reject_duplicate_keys)
        except RecursionError:
            raise InvalidJsonError("not valid JSON: nesting too deep") from None


def decode_json(
    raw: bytes | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_containers: int = DEFAULT_MAX_CONTAINERS,
) -> Any:
    """Strict JSON: UTF-8 without BOM, no NaN/Infinity, no duplicate keys, size-limited."""
    if raw is None or len(raw) == 0:
        raise EmptyMessageError("message has no value (empty or tombstone)")
    if len(raw) > max_bytes:
        raise TooLargeError(f"message is {len(raw)} bytes, over the {max_bytes}-byte limit")
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
        raise InvalidJsonError(f"not valid JSON: {message}") from None
    if not isinstance(document, dict | list):
        return document
    written = _write_back(document, raw)
    if isinstance(document, dict) and _dropped_a_key(raw, written):
        # The exact pass names the first duplicate key; it builds objects in Python, so it
        # runs only for input that has one.
        _raise_first_duplicate(raw, document, written)
    return document


def parse_trace(
    raw: bytes | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_containers: int = DEFAULT_MAX_CONTAINERS,
) -> Trace:
    """Decode and validate one message; raises a TraceError subclass on any problem."""
    document = decode_json(raw, max_bytes, max_containers)
    if not isinstance(document, dict):
        raise NotAnObjectError(
            f"expected a JSON object (ReasoningTrace), got {type(document).__name__}"
        )
    return validate_trace(document)


def validate_trace(document: dict[str, Any]) -> Trace:
    """Schema-check an already decoded document."""
    check_trace_document(document)
    return Trace(document)
