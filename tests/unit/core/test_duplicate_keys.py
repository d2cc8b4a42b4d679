"""A key given twice in one object is always refused, and named where the message is small.

``decode_json`` finds a repeated key by counting colons against orjson's write-back; these
check it against the plain exact pass (json with a pairs hook), on documents with repeated
keys anywhere, written compactly, with Python's json.dumps escapes or spacing, on lines, or
with keys that hold quotes, colons, brackets, escapes and spaces; and on messages over the size
up to which the key is named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.errors import DuplicateKeyError, snippet
from worker.core.trace import NAMED_DUPLICATES_UP_TO, decode_json, parse_trace

from support.traces import make_trace

KEYS = ["a", "b", "k", "a b", "ab", " ab", "a:b", "a,b", 'q"', "\\", "{", "é", "\u2028", "\x01"]
KEYS += ["😀", "", ":", "\\u003a"]
# Styles of text: orjson's, json.dumps' escapes, json.dumps' spacing, a line per separator,
# spaces after some separators only, and colons in strings written as the escape \u003a.
STYLES = ["compact", "python", "dumps", "lines", "spaced", "colons"]


@dataclass(frozen=True)
class Pairs:
    """A JSON object as written: its pairs in order, repeated keys kept."""

    pairs: tuple[tuple[str, Any], ...]


def full_pass_reason(raw: bytes) -> str | None:
    """The first repeated key the exact pass over all of ``raw`` meets, if any."""

    def hook(pairs: list[tuple[str, Any]]) -> None:
        keys = [key for key, _ in pairs]
        for index, key in enumerate(keys):
            if key in keys[:index]:
                raise DuplicateKeyError(
                    f"key {snippet(key)} appears twice in one object; its meaning is ambiguous"
                )

    try:
        json.loads(raw, object_pairs_hook=hook)
    except DuplicateKeyError as error:
        return error.reason
    return None


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**6), 10**6),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.sampled_from(KEYS),
        st.text(max_size=4),
    )


# One strategy for every draw: built anew at each draw, it took half the repeats test's time
# (11 s, now 5-6).
TREES: st.SearchStrategy[Any] = st.recursive(
    scalars(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=5).map(
            lambda pairs: Pairs(tuple(pairs))
        ),
    ),
    max_leaves=40,
)


def write(node: Any, style: str, spaces: list[int]) -> str:
    """JSON text of ``node`` in ``style``; in "spaced", a space after the listed separators."""
    counter = [0]
    blank = {"dumps": " ", "lines": "\n  "}.get(style, "")

    def sep(text: str) -> str:
        counter[0] += 1
        return text + (" " if style == "spaced" and counter[0] in spaces else blank)

    def scalar(value: Any) -> str:
        if style in ("python", "dumps"):
            return json.dumps(value)
        if style == "colons" and isinstance(value, str):
            return orjson.dumps(value).decode().replace(":", "\\u003a")
        return orjson.dumps(value).decode()

    def go(value: Any) -> str:
        if isinstance(value, Pairs):
            body = sep(",").join(scalar(key) + sep(":") + go(item) for key, item in value.pairs)
            return "{" + body + "}"
        if isinstance(value, list):
            return "[" + sep(",").join(go(item) for item in value) + "]"
        return scalar(value)

    return go(node)


def check(raw: bytes) -> None:
    """decode_json refuses exactly what the full pass refuses, naming the same key."""
    expected = full_pass_reason(raw)
    try:
        decode_json(raw)
    except DuplicateKeyError as error:
        assert error.reason == expected
    else:
        assert expected is None


def objects_in(node: Any) -> Iterator[list[list[Any]]]:
    """Every object of a thawed ``node`` (objects as lists of [key, value]), ``node`` first."""
    if isinstance(node, Members):
        yield node
        for _, value in node:
            yield from objects_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from objects_in(item)


class Members(list[list[Any]]):
    """An object being built: its [key, value] pairs in order (a plain list is an array)."""


def thaw(node: Any) -> Any:
    if isinstance(node, Pairs):
        return Members([key, thaw(value)] for key, value in node.pairs)
    return [thaw(item) for item in node] if isinstance(node, list) else node


def freeze(node: Any) -> Any:
    if isinstance(node, Members):
        return Pairs(tuple((key, freeze(value)) for key, value in node))
    return [freeze(item) for item in node] if isinstance(node, list) else node


@st.composite
def repeated(draw: st.DrawFn) -> Pairs:
    """A root object with a key given again in some of its objects: as the object's first
    member, its last, or anywhere, with the value it had or another."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), TREES), min_size=1, max_size=6))
    root = thaw(Pairs(tuple(pairs)))
    for _ in range(draw(st.integers(1, 3))):
        objects = [found for found in objects_in(root) if found]
        target = objects[draw(st.integers(0, len(objects) - 1))]
        key, value = target[draw(st.integers(0, len(target) - 1))]
        if draw(st.booleans()):
            value = thaw(draw(TREES))
        target.insert(draw(st.integers(0, len(target))), [key, value])
    return freeze(root)  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.sampled_from(KEYS), TREES), min_size=1, max_size=6),
    style=st.sampled_from(STYLES),
    spaces=st.lists(st.integers(1, 60), max_size=3),
)
def test_any_document_is_refused_exactly_when_a_full_pass_finds_a_repeat(
    pairs: list[tuple[str, Any]], style: str, spaces: list[int]
) -> None:
    check(write(Pairs(tuple(pairs)), style, spaces).encode())


@settings(max_examples=300, deadline=None)
@given(
    document=repeated(),
    style=st.sampled_from(STYLES),
    spaces=st.lists(st.integers(1, 60), max_size=3),
)
def test_repeats_anywhere_name_the_key_a_full_pass_names(
    document: Pairs, style: str, spaces: list[int]
) -> None:
    raw = write(document, style, spaces).encode()
    assert full_pass_reason(raw) is not None
    check(raw)


def big_trace(extra: bytes, where: int) -> bytes:
    """A trace over the naming size, ``extra`` members added to step ``where`` of 20,000."""
    steps = [{"step_id": index, "type": "thought"} for index in range(20_000)]
    raw = orjson.dumps(make_trace(steps=steps))
    assert len(raw) > NAMED_DUPLICATES_UP_TO
    step = b'{"step_id":%d,' % where
    return raw.replace(step, step + extra + b",", 1)


@pytest.mark.parametrize("where", [0, 9_999, 19_999])
@pytest.mark.parametrize(
    "extra",
    [
        b'"type":"thought"',
        b'"x":{"k":{"c":{"d":1,"d":2}}}',
        b'"x":[{"k":1},{"k":1,"j":[],"k":[]}]',
        b'"x":"\\u003a","x":"\\u003a"',
    ],
)
def test_a_repeat_in_a_large_message_is_refused_with_a_general_reason(
    extra: bytes, where: int
) -> None:
    raw = big_trace(extra, where)
    with pytest.raises(DuplicateKeyError) as caught:
        parse_trace(raw)
    assert caught.value.kind == "duplicate_key"
    assert caught.value.reason.startswith("a key appears twice in one object")
    assert f"up to {NAMED_DUPLICATES_UP_TO} bytes" in caught.value.reason


@pytest.mark.parametrize(
    "extra",
    [
        b'"x":"' + b"\\u003a" * 5_000 + b'"',  # colons written as escapes
        b'"x":"\\\\u003a","y":"\\\\\\u003a"',  # an escaped backslash, then the text u003a
        b'"x":{"k":"a:b","\\u006b ":"\\u003A:"}',
    ],
)
def test_colons_written_as_escapes_in_a_large_message_are_no_repeat(extra: bytes) -> None:
    raw = big_trace(extra, 19_999)
    assert parse_trace(raw).document == orjson.loads(raw)


def test_the_key_is_named_up_to_the_naming_size_and_not_beyond() -> None:
    def sized(size: int) -> bytes:
        raw = b'{"k":1,"pad":"","k":2}'
        return raw.replace(b'"pad":""', b'"pad":"' + b"p" * (size - len(raw)) + b'"')

    with pytest.raises(DuplicateKeyError, match=r"^key 'k' appears twice"):
        decode_json(sized(NAMED_DUPLICATES_UP_TO))
    with pytest.raises(DuplicateKeyError, match=r"^a key appears twice"):
        decode_json(sized(NAMED_DUPLICATES_UP_TO + 1))
