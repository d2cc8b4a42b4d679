"""The duplicate key named is the one a json pass over the whole input names, however written.

``decode_json`` parses again only the stretches where the input differs from orjson's own text
of it (blanks between tokens aside); this checks that against the plain exact pass
(json with a pairs hook), on documents with repeated keys anywhere (the root's first or last
member, with the value given before or another, in several objects), written compactly, with
Python's json.dumps escapes or spacing, on lines, with odd whitespace, or with keys that hold
quotes, colons, brackets, escapes and spaces (some alike but for a space); and with the narrowed
pass tuned so that small documents reach every way it has of reading apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core import trace as trace_module
from worker.core.errors import DuplicateKeyError
from worker.core.trace import (
    _common_prefix,
    _common_suffix,
    _escaped_bytes,
    _locate,
    _reject_duplicate_keys,
    _respelled,
    _Rewrites,
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
    """JSON text of ``node`` in ``style``; in "spaced", a space after the listed separators.

    "utf8" is compact json.dumps with ``ensure_ascii=False``, for the escapes written out.
    """
    counter = [0]
    blank = {"dumps": " ", "lines": "\n  "}.get(style, "")

    def sep(text: str) -> str:
        counter[0] += 1
        return text + (" " if style == "spaced" and counter[0] in spaces else blank)

    def string(value: str) -> str:
        if style in ("python", "dumps", "utf8"):
            return json.dumps(value, ensure_ascii=style != "utf8")
        return orjson.dumps(value).decode()

    def go(value: Any) -> str:
        if isinstance(value, Pairs):
            body = sep(",").join(string(key) + sep(":") + go(item) for key, item in value.pairs)
            return "{" + body + "}"
        if isinstance(value, list):
            return "[" + sep(",").join(go(item) for item in value) + "]"
        if isinstance(value, str):
            return string(value)
        if style in ("python", "dumps", "utf8"):
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


class Members(list[list[Any]]):
    """An object being built: its [key, value] pairs in order (a plain list is an array)."""


def thaw(node: Any) -> Any:
    if isinstance(node, Pairs):
        return Members([key, thaw(value)] for key, value in node.pairs)
    if isinstance(node, list):
        return [thaw(item) for item in node]
    return node


def freeze(node: Any) -> Any:
    if isinstance(node, Members):
        return Pairs(tuple((key, freeze(value)) for key, value in node))
    if isinstance(node, list):
        return [freeze(item) for item in node]
    return node


def objects_in(node: Any) -> Iterator[Members]:
    """Every object of ``node``, ``node`` first."""
    if isinstance(node, Members):
        yield node
    for child in node if isinstance(node, list) else ():
        yield from objects_in(child[1] if isinstance(node, Members) else child)


@st.composite
def repeated(draw: st.DrawFn) -> Pairs:
    """A root object with a key given again in some of its objects, the root most often.

    The key is given again as the object's first member, its last, or anywhere, with the value
    it had or another; a few times, so that several objects may hold a repeat.
    """
    pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), trees()), min_size=1, max_size=6))
    root = thaw(Pairs(tuple(pairs)))
    for _ in range(draw(st.integers(1, 3))):
        objects = [found for found in objects_in(root) if found]  # the root among them
        target = (
            objects[0] if draw(st.booleans()) else objects[draw(st.integers(0, len(objects) - 1))]
        )
        key, value = target[draw(st.integers(0, len(target) - 1))]
        if draw(st.booleans()):
            value = thaw(draw(trees()))
        place = draw(st.sampled_from(["first", "last", "anywhere"]))
        if place == "first":
            target.insert(0, [key, value])
        elif place == "last":
            target.append([key, value])
        else:
            target.insert(draw(st.integers(0, len(target))), [key, value])
    frozen = freeze(root)
    assert isinstance(frozen, Pairs)
    return frozen


# The narrowed pass's settings, tuned so that small documents reach what large ones do: the
# text after a member looked for from one byte on (found in the wrong places too), few
# stretches read apart before the rest is read at once, objects measured pair by pair or in
# runs, walks cut short, pieces as large as the stand-ins make them.
TUNINGS = st.fixed_dictionaries(
    {
        "_NEEDLE": st.sampled_from([1, 3, 8, 64]),
        "_MAX_PIECES": st.sampled_from([1, 2, 8]),
        "_FEW_PAIRS": st.sampled_from([0, 2, 32]),
        "_ALLOWANCE": st.sampled_from([0.2, 2]),
        "_PIECES_SHARE": st.sampled_from([0.1, 4]),
    }
)


@contextmanager
def tuned(tuning: dict[str, Any]) -> Iterator[None]:
    saved = {name: getattr(trace_module, name) for name in tuning}
    for name, value in tuning.items():
        setattr(trace_module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(trace_module, name, value)


@settings(max_examples=400, deadline=None)
@given(
    document=repeated(),
    style=st.sampled_from(STYLES),
    spaces=st.lists(st.integers(1, 60), max_size=3),
    tuning=TUNINGS,
)
def test_repeats_anywhere_name_the_key_a_full_pass_names(
    document: Pairs, style: str, spaces: list[int], tuning: dict[str, Any]
) -> None:
    raw = write(document, style, spaces).encode()
    assert full_pass_reason(raw) is not None
    with tuned(tuning):
        check(raw)


@settings(max_examples=200, deadline=None)
@given(document=trees(), few=st.sampled_from([0, 2, 32]))
def test_the_walk_finds_the_member_at_each_offset(document: Any, few: int) -> None:
    """Each container open at an offset, and the member holding it: its text, comma excluded."""
    document = json.loads(write(Pairs((("r", document),)), "compact", []))
    text = orjson.dumps(document)
    as_compared = orjson.dumps

    with tuned({"_FEW_PAIRS": few}):
        for at in range(1, len(text) - 1):
            levels = _locate(document, len(text), at, _Rewrites(left=10**9))
            assert levels
            end = len(text)
            for level in levels:
                if level.index < 0:
                    assert level is levels[-1] and not level.node and at == end - 1
                    continue
                if isinstance(level.node, dict):
                    key, value = list(level.node.items())[level.index]
                    member = as_compared(key) + b":" + as_compared(value)
                else:
                    member = as_compared(level.node[level.index])
                assert text[level.start : level.end] == member
                assert level.start <= at <= level.end and text[level.end] in b",]}"
                end = level.end


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


LONG = b"[" + b",".join(b"%d" % number for number in range(40)) + b"]"


@pytest.mark.parametrize("needle", [1, 8, 64])
@pytest.mark.parametrize(
    "raw",
    [
        b'{"o":{"m":"\\u00e9","k":1,"k":2,"q":L},"z":1,"z":2}',
        b'{"o":[{"x":L},{"m":1.0E2,"k":1,"k":2,"q":L}],"z":[1,{"y":1,"y":2}]}',
        b'{"m":"\\u00e9","k":L,"k":{"a":1},"q":L,"z":{"y":1,"y":2}}',
        b'{"k":{"a":1,"b":L},"c":L,"k":{"a":1,"b":L,"a":2},"c":L}',
        b'{"k":{"a":1,"b":L},"c":{"d":L,"d":L},"k":{"a":1,"b":L},"c":{"d":L,"d":2}}',
    ],
)
def test_keys_on_both_sides_of_a_stretch_read_apart_are_counted(raw: bytes, needle: int) -> None:
    """A repeat whose first key is read apart and whose second lies in text read alike after.

    The member written another way (an escape, a number) is read apart up to where the text
    after it in orjson's is found again: after the key's first value, not before it.
    """
    raw = raw.replace(b"L", LONG)
    assert full_pass_reason(raw) is not None
    with tuned({"_NEEDLE": needle}):
        check(raw)
        check(dumps_spaced(raw))


def lengths_parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text the exact pass parses from now on."""
    parsed: list[int] = []
    loads = json.loads

    def counting(text: bytes, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(trace_module.json, "loads", counting)
    return parsed


def test_compact_input_is_parsed_again_only_around_the_repeated_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = steps_with(b'"x":{"a":{"k":1,"k":2}}', 19_990, count=20_000)
    parsed = lengths_parsed(monkeypatch)
    with pytest.raises(DuplicateKeyError, match="'k' appears twice"):
        decode_json(raw)
    assert parsed == [parsed[0]]  # one pass, over the last ten steps (the text from them on)
    assert parsed[0] < len(raw) // 100


def parsed_again(monkeypatch: pytest.MonkeyPatch, raw: bytes) -> tuple[str, list[int]]:
    """The reason decode_json gives for ``raw``, and the length of each text json parsed."""
    parsed = lengths_parsed(monkeypatch)
    with pytest.raises(DuplicateKeyError) as error:
        decode_json(raw)
    monkeypatch.undo()
    return error.value.reason, parsed


STEPS = orjson.dumps(
    {
        "id": "t",
        "steps": [{"step_id": index, "type": "thought"} for index in range(20_000)],
        "outcome": {"confidence": 0.5},
    }
)


@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize(
    ("first", "last"),
    [
        (b'"id":"u"', b""),  # the root's first member, another value
        (b"", b'"id":"u"'),  # its last
        (b'"id":"t"', b""),  # the same value
        (b"", b'"id":"t"'),
        (b'"id":{"a":1,"a":2}', b""),  # the object given first closes first
        (b"", b'"outcome":{"c":1,"c":2}'),  # so does the one given last
        (b'"x":12', b'"x":1'),  # a number the canonical text writes shorter
        (b'"k":[1,2]', b'"k":[]'),  # an array given empty last
        (b'"x":1', b'"x":2,"y":3'),  # the repeat not the last member
    ],
)
def test_a_repeated_root_key_is_parsed_again_only_around_it(
    monkeypatch: pytest.MonkeyPatch, first: bytes, last: bytes, spaced: bool
) -> None:
    """The steps between the two members are the same text in the input and orjson's."""
    raw = b"{" + first + b"," + STEPS[1:] if first else STEPS
    raw = raw[:-1] + b"," + last + b"}" if last else raw
    raw = dumps_spaced(raw) if spaced else raw
    expected = full_pass_reason(raw)
    assert expected is not None
    reason, parsed = parsed_again(monkeypatch, raw)
    assert reason == expected
    assert sum(parsed) < len(raw) // 100


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
    """Only blanks between tokens are dropped: "a b" and "ab" stay two keys.

    Each of these, with every blank dropped, would name another key than the full pass does.
    """
    for raw in (dumps_spaced(compact), dumps_spaced(compact, "\n ")):
        assert full_pass_reason(raw) is not None
        check(raw)


def test_a_space_written_as_an_escape_in_a_key_counts_as_a_space() -> None:
    """A key written "a\\u0020b" is "a b", not "ab"."""
    raw = b'{"k": {"ab": [1, 1], "ab": 2}, "k": {"a\\u0020b": [1, 2]}}'
    assert full_pass_reason(raw) is not None
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
    parsed = lengths_parsed(monkeypatch)
    with pytest.raises(DuplicateKeyError, match="'k' appears twice"):
        decode_json(raw)
    assert parsed == [parsed[0]]
    assert parsed[0] < len(raw) // 100


@settings(max_examples=300, deadline=None)
@given(
    first=st.binary(max_size=300),
    second=st.binary(max_size=300),
    shared=st.binary(max_size=400),
    data=st.data(),
)
def test_common_prefix_and_suffix_are_the_longest(
    first: bytes, second: bytes, shared: bytes, data: st.DataObject
) -> None:
    for one, two in ((shared + first, shared + second), (first + shared, second + shared)):
        start = data.draw(st.integers(0, len(one)))
        other = data.draw(st.integers(0, len(two)))
        prefix = _common_prefix(one, two, start, other)
        suffix = _common_suffix(one, two, start, other)
        rest = one[start:], two[other:]
        assert rest[0][:prefix] == rest[1][:prefix]
        assert prefix == min(map(len, rest)) or rest[0][prefix] != rest[1][prefix]
        assert rest[0][len(rest[0]) - suffix :] == rest[1][len(rest[1]) - suffix :]
        assert suffix == min(map(len, rest)) or rest[0][-suffix - 1] != rest[1][-suffix - 1]


def python_respelled(document: Any) -> bytes:
    """json.dumps' default text of ``document`` as _respelled spells it: compact, in UTF-8 but
    for the escapes of control characters, the quote and the backslash."""
    return write(document, "utf8", []).encode()


@settings(max_examples=300, deadline=None)
@given(document=trees(), spaces=st.lists(st.integers(1, 60), max_size=3))
def test_dropping_blanks_between_tokens_gives_the_compact_text(
    document: Any, spaces: list[int]
) -> None:
    """Keys and strings keep their spaces, quotes and backslashes; only blanks between go."""
    compact = write(document, "compact", []).encode()
    for style in ("lines", "spaced"):
        assert _respelled(write(document, style, spaces).encode()) == compact
    assert _respelled(write(document, "dumps", []).encode()) == python_respelled(document)


@pytest.mark.parametrize("blank", [" ", "\n    "])
def test_spacing_with_a_key_that_holds_a_space_is_parsed_again_only_around_the_repeat(
    monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """Blanks go between tokens only: keys keep their spaces, and the pass stays narrow."""
    compact = steps_with(b'"x":{"a":{"k":1,"k":2}}', 9_990, count=10_000)
    compact = compact.replace(b'"type":', b'"a b":"c d","type":')  # a key with a space
    raw = compact.replace(b",", b"," + blank.encode()).replace(b":", b":" + blank.encode())
    expected = full_pass_reason(raw)
    assert expected is not None
    reason, parsed = parsed_again(monkeypatch, raw)
    assert reason == expected
    assert sum(parsed) < len(raw) // 100


@settings(max_examples=300, deadline=None)
@given(document=trees())
def test_escapes_are_written_out_as_text_with_them_unescaped(document: Any) -> None:
    """json.dumps' default text reads as its ensure_ascii=False text: escapes of control
    characters stay escapes there too (written out, they would break their string)."""
    assert _respelled(write(document, "python", []).encode()) == python_respelled(document)


def test_escapes_of_controls_the_quote_and_the_backslash_stay_among_those_written_out() -> None:
    raw = b'{"k":"\\u0022 \\u00e9 \\\\u0041 \\u005c\\u00e9 \\u0001 \\u0041\\u007f"}'
    assert _respelled(raw) == '{"k":"\\u0022 é \\\\u0041 \\u005cé \\u0001 A\x7f"}'.encode()
    check(raw.replace(b'"}', b'","k":1}'))


def escaped_read_in_order(text: bytes) -> list[int]:
    """Bytes other than backslashes that a backslash escapes, read as JSON reads them."""
    found, at = [], 0
    while at < len(text) - 1:
        if text[at] == ord("\\"):
            if text[at + 1] != ord("\\"):
                found.append(at + 1)
            at += 2
        else:
            at += 1
    return found


@settings(max_examples=500, deadline=None)
@given(text=st.lists(st.sampled_from([b"\\", b"\\" * 7, b"u", b'"', b" ", b"a"])).map(b"".join))
def test_escaped_bytes_are_found_from_the_runs_of_backslashes(text: bytes) -> None:
    escaped = _escaped_bytes(np.frombuffer(text, dtype=np.uint8))
    assert np.flatnonzero(escaped).tolist() == escaped_read_in_order(text)


def test_an_escaped_backslash_before_u_is_not_an_escape() -> None:
    raw = b'{"k":"\\\\u00e9 \\u00e9 \\\\\\u00e9"}'  # \\u00e9, \u00e9, \\\u00e9
    assert _respelled(raw) == '{"k":"\\\\u00e9 é \\\\é"}'.encode()


def test_surrogate_escapes_are_written_out_in_pairs_and_a_lone_one_left_alone() -> None:
    assert _respelled(b'{"k":"\\ud83d\\ude00 \\u00e9"}') == '{"k":"😀 é"}'.encode()
    lone = b'{"k":"\\ud83d \\u00e9"}'  # JSON allows it; UTF-8 cannot write it
    assert _respelled(lone) == lone


@pytest.mark.parametrize(
    "content",
    [
        "café ✓ 😀",
        'é"\\\u2028\u0001✓ \x7f 🚀',  # with escapes that stay escapes: controls, quote, backslash
    ],
)
def test_json_dumps_defaults_with_non_ascii_are_parsed_again_only_around_the_repeat(
    monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    """Escaped accents and emoji in every step, spaced, a root key given twice."""
    steps = [{"step_id": i, "type": "thought", "content": content} for i in range(8_000)]
    text = json.dumps({"id": "t", "steps": steps, "id ": 1})
    raw = (text[:-1] + ', "id": "u"}').encode()
    assert raw.isascii() and b"\\ud83d" in raw
    expected = full_pass_reason(raw)
    assert expected is not None
    reason, parsed = parsed_again(monkeypatch, raw)
    assert reason == expected
    assert sum(parsed) < len(raw) // 100


@pytest.mark.parametrize(
    "raw",
    [
        '{"é":1,"x":"\\u00e9","é":2}'.encode(),
        '{"a":{"é":1,"é":2},"x":"\\u00e9 😀"}'.encode(),
        '{"x": "\\u00e9", "a": {"ü": [1], "b": 2, "ü": 3}}'.encode(),
    ],
)
def test_utf8_mixed_with_escapes_names_the_key_a_full_pass_names(raw: bytes) -> None:
    """Text already in UTF-8 is not read as escapes written out (it is not ASCII)."""
    assert b"\\u00e9" in _respelled(raw)
    check(raw)
