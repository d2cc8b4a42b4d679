"""Bytes -> validated ReasoningTrace, or a specific error saying what is wrong and where.

Each step costs time bounded by the size of the input, with a small constant, so that no
message can stall a partition: orjson decodes; one orjson write-back of the result checks the
nesting depth and, by counting colons, whether orjson silently dropped a repeated key (only
then does the exact pass that names the key run, over the least of the input it can) and, by
looking for exponents, whether it may have read an integer beyond 64 bits as a float (only then
does a pass that reads the integers' own text run); :mod:`worker.core.schema` checks the rules
of the schema file.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from itertools import islice
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from worker.core.errors import (
    DuplicateKeyError,
    EmptyMessageError,
    EncodingError,
    IntegerOutOfRangeError,
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
_VECTOR_COUNT_FROM = 32_768  # bytes from which numpy counts a byte faster than bytes.count


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


def _occurrences(data: bytes, *chars: bytes) -> int:
    """How many bytes of ``data`` are one of ``chars`` (single bytes).

    bytes.count looks at a byte at a time (~0.4-0.8 ms per MiB of JSON, per character);
    numpy compares and counts in SIMD, several times faster once the input is large enough
    to pay for its call overhead.
    """
    if len(data) < _VECTOR_COUNT_FROM:
        return sum(data.count(char) for char in chars)
    codes = np.frombuffer(data, dtype=np.uint8)
    return sum(int(np.count_nonzero(codes == ord(char))) for char in chars)


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
    if not isinstance(document, dict | list) or _occurrences(raw, b"[", b"{") <= limit:
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
    escape \\u003a (one colon when decoded, none in the input) are added back. Only backslashes
    that escape (``_escaped_bytes``) count, not an escaped backslash followed by "u003a".
    """
    colons, written_colons = _occurrences(raw, b":"), _occurrences(written, b":")
    if colons > written_colons:  # escaped colons only add to the input's count
        return True
    escaped = 0
    if b"\\" in raw and _COLON_ESCAPE.search(raw):  # memchr first; re beats bytes.find here
        codes = np.frombuffer(raw, dtype=np.uint8)
        letters = np.flatnonzero(_escaped_bytes(codes) & (codes == ord("u")))  # \u escapes
        letters = letters[letters + 4 < len(codes)]
        colon = (codes.take(letters + 4) | 0x20) == ord("a")  # a or A
        for place, code in enumerate(b"003", start=1):
            colon &= codes.take(letters + place) == code
        escaped = int(np.count_nonzero(colon))
    return colons + escaped > written_colons


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


def _matching_length(limit: int, alike: Callable[[int, int], bool]) -> int:
    """Largest ``n <= limit`` with ``alike(0, n)``, where ``alike(low, high)`` compares one run.

    Runs that double, then halving: memcmp-speed slices about as long as the common part in
    all, no loop per byte.
    """
    low, size = 0, 64
    while True:  # alike(0, low)
        high = min(low + size, limit)
        if not alike(low, high):
            break
        if high == limit:
            return limit
        low, size = high, size * 2
    high -= 1  # they differ at or before high
    while low < high:
        middle = (low + high + 1) // 2
        if alike(low, middle):
            low = middle
        else:
            high = middle - 1
    return low


def _common_prefix(first: bytes, second: bytes, start: int = 0, other: int = 0) -> int:
    """Length of the longest common prefix of ``first[start:]`` and ``second[other:]``."""
    return _matching_length(
        min(len(first) - start, len(second) - other),
        lambda low, high: first[start + low : start + high] == second[other + low : other + high],
    )


def _common_suffix(first: bytes, second: bytes, start: int, other: int) -> int:
    """Length of the longest common suffix of ``first[start:]`` and ``second[other:]``."""
    ends = len(first), len(second)
    return _matching_length(
        min(ends[0] - start, ends[1] - other),
        lambda low, high: (
            first[ends[0] - high : ends[0] - low] == second[ends[1] - high : ends[1] - low]
        ),
    )


def _hex_values() -> npt.NDArray[np.int32]:
    """Each byte's value as a hex digit, -1 for a byte that is none."""
    values = np.full(256, -1, dtype=np.int32)
    for digits, first in ((b"0123456789", 0), (b"abcdef", 10), (b"ABCDEF", 10)):
        values[np.frombuffer(digits, dtype=np.uint8)] = np.arange(first, first + len(digits))
    return values


_HEX_VALUES = _hex_values()
# UTF-8 of the code points a \u escape writes, by length: the lead byte's marks and the bits it
# keeps (each later byte: 0x80 and 6 bits), and the escape's bytes (6, or 12 for a surrogate
# pair) that the UTF-8 bytes replace.
_UTF8_FORMS = (
    (1, 0x00, 0x7F, 6),
    (2, 0xC0, 0x1F, 6),
    (3, 0xE0, 0x0F, 6),
    (4, 0xF0, 0x07, 12),
)


_SHORT_RUN = 16  # runs of backslashes measured a byte at a time up to this length


def _escaped_bytes(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Which bytes of ``codes`` a backslash escapes, backslashes aside: ``"`` in ``\\"``, ``u``
    in ``\\u00e9``. In a run of backslashes each escapes the next, so the byte after a run is
    escaped when the run's length is odd.

    Only the bytes after a run are looked at; runs are measured backwards a byte at a time
    (they are short in text: ``\\\\`` and ``\\"``), and any longer than ``_SHORT_RUN`` from the
    runs' starts: a few passes over the bytes whatever the runs' lengths.
    """
    slashes = codes == ord("\\")
    escaped = np.zeros(len(codes), dtype=np.bool_)
    if not slashes.any():
        return escaped
    np.greater(slashes[:-1], slashes[1:], out=escaped[1:])  # right after a run (a > b: a, not b)
    after = np.flatnonzero(escaped)
    length = np.ones(len(after), dtype=np.intp)
    longer = np.flatnonzero(slashes.take(np.maximum(after - 2, 0)) & (after >= 2))
    reach = 2
    while len(longer) and reach <= _SHORT_RUN:
        length[longer] = reach
        before = after.take(longer) - reach - 1
        longer = longer[slashes.take(np.maximum(before, 0)) & (before >= 0)]
        reach += 1
    if len(longer):
        firsts = np.flatnonzero(slashes[1:] & ~slashes[:-1]) + 1
        if slashes[0]:
            firsts = np.concatenate(([0], firsts))
        ends = after.take(longer)
        length[longer] = ends - firsts[np.searchsorted(firsts, ends - 1, side="right") - 1]
    escaped[after[(length & 1) == 0]] = False
    return escaped


def _unicode_escapes_written(
    codes: npt.NDArray[np.uint8], escapes: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]] | None:
    """``codes`` with each ``\\u`` escape (at ``escapes``) replaced by its character in UTF-8,
    as orjson writes it: the new bytes, and the bytes left to drop. None when there is no such
    escape, or a surrogate is not half of a pair (UTF-8 cannot write it).

    Escapes of control characters, the quote and the backslash stay: written out, they would
    end or break their string, and orjson writes the first two escaped itself.
    """
    escapes = escapes[escapes + 5 < len(codes)]
    points = np.zeros(len(escapes), dtype=np.int32)
    for place in range(2, 6):  # one gather per digit: a 2-D index costs several times more
        points = (points << 4) | _HEX_VALUES.take(codes.take(escapes + place))
    if not len(escapes) or (points < 0).any():
        return None
    characters = points
    three = points >= 0x800
    pairs = np.zeros(len(points), dtype=np.bool_)  # a high half with its low half right after
    surrogates = (points & 0xF800) == 0xD800
    if surrogates.any():
        high = (points >= 0xD800) & (points < 0xDC00)
        low = surrogates & ~high
        pairs[:-1] = high[:-1] & low[1:] & (escapes[1:] == escapes[:-1] + 6)
        paired = np.zeros(len(points), dtype=np.bool_)
        paired[1:] = pairs[:-1]
        if (high != pairs).any() or (low != paired).any():
            return None
        characters = points.copy()
        after = np.flatnonzero(pairs) + 1
        characters[pairs] = 0x10000 + ((points[pairs] - 0xD800) << 10) + (points[after] - 0xDC00)
        three &= ~surrogates
    one = (points >= 0x20) & (points < 0x80) & (points != ord('"')) & (points != ord("\\"))
    two = (points >= 0x80) & (points < 0x800)
    forms = (one, two, three, pairs)
    if not any(form.any() for form in forms):
        return None
    written, dropped = codes.copy(), np.zeros(len(codes), dtype=np.bool_)
    for (size, lead, lead_bits, span), form in zip(_UTF8_FORMS, forms, strict=True):
        chosen = np.flatnonzero(form)
        if not len(chosen):
            continue
        starts, values = escapes.take(chosen), characters.take(chosen)
        for place in range(size):  # bytes, not int32: numpy casts each element otherwise
            bits = (values >> (6 * (size - 1 - place))) & (0x3F if place else lead_bits)
            written[starts + place] = ((lead if place == 0 else 0x80) | bits).astype(np.uint8)
        for place in range(size, span):
            dropped[starts + place] = True
    return written, dropped


def _respelled(body: bytes) -> bytes:
    """``body`` (valid JSON) as orjson spells what it holds: the same tokens, the same strings.

    - Blanks between tokens are dropped. Strings lie between a quote that opens one and the
      next that closes it (a quote a backslash escapes, ``_escaped_bytes``, is inside one);
      every byte up to the space is a blank there (control characters are escaped inside
      strings).
    - In ASCII text (Python's json.dumps by default), ``\\u`` escapes are written out in UTF-8
      but for those of control characters, the quote and the backslash
      (``_unicode_escapes_written``).

    So an exact pass over the result sees the keys and objects a pass over ``body`` sees.
    Vectorised, a few passes over the bytes: milliseconds for a megabyte.
    """
    codes = np.frombuffer(body, dtype=np.uint8)
    escaped = _escaped_bytes(codes)
    # Masks are combined in place where they can be: each new array is pages to fault in.
    mask = np.empty(len(codes), dtype=np.bool_)
    spelled, drop = codes, None
    if body.isascii():
        np.logical_and(np.equal(codes, ord("u"), out=mask), escaped, out=mask)
        written = _unicode_escapes_written(codes, np.flatnonzero(mask) - 1)
        if written is not None:
            spelled, drop = written
    blanks = np.less_equal(codes, ord(" "), out=mask)
    if blanks.any():
        quotes = np.flatnonzero(np.greater(codes == ord('"'), escaped, out=escaped))
        # Stretches between quotes, each quote ending one: outside a string, inside, ...
        lengths = np.diff(quotes, prepend=-1, append=len(codes) - 1)
        parity = np.zeros(len(lengths), dtype=np.bool_)
        parity[1::2] = True
        outside = np.greater(blanks, np.repeat(parity, lengths), out=blanks)
        drop = outside if drop is None else np.logical_or(drop, outside, out=drop)
    if drop is None:
        return body
    return spelled[np.logical_not(drop, out=drop)].tobytes()


_FEW_PAIRS = 32  # an object with no more pairs than this has each written on its own
_ALLOWANCE = 2  # documents' worth of bytes the walks may write (_Rewrites)


@dataclass(slots=True)
class _Rewrites:
    """Bytes the walks to where the input differs may still write to measure children.

    Each level writes about its own container once, so a chain of nested containers, each
    nearly the whole document, would write the document once per level: past an allowance of
    twice the document the walks stop, and the exact pass reads more of the input (as exact,
    less narrow).
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
            if at > stop - length - 1 or low == 0:  # the comma before the run is not in it
                break
            high, stop, width = low, stop - length - 1, width * 2
        base = stop - length
    return _halve(node, items, low, high, (base, base + length), at, rewrites)


@dataclass(frozen=True, slots=True)
class _Level:
    """A container of the canonical text open at some offset, and its member holding it."""

    node: dict[str, Any] | list[Any]
    index: int  # that member; -1 where the container is empty (the offset at its end)
    start: int  # where the member starts (its key, in an object)
    end: int  # where it ends: the comma or closing bracket after it
    value: Any


def _locate(
    document: dict[str, Any], length: int, at: int, rewrites: _Rewrites
) -> list[_Level] | None:
    """The containers of the canonical text (``length`` long) open at ``at``, outermost first.

    The innermost is the last one whose member holding ``at`` is not itself a container open
    there, or the deepest reached before the allowance ran out. None if it was already out.
    """
    if rewrites.left <= 0:
        return None
    levels: list[_Level] = []
    node: dict[str, Any] | list[Any] = document
    span = (0, length)
    while True:
        items: list[Any] = list(node.items()) if isinstance(node, dict) else node
        if not items:
            levels.append(_Level(node, -1, at, at, None))
            return levels
        index, start, end = _child_at(node, items, span, at, rewrites)
        if isinstance(node, dict):
            key, value = items[index]
            begin = start + len(orjson.dumps(key)) + 1
        else:
            value, begin = items[index], start
        levels.append(_Level(node, index, start, end, value))
        if not (isinstance(value, dict | list) and begin < at < end and rewrites.left > 0):
            return levels
        node, span = value, (begin, end)


_OPEN, _COMMA, _VALUE = 0, 1, 2  # what the input read in a container so far ends with
_MAX_PIECES = 8  # stretches read apart before the rest of the input is read in one pass
_NEEDLE = 64  # bytes of the canonical text looked for where the input may read alike again
_PIECES_SHARE = 4  # pieces parse at most a quarter of the input, stand-ins included


class _Unsure(Exception):
    """The narrowed pass cannot tell: the pass over all of the input answers instead."""


@dataclass(slots=True)
class _Frame:
    """A container open at the reading point: the input's keys in it so far, and its place."""

    node: dict[str, Any] | list[Any]  # the container in the canonical text
    keys: list[str] | None  # None for an array
    done: int  # members of ``node`` before the reading point (with the one open in it)
    ends: int = _OPEN  # innermost frame: what the input read in it ends with


def _pairs(keys: list[str]) -> bytes:
    """``"key":0`` for each key, comma-separated, repeats kept."""
    if len(set(keys)) == len(keys):
        return orjson.dumps(dict.fromkeys(keys, 0))[1:-1]
    return b",".join(orjson.dumps(key) + b":0" for key in keys)


def _opening(frames: list[_Frame]) -> bytes:
    """JSON text that leaves a parser where the input's text leaves it at the reading point.

    The containers open there, each with the input's keys so far and 0 for every value: what
    was read before holds no repeated key but in those containers.
    """
    parts = []
    for frame in frames[:-1]:
        if frame.keys is None:
            parts.append(b"[")
        else:
            *before, key = frame.keys
            comma = b"," if before else b""
            parts.append(b"{" + _pairs(before) + comma + orjson.dumps(key) + b":")
    if frames:
        last = frames[-1]
        if last.keys is None:
            parts.append(b"[0" if last.ends == _VALUE else b"[")
        else:
            parts.append(b"{" + _pairs(last.keys) + (b"," if last.ends == _COMMA else b""))
    return b"".join(parts)


def _closers(frames: list[_Frame]) -> bytes:
    return b"".join(b"]" if frame.keys is None else b"}" for frame in reversed(frames))


def _check(keys: list[str]) -> None:
    """Raise as the exact pass does if an object closing with these keys repeats one."""
    if len(set(keys)) != len(keys):
        _reject_duplicate_keys([(key, 0) for key in keys])


def _read_alike(frames: list[_Frame], levels: list[_Level], done: int, ends: int) -> None:
    """Move the reading point over text the input shares with the canonical text.

    Shared text read from a point where both parse alike holds the same tokens, so the same
    objects: those wholly in it hold no repeated key. The containers it closes get the
    canonical text's remaining keys and are checked as they close (innermost first, as the
    exact pass closes them); those it opens (``levels``), the keys before the member it stops
    in; the innermost stops with ``done`` members read.
    """
    common = 0
    while common < min(len(frames), len(levels)) and frames[common].node is levels[common].node:
        common += 1
    while len(frames) > common:
        frame = frames.pop()
        if frame.keys is not None:
            frame.keys.extend(islice(frame.node, frame.done, None))
            _check(frame.keys)
    for depth, level in enumerate(levels):
        upto = done if depth == len(levels) - 1 else level.index + 1
        if depth == len(frames):
            frames.append(_Frame(level.node, [] if isinstance(level.node, dict) else None, 0))
        frame = frames[depth]
        if upto < frame.done:
            raise _Unsure
        if frame.keys is not None:
            frame.keys.extend(islice(level.node, frame.done, upto))
        frame.done = upto
    if frames:
        frames[-1].ends = ends


def _resume(levels: list[_Level], at: int) -> tuple[int, int, int, tuple[int, int] | None]:
    """Where to read the input again when it first differs at ``at``, and where it may end.

    Returns the offset (the start of the member holding ``at``, or ``at`` itself after a
    container or in an empty one: the text before it parses alike in both), the members read
    before it, what the input read ends with, and the end of the member (its offset and
    depth) after which the input may read alike again, if any. A number is read again whole:
    the input's could go on where the canonical one ends.
    """
    last = levels[-1]
    parent = (levels[-2].end, len(levels) - 2) if len(levels) > 1 else None
    if last.index < 0:
        return at, 0, _OPEN, parent
    if at == last.end and isinstance(last.value, dict | list):
        return at, last.index + 1, _VALUE, parent
    return last.start, last.index, _COMMA if last.index else _OPEN, (last.end, len(levels) - 1)


def _read_apart(
    document: dict[str, Any], text: bytes, ref: bytes, rewrites: _Rewrites, same: int
) -> None:
    """Raise the DuplicateKeyError of the exact pass over ``text``, parsing only where it differs.

    ``ref`` is the canonical text of ``document``, ``text`` the input (blanks between tokens
    dropped and escapes written out, where it has them), alike for their first ``same`` bytes.
    Each stretch where they differ is parsed from the member holding the first difference to
    where the text after that member in ``ref`` is found again in ``text``, inside a stand-in
    for the containers open there (``_opening``) and their closing brackets: that the piece
    parses proves the input is there at the same depth between members, outside strings, so what
    follows is read alike (``_read_alike``). The keys json saw in those containers carry on; an
    object that closed inside a piece with a repeated key is the first one. After
    ``_MAX_PIECES`` stretches, past a quarter of the input parsed in pieces, or where no
    resumption is found, the rest is parsed in one pass (``_read_rest``).
    """
    frames: list[_Frame] = []
    here = there = 0  # the reading point in text and in ref
    budget = len(text) // _PIECES_SHARE  # what pieces may parse: one that fails is parsed again
    for _ in range(_MAX_PIECES):
        differs = there + same
        if differs == len(ref) or here + same == len(text):
            if differs == len(ref) and here + same == len(text):
                _read_alike(frames, [], 0, _VALUE)
            raise _Unsure  # never expected: the input has a repeated key, ref has none
        levels = _locate(document, len(ref), differs, rewrites)
        if levels is None:
            break
        resume, done, ends, after = _resume(levels, differs)
        if not there <= resume <= differs:  # a walk cut short by the allowance
            break
        _read_alike(frames, levels, done, ends)
        shift = here - there
        here, there = resume + shift, resume
        needle = ref[after[0] : after[0] + _NEEDLE] if after else b""
        found = text.find(needle, differs + shift) if len(needle) == _NEEDLE else -1
        if found < 0 or after is None:
            break
        end, depth = after
        held = frames[: depth + 1]
        piece = _opening(frames) + text[here:found] + _closers(held)
        if len(piece) > budget:
            break
        budget -= len(piece)
        closed: list[list[tuple[str, Any]]] = []
        try:
            json.loads(piece, object_pairs_hook=closed.append)
        except ValueError:  # never inside the input's text: the input is not there as expected
            break
        objects = [frame for frame in held if frame.keys is not None]
        inside = len(closed) - len(objects)
        for pairs in closed[:inside]:  # closed in the input before anything after the piece
            _reject_duplicate_keys(pairs)
        for frame, pairs in zip(reversed(objects), closed[inside:], strict=True):
            frame.keys = [key for key, _ in pairs]
        del frames[depth + 1 :]
        frames[-1].done, frames[-1].ends = levels[depth].index + 1, _VALUE
        here, there = found, end
        same = _common_prefix(text, ref, here, there)
    _read_rest(document, text, ref, rewrites, frames, (here, there))


def _read_rest(
    document: dict[str, Any],
    text: bytes,
    ref: bytes,
    rewrites: _Rewrites,
    frames: list[_Frame],
    point: tuple[int, int],
) -> None:
    """The exact pass over the input from the reading point, its end shared with ref skipped.

    The end ``text`` shares with ``ref`` is cut at a comma or closing bracket of ``ref`` (the
    end of the member it starts in, or the comma before that member where ``text`` has it
    too): a text that holds as many unescaped quotes in the input as in ``ref`` (even), so the
    input is there outside strings, between the same tokens, and reads the rest alike, at the
    same depth. That rest is replaced by the keys that follow in each container open there,
    with 0 for values.
    """
    here, there = point
    tail, stop = b"", len(text)
    alike = _common_suffix(text, ref, here, there)
    levels = _locate(document, len(ref), len(ref) - alike, rewrites) if alike else None
    if levels:
        last, start = levels[-1], len(ref) - alike
        stop = start + len(text) - len(ref)
        comma = last.index > 0 and start == last.start and text[stop - 1 : stop] == b","
        if not comma and last.index >= 0:
            stop += last.end - start
        parts = []
        for level in reversed(levels):
            inner = comma and level is last  # the input read stops after a comma there
            after = level.index if inner else level.index + 1
            if isinstance(level.node, dict):
                pairs = _pairs(list(islice(level.node, after, None)))
                parts.append((pairs if inner or not pairs else b"," + pairs) + b"}")
            else:
                parts.append(b"0]" if inner else b"]")
        tail = b"".join(parts)
    json.loads(_opening(frames) + text[here:stop] + tail, object_pairs_hook=_reject_duplicate_keys)


def _raise_first_duplicate(raw: bytes, document: dict[str, Any], written: bytes) -> None:
    """Raise the DuplicateKeyError that json's exact pass over ``raw`` raises, parsing less.

    ``written`` is orjson's canonical text of ``document``. Text that ``raw`` shares with it,
    read from a point where both parse alike, holds the same objects, and those hold no
    repeated key (written has none): only the containers open across the stretches where the
    two differ are checked, with the keys of the shared text around them written from
    ``document`` (``_read_apart``). The first object that closes with a repeated key is then
    the same one, with the same key, as in a pass over all of ``raw``.

    Where ``raw`` first differs by a blank (Python's json.dumps puts a space after each
    separator, an indented text a newline), or is ASCII text that writes characters as ``\\u``
    escapes (json.dumps' default), the text compared and parsed is ``raw`` spelled as orjson
    spells it (``_respelled``): blanks between tokens dropped, escapes written out but for those
    of control characters, the quote and the backslash. The same tokens and strings, so the
    same objects with the same keys.

    Compact JSON (orjson's, JavaScript's JSON.stringify's, Python's json.dumps'), or blanks
    anywhere, cost a parse of the members around each repeated key (the latter also a few
    reads of both texts). Input that differs from orjson's text all along otherwise (UTF-8
    mixed with escapes, numbers written another way) costs a parse from the first difference
    to the last, at worst all of it, as the exact pass always did.
    """
    text, rewrites = raw.strip(_BLANKS), _Rewrites(left=int(_ALLOWANCE * len(written)))
    same = _common_prefix(text, written)
    if same < len(text) and (text[same] in _BLANKS or (b"\\u" in text and text.isascii())):
        text = _respelled(text)
        same = _common_prefix(text, written)
    with _gc_paused():
        try:
            with suppress(ValueError, _Unsure):  # never expected, but then: the wider pass
                _read_apart(document, text, written, rewrites, same)
            # Never reached either (the narrowed pass meets the repeated key), but if it were:
            # the pass over all of raw.
            json.loads(raw, object_pairs_hook=_reject_duplicate_keys)
        except RecursionError:
            raise InvalidJsonError("not valid JSON: nesting too deep") from None


# The integers orjson keeps as integers; any other it reads as the nearest float.
_INT_RANGE = (-(2**63), 2**64 - 1)
_INT_DIGITS = 20  # digits of the longest integer in range: a longer literal is out of it
_PLUS = b"+"
_PLUSES_LOOKED_AT = 32  # one at a time; past these, all of them at once with numpy


def _may_hold_big_integer(written: bytes) -> bool:
    """Whether orjson's text of a document may hold a float read from an integer beyond 64 bits.

    Such a float is at least 2**63 in size, and orjson writes every float that large with an
    exponent, ``9.2e+18``: a digit, ``e`` and ``+``. A "+" is rare in traces, and memchr finds
    the next one at SIMD speed (~0.1 us for a 2 KB trace; a search for ``e+`` took ~3 us, a
    tenth of a typical decode). Text that holds a digit, ``e+`` in a string, or a large float,
    costs the exact pass.
    """
    at = written.find(_PLUS, 2)
    for _ in range(_PLUSES_LOOKED_AT):
        if at < 0:
            return False
        if written[at - 1] == ord("e") and written[at - 2] in b"0123456789":
            return True
        at = written.find(_PLUS, at + 1)
    codes = np.frombuffer(written, dtype=np.uint8)
    digit = (codes[:-2] - np.uint8(ord("0"))) < 10  # wraps below "0": one compare
    return bool(np.any(digit & (codes[1:-1] == ord("e")) & (codes[2:] == ord("+"))))


class _OutOfRange:
    """An integer literal beyond 64 bits, where the exact pass read it."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _exact_integer(literal: str) -> int | _OutOfRange:
    digits = len(literal) - literal.startswith("-")
    if digits > _INT_DIGITS:  # and never int() of it: Python limits int() to 4300 digits
        return _OutOfRange(literal)
    value = int(literal)
    return value if _INT_RANGE[0] <= value <= _INT_RANGE[1] else _OutOfRange(literal)


def _first_out_of_range(node: Any, path: str) -> tuple[str, str] | None:
    """(JSON path, literal) of the first out-of-range integer in document order, if any."""
    if isinstance(node, _OutOfRange):
        return path or "(root)", node.literal
    if isinstance(node, dict):
        for key, value in node.items():
            found = _first_out_of_range(value, f"{path}.{key}" if path else key)
            if found:
                return found
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found = _first_out_of_range(value, f"{path}[{index}]")
            if found:
                return found
    return None


def _reject_big_integers(raw: bytes) -> None:
    """Raise IntegerOutOfRangeError naming the first integer beyond 64 bits in ``raw``.

    orjson reads such an integer as a float, so the trace would be published with another
    number (123456789012345678901234567890 as 1.2345678901234568e+29) where unknown fields
    are promised to pass through untouched. The exact pass reads the integers' own text.
    """
    with _gc_paused():
        document = json.loads(raw, parse_int=_exact_integer)
    found = _first_out_of_range(document, "")
    if found is not None:
        path, literal = found
        digits = len(literal) - literal.startswith("-")
        shown = literal if digits <= 40 else f"{literal[:20]}... ({digits} digits)"
        raise IntegerOutOfRangeError(
            f"{path}: integer {shown} is outside the 64-bit range "
            f"({_INT_RANGE[0]} to {_INT_RANGE[1]}) and cannot be passed through exactly"
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
    if len(raw) > max_bytes:
        raise TooLargeError(f"message is {len(raw)} bytes, over the {max_bytes}-byte limit")
    brackets = _occurrences(raw, b"{", b"[")
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
    written = _write_back(document, raw)
    if isinstance(document, dict) and _dropped_a_key(raw, written):
        # The exact pass names the first duplicate key; it builds objects in Python, so it
        # runs only for input that has one.
        _raise_first_duplicate(raw, document, written)
    if isinstance(document, dict) and _may_hold_big_integer(written):
        _reject_big_integers(raw)
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
