"""The duplicate key named is the one a json pass over the whole input names, however written.

``decode_json`` parses again only around the first place where the input differs from orjson's
own text of it (blanks aside, when no key holds a space); this checks that against the plain
exact pass (json with a pairs hook), on documents with repeated keys anywhere, written
compactly, with Python's json.dumps escapes or spacing, on lines, with odd whitespace, or with
keys that hold quotes, colons, brackets, escapes and spaces (some alike but for a space).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core import trace as trace_module
from worker.core.errors import DuplicateKeyError
from worker.core.trace import (
    _BLANKS,
    _no_key_holds_a_space,
    _offset_of_kept,
    _reject_duplicate_keys,
    decode_json,
)

KEYS = ["a", "b", "k", "a b", "ab", " ab", "a:b", "a,b", 'q"', "\\", "{", "é", "\u2028", "\x01"]
KEYS += ["😀", ""]
# Styles of text: orjson's, json.dumps' escapes, json.dumps' spacing, a line per separator, and
# spaces after some separators only.
STYLES = ["compact", "python", "dumps", "lines", "spaced"]


@dataclass(frozen=True)
class Pairs:
    """A JSON object as written: its pairs in order, repeated keys kept."""

    pairs: tuple[tuple[str, Any], ...]


def full_pass_reason(raw: bytes) -> str | None:
    """What the exact pass over all of ``raw`` names (the pass decode_json once ran), if any."""
    try:
        json.loads(raw, object_pairs_hook=_reject_duplicate_keys)
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


def trees() -> st.SearchStrategy[Any]:
    return st.recursive(
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

    def string(value: str) -> str:
        if style in ("python", "dumps"):
            return json.dumps(value)
        return orjson.dumps(value).decode()

    def go(value: Any) -> str:
        if isinstance(value, Pairs):
            body = sep(",").join(string(key) + sep(":") + go(item) for key, item in value.pairs)
            return "{" + body + "}"
        if isinstance(value, list):
            return "[" + sep(",").join(go(item) for item in value) + "]"
        if isinstance(value, str):
            return string(value)
        if style in ("python", "dumps"):
            return json.dumps(value)
        return orjson.dumps(value).decode()

    return go(node)


def check(raw: bytes) -> None:
    """decode_json names the key the full pass names, and accepts what the full pass accepts."""
    expected = full_pass_reason(raw)
    try:
        decode_json(raw)
    except DuplicateKeyError as error:
        assert error.reason == expected
    else:
        assert expected is None


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.sampled_from(KEYS), trees()), min_size=1, max_size=6),
    style=st.sampled_from(STYLES),
    spaces=st.lists(st.integers(1, 60), max_size=3),
)
def test_the_key_named_is_the_one_a_full_pass_names(
    pairs: list[tuple[str, Any]], style: str, spaces: list[int]
) -> None:
    check(write(Pairs(tuple(pairs)), style, spaces).encode())


def steps_with(inner: bytes, where: int, count: int = 2_000) -> bytes:
    """Compact JSON of ``count`` thin steps, ``inner`` (pairs) added to step ``where``."""
    steps = [{"step_id": index, "type": "thought"} for index in range(count)]
    raw = orjson.dumps({"id": "t", "steps": steps, "outcome": {"confidence": 0.5}})
    marker = b'{"step_id":%d,' % where
    cut = raw.index(marker) + len(marker)
    return raw[:cut] + inner + b"," + raw[cut:]


@pytest.mark.parametrize("where", [0, 1, 999, 1_998, 1_999])
@pytest.mark.parametrize(
    "inner",
    [
        b'"x":{"k":1,"k":2}',
        b'"x":{"k":{"c":{"d":1,"d":2}},"k":{"c":{"d":3}}}',
        b'"x":{"k":{"ab":1,"ab":2},"g":{"e":1,"e":2},"k":{"a b":1,"ab":1}}',
        b'"x":[{"k":1},{"k":1,"j":[],"k":[]}]',
        b'"type":"thought","x":1',
        b'"x":{"a:b":{"a,b":1,"a,b":2},"k":{"a:b":1,"a,b":2}}',
    ],
)
def test_repeated_keys_among_many_steps(inner: bytes, where: int) -> None:
    raw = steps_with(inner, where)
    check(raw)
    check(raw.replace(b",", b", "))
    check(b" \n" + raw)
    check(raw[:-1] + b',"outcome":{"confidence":0.5}}')


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"k":{"x":1},"a":1,"k":{"x":2}}',
        b'{"s":[0,{"a":1,"k":{"x":1},"a":1,"k":{"x":2}}],"t":1}',
        b'{"a":1,"b":[0,{"x":1}],"a":1,"b":[0,{"x":2}]}',
        b'{"a":{"b":1,"c":{"d":[1]},"b":2,"c":{"d":[2]}}}',
        b'{"k":{"x":1},"k":{"x":2}}',
        b' {"k":{"x":{"y":1}},"z":{"y":1,"y":1},"k":2}',
    ],
)
def test_keys_an_object_had_before_the_text_differs_are_counted(raw: bytes) -> None:
    """The stand-in for an object open where the input first differs repeats its earlier keys."""
    assert full_pass_reason(raw) is not None
    check(raw)


def test_compact_input_is_parsed_again_only_around_the_repeated_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = steps_with(b'"x":{"a":{"k":1,"k":2}}', 19_990, count=20_000)
    parsed: list[int] = []
    loads = json.loads

    def counting(text: bytes, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(trace_module.json, "loads", counting)
    with pytest.raises(DuplicateKeyError, match="'k' appears twice"):
        decode_json(raw)
    assert parsed == [parsed[0]]  # one pass, over the last ten steps (the text from them on)
    assert parsed[0] < len(raw) // 100


@pytest.mark.parametrize("where", [0, 1, 50, 98, 99])
def test_repeated_keys_in_an_object_of_many_pairs(where: int) -> None:
    """Objects with many pairs are measured in runs of pairs, as arrays are in runs of items."""
    pairs = [b'"p%d":{"v":[%d]}' % (index, index) for index in range(100)]
    inner = pairs[where][:-1] + b',"v":0}'  # "pN":{"v":[N],"v":0}
    for chosen in (inner, pairs[where] + b',"p%d":1' % where):
        raw = b'{"o":{' + b",".join([*pairs[:where], chosen, *pairs[where + 1 :]]) + b'},"z":1}'
        assert full_pass_reason(raw) is not None
        check(raw)


def test_measuring_a_deep_chain_of_large_containers_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each level is nearly the whole document: measuring every level would write it 120 times."""
    bottom = b'{"k":1,"pad":["' + b'x","' * 50_000 + b'x"],"k":2}'
    raw = bottom
    for _ in range(120):
        raw = b'{"a":' + raw + b',"b":"xyz"}'
    written: list[int] = []
    measure = trace_module._Rewrites.run_length

    def counting(self: Any, *args: Any) -> int:
        length: int = measure(self, *args)
        written.append(length)
        return length

    monkeypatch.setattr(trace_module._Rewrites, "run_length", counting)
    with pytest.raises(DuplicateKeyError, match="'k' appears twice"):
        decode_json(raw)
    assert 0 < sum(written) <= 3 * len(raw)


def dumps_spaced(raw: bytes, blank: str = " ") -> bytes:
    """``raw`` written as json.dumps writes, ``blank`` after each separator, repeated keys kept."""

    def go(value: Any) -> str:
        if isinstance(value, Pairs):
            pairs = (json.dumps(key) + ":" + blank + go(item) for key, item in value.pairs)
            return "{" + ("," + blank).join(pairs) + "}"
        if isinstance(value, list):
            return "[" + ("," + blank).join(go(item) for item in value) + "]"
        return json.dumps(value)

    return go(json.loads(raw, object_pairs_hook=lambda pairs: Pairs(tuple(pairs)))).encode()


@pytest.mark.parametrize(
    "compact",
    [
        b'{"k":{"a b":1,"c":[1,1],"ab":2},"k":{"ab":1,"c":[1,2],"x":1}}',
        b'{"k":{"ab":1,"ab":1},"y":[1,1],"k":{"a b":1,"ab":1},"y":[1,2]}',
        b'{"k":{"a b":[1,1],"a b":2},"k":{"ab":[1,2]}}',
        b'{"p":[{"k":1,"k":1},{"z":1}],"p":[{"k":1,"k ":1},{"z":2}]}',
    ],
)
def test_keys_alike_but_for_a_space_are_not_taken_for_one_another(compact: bytes) -> None:
    """With blanks dropped, "a b" and "ab" would read alike: such input is compared byte for byte.

    Each of these, compared blind to blanks, would name another key than the full pass does.
    """
    for raw in (dumps_spaced(compact), dumps_spaced(compact, "\n ")):
        assert full_pass_reason(raw) is not None
        body = raw.lstrip(_BLANKS)
        assert not _no_key_holds_a_space(body, body.translate(None, _BLANKS))
        check(raw)


def test_a_space_written_as_an_escape_in_a_key_counts_as_a_space() -> None:
    """A key written "a\\u0020b" is "a b": with blanks dropped it would read as "ab" does."""
    raw = b'{"k": {"ab": [1, 1], "ab": 2}, "k": {"a\\u0020b": [1, 2]}}'
    assert full_pass_reason(raw) is not None
    assert not _no_key_holds_a_space(raw, raw.translate(None, _BLANKS))
    check(raw)


@pytest.mark.parametrize(
    "compact",
    [
        b'{"a":{"b":1,"c":{"d":[1]},"b":2,"c":{"d":[2]}},"e":{"f":1,"f":2}}',
        b'{"s":[{"x":{"y":1,"y":1}},{"x":{"z":1}}],"s":[{"x":{"z":1,"z":1}}]}',
        b'{"k":{"v":"a b","w":{"q":1,"q":2}},"k":{"v":"ab","w":{"q":3}}}',
        b'{"t":"a b","u":[{"m":{"n":1}},{"m":{"n":1,"n":2}}],"t":"ab"}',
        b'{"o":[0,{"p":{"r":1}},{"p":{"r":1,"s":1,"r":2}}],"o":[0,{"p":{"r":1}}]}',
    ],
)
def test_nested_repeats_in_json_dumps_spacing(compact: bytes) -> None:
    """Repeats nested before and after each other, values alike but for spaces, blanks dropped."""
    raw = dumps_spaced(compact)
    assert full_pass_reason(raw) is not None
    body = raw.lstrip(_BLANKS)
    assert _no_key_holds_a_space(body, body.translate(None, _BLANKS))
    check(raw)
    check(dumps_spaced(compact, "\n\t"))
    check(b"\r\n" + raw + b" ")


@pytest.mark.parametrize("blank", [" ", "\n    "])
def test_json_dumps_spacing_is_parsed_again_only_around_the_repeated_key(
    monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    compact = steps_with(b'"x":{"a":{"k":1,"k":2}}', 14_990, count=15_000)
    raw = compact.replace(b",", b"," + blank.encode()).replace(b":", b":" + blank.encode())
    raw = raw.replace(b'"type":', b'"text": "a b: c, d", "type":', 1)  # spaces in one value
    parsed: list[int] = []
    loads = json.loads

    def counting(text: bytes, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(trace_module.json, "loads", counting)
    with pytest.raises(DuplicateKeyError, match="'k' appears twice"):
        decode_json(raw)
    assert parsed == [parsed[0]]
    assert parsed[0] < len(raw) // 100


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from(list(b" \t\n\rab")), max_size=40).map(bytes),
    blanks=st.sampled_from([_BLANKS, b" "]),
    data=st.data(),
)
def test_offset_of_kept_is_the_offset_of_that_byte(
    text: bytes, blanks: bytes, data: st.DataObject
) -> None:
    kept = [offset for offset, byte in enumerate(text) if byte not in blanks]
    if kept:
        number = data.draw(st.integers(0, len(kept) - 1))
        assert _offset_of_kept(text, number, blanks) == kept[number]


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.sampled_from(KEYS), trees()), min_size=1, max_size=6),
    style=st.sampled_from(STYLES),
    spaces=st.lists(st.integers(1, 60), max_size=3),
)
def test_a_key_with_a_space_is_never_missed(
    pairs: list[tuple[str, Any]], style: str, spaces: list[int]
) -> None:
    raw = write(Pairs(tuple(pairs)), style, spaces).encode()
    keys: list[str] = []
    json.loads(raw, object_pairs_hook=lambda found: keys.extend(key for key, _ in found))
    if any(" " in key for key in keys):
        assert not _no_key_holds_a_space(raw, raw.translate(None, _BLANKS))
