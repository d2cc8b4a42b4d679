"""The duplicate key named is the one a json pass over the whole input names, however written.

``decode_json`` parses again only around the first place where the input differs from orjson's
own text of it; this checks that against the plain exact pass (json with a pairs hook), on
documents with repeated keys anywhere, written compactly, as Python's json writes them, with
odd whitespace, or with keys that hold quotes, colons, brackets and escapes.
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
from worker.core.trace import _reject_duplicate_keys, decode_json

KEYS = ["a", "b", "k", "a b", "a:b", "a,b", 'q"', "\\", "{", "é", "\u2028", "\x01", "😀", ""]


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

    def sep(text: str) -> str:
        counter[0] += 1
        return text + (" " if style == "spaced" and counter[0] in spaces else "")

    def string(value: str) -> str:
        if style == "python":
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
        if style == "python":
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
    style=st.sampled_from(["compact", "python", "spaced"]),
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
