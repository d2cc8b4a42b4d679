"""The trace schema, checked in time bounded by the document's size.

The rules live only in ``schemas/reasoning-trace.schema.json``. ``jsonschema-rs`` checks a
document in one pass (the steps a run at a time, so that a failure says which came before it
valid). Only an invalid document is searched for the error to report, with depth-limited
copies of the same schema: a few passes over the steps from the first invalid run on, never
one Python object per error (a huge array of bad items has one per item).

The error reported is the one ``jsonschema``'s ``best_match`` picks: the shallowest, then the
one with the greatest path, then one whose value has the wrong type for its subschema.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson

from worker.core.errors import SchemaViolationError, snippet

SCHEMA_DIR = Path(__file__).parent.parent / "schemas"
TRACE_SCHEMA_PATH = SCHEMA_DIR / "reasoning-trace.schema.json"
# Documents nest no deeper than decoding allows (worker.core.trace.MAX_DEPTH), so no error
# sits deeper either.
MAX_ERROR_DEPTH = 130

# Keywords the error search and ``_describe`` understand. A schema with any other keyword is
# refused when the validator is built (every test fails), rather than checked by rules that
# nothing here can explain to a producer.
_ASSERTIONS = frozenset(
    {
        "type",
        "enum",
        "const",
        "required",
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "minItems",
    }
)
_APPLICATORS = frozenset({"properties", "items", "$ref"})
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "$defs",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)

_Node = tuple[str, ...]  # where a subschema sits in the schema document
_View = tuple[_Node, ...]  # the subschemas that apply at one place in the instance
_Path = list[str | int]
_ROOT: _View = ((),)


class SchemaNotSupportedError(Exception):
    """The trace schema uses a keyword the error search cannot explain."""


@cache
def _schema() -> dict[str, Any]:
    schema = orjson.loads(TRACE_SCHEMA_PATH.read_bytes())
    jsonschema_rs.meta.validate(schema)
    _check_supported(schema)
    return schema  # type: ignore[no-any-return]


def _resolve(schema: Any, node: _Node) -> Any:
    for token in node:
        schema = schema[token]
    return schema


def _at(node: _Node) -> dict[str, Any]:
    return _resolve(_schema(), node)  # type: ignore[no-any-return]


def _ref_node(ref: Any) -> _Node:
    if ref == "#":
        return ()
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise SchemaNotSupportedError(f"$ref {ref!r}: only references inside the schema")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in ref[2:].split("/"))


def _check_supported(root: dict[str, Any]) -> None:
    """Every subschema is an object with known keywords, and no $ref chain comes back to itself."""
    pending: list[_Node] = [()]
    seen: set[_Node] = set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        schema = _resolve(root, node)
        where = "/".join(node) or "(root)"
        if not isinstance(schema, dict):
            raise SchemaNotSupportedError(f"{where}: a subschema that is not an object")
        unknown = schema.keys() - _ASSERTIONS - _APPLICATORS - _ANNOTATIONS
        if unknown:
            raise SchemaNotSupportedError(f"{where}: keywords {sorted(unknown)}")
        pending += [(*node, "properties", name) for name in schema.get("properties", {})]
        pending += [(*node, "$defs", name) for name in schema.get("$defs", {})]
        if "items" in schema:
            pending.append((*node, "items"))
        chain = [node]
        while isinstance(current := _resolve(root, chain[-1]), dict) and "$ref" in current:
            target = _ref_node(current["$ref"])
            if target in chain:
                raise SchemaNotSupportedError(f"{where}: $ref chain loops back to itself")
            chain.append(target)
        pending += chain[1:]


def _with_refs(node: _Node) -> list[_Node]:
    """``node`` and the nodes its $ref chain brings in: all apply at the same place."""
    nodes = [node]
    while "$ref" in _at(nodes[-1]):
        nodes.append(_ref_node(_at(nodes[-1])["$ref"]))
    return nodes


@cache
def _local_keywords(view: _View) -> list[tuple[str, Any, _Node]]:
    """(keyword, value, owning subschema) checked at this place, in the order jsonschema visits."""

    def of(node: _Node) -> list[tuple[str, Any, _Node]]:
        out: list[tuple[str, Any, _Node]] = []
        for keyword, value in _at(node).items():
            if keyword in _ASSERTIONS:
                out.append((keyword, value, node))
            elif keyword == "$ref":
                out.extend(of(_ref_node(value)))
        return out

    return [entry for node in view for entry in of(node)]


@cache
def _property_names(view: _View) -> frozenset[str]:
    return frozenset(
        name for node in view for n in _with_refs(node) for name in _at(n).get("properties", {})
    )


@cache
def _property_view(view: _View, name: str) -> _View:
    return tuple(
        (*n, "properties", name)
        for node in view
        for n in _with_refs(node)
        if name in _at(n).get("properties", {})
    )


@cache
def _items_view(view: _View) -> _View:
    return tuple((*n, "items") for node in view for n in _with_refs(node) if "items" in _at(n))


def _truncated(node: _Node, levels: int) -> dict[str, Any]:
    """The subschema at ``node`` checking only ``levels`` levels below the place it applies to."""
    schema = _at(node)
    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _ASSERTIONS}
    if levels > 0:
        if "properties" in schema:
            out["properties"] = {
                name: _truncated((*node, "properties", name), levels - 1)
                for name in schema["properties"]
            }
        if "items" in schema:
            out["items"] = _truncated((*node, "items"), levels - 1)
    if "$ref" in schema:
        out = {"allOf": [out, _truncated(_ref_node(schema["$ref"]), levels)]}
    return out


def _not_checked(value: object) -> bool:
    return True


@cache
def _formats() -> dict[str, Callable[[object], bool]]:
    """Formats the validator leaves as annotations: every one but date-time.

    date-time is the validator's own check, RFC 3339 section 5.6 exactly (``T`` and ``Z`` in
    either case, a leap second at 23:59:60 UTC, an offset up to 23:59), never a looser parser:
    Python's ``datetime.fromisoformat`` takes ``2025-01-15 12`` and refuses ``t``/``z``.
    """
    names: set[str] = set()

    def collect(schema: Any) -> None:
        if isinstance(schema, dict):
            if isinstance(schema.get("format"), str):
                names.add(schema["format"])
            for value in schema.values():
                collect(value)

    collect(_schema())
    return {name: _not_checked for name in names - {"date-time"}}


def _compile(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator(schema, formats=_formats(), validate_formats=True)


@cache
def _within(view: _View, levels: int) -> jsonschema_rs.Validator:
    """Valid iff nothing is wrong at this place or up to ``levels`` levels below it."""
    parts = [_truncated(node, levels) for node in view]
    return _compile(parts[0] if len(parts) == 1 else {"allOf": parts})


@cache
def _items_within(view: _View, levels: int) -> jsonschema_rs.Validator:
    """For a run of array items: valid iff no item has an error ``levels`` deep or less."""
    parts = [_truncated(node, levels) for node in view]
    return _compile({"items": parts[0] if len(parts) == 1 else {"allOf": parts}})


@cache
def _keyword(node: _Node, keyword: str) -> jsonschema_rs.Validator:
    return _compile({keyword: _at(node)[keyword]})


# --- finding the error to report --------------------------------------------------------------


def _json_path(path: _Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _describe(path: _Path, rule: str, expected: Any, got: Any) -> str:
    """One line a producer can act on, never quoting more than a snippet of their data."""
    where = _json_path(path)
    if rule == "enum":
        return f"{where}: {snippet(got)} is not one of {', '.join(map(str, expected))}"
    if rule == "const":
        return f"{where}: expected {expected!r}, got {snippet(got)}"
    if rule == "type":
        return f"{where}: expected {expected}, got {type(got).__name__} {snippet(got)}"
    if rule == "required":
        missing = [name for name in expected if isinstance(got, dict) and name not in got]
        return f"{where}: missing required field {', '.join(map(repr, missing))}"
    if rule in ("minimum", "maximum"):
        bound = "at least" if rule == "minimum" else "at most"
        return f"{where}: {snippet(got)} must be {bound} {expected}"
    if rule == "minLength":
        return f"{where}: must not be empty"
    if rule == "maxLength":
        return f"{where}: longer than {expected} characters"
    if rule == "minItems":
        return f"{where}: needs at least {expected} item(s)"
    if rule == "pattern":
        return f"{where}: {snippet(got)} does not match {expected}"
    return f"{where}: {snippet(got)} is not a valid {expected}"  # format


def _is_type(value: object, name: str) -> bool:
    """JSON Schema types as ``jsonschema`` reads Python values (2.0 is an integer)."""
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return name == "number" or isinstance(value, int) or value.is_integer()


def _wrong_type(owner: _Node, value: object) -> bool:
    """best_match prefers errors whose value does not have its subschema's declared type."""
    expected = _at(owner).get("type")
    if expected is None:
        return True
    names = [expected] if isinstance(expected, str) else expected
    return not any(_is_type(value, name) for name in names)


def _last_invalid_item(
    items: list[Any], check: jsonschema_rs.Validator, floor: int = 0
) -> int | None:
    """Greatest index whose item fails ``check``; items before ``floor`` are known to be valid.

    Runs that double from the end come first, so an error near the end costs a check of the
    items after it; once they would cover a quarter of the items, the rest is halved: about
    one pass in all, wherever the error is.
    """
    high, width, budget = len(items), 1, (len(items) - floor) // 4
    while width <= budget:
        low = high - width
        if not check.is_valid(items[low:high]):
            return _halved(items, check, low, high, known=True)
        high, budget, width = low, budget - width, width * 2
    return _halved(items, check, floor, high, known=False)


def _halved(
    items: list[Any], check: jsonschema_rs.Validator, low: int, high: int, *, known: bool
) -> int | None:
    """Greatest index in ``low:high`` whose item fails ``check`` (``known``: one does), halving."""
    while high - low > 1:
        middle = (low + high) // 2
        if check.is_valid(items[middle:high]):
            high = middle
        else:
            low, known = middle, True
    if high - low == 1 and (known or not check.is_valid(items[low:high])):
        return low
    return None


class _SearchFailedError(Exception):
    """The depth-limited checks disagree with the full one (never expected)."""


def _local_reason(instance: Any, view: _View, path: _Path) -> str | None:
    """The error reported for this very place, if a keyword fails here."""
    failing = [
        (keyword, value, owner)
        for keyword, value, owner in _local_keywords(view)
        if not _keyword(owner, keyword).is_valid(instance)
    ]
    if not failing:
        return None
    keyword, value, _ = max(failing, key=lambda entry: _wrong_type(entry[2], instance))
    return _describe(path, keyword, value, instance)


def _reason_below(
    instance: Any,
    view: _View,
    levels: int,
    path: _Path,
    floor: int = 0,
    floors: Mapping[str, int] | None = None,
) -> str | None:
    """The reported error exactly ``levels`` below this place, knowing none is shallower.

    Children are tried from the greatest key down, as best_match prefers the greatest path.
    An array is never checked item by item: ``_last_invalid_item`` searches it in runs, from
    ``floor`` on (``floors`` for an object's arrays) when the items before are known valid.
    """
    if levels == 0:
        return _local_reason(instance, view, path)
    if isinstance(instance, dict):
        for name in sorted(_property_names(view) & instance.keys(), reverse=True):
            child, child_view = instance[name], _property_view(view, name)
            # An array child cannot fail here (that would be shallower): its items are searched.
            if isinstance(child, list) or not _within(child_view, levels - 1).is_valid(child):
                below = floors.get(name, 0) if floors else 0
                reason = _reason_below(child, child_view, levels - 1, [*path, name], below)
                if reason is not None:
                    return reason
    elif isinstance(instance, list) and (items := _items_view(view)):
        index = _last_invalid_item(instance, _items_within(items, levels - 1), floor)
        if index is not None:
            return _reason_below(instance[index], items, levels - 1, [*path, index])
    return None


def _reason(document: dict[str, Any], floors: Mapping[str, int]) -> str:
    """The error best_match would report, found with depth-limited checks of the schema.

    best_match ranks errors by (shallowest path, greatest path, wrong type for its subschema)
    and takes the first of the best. So: try each depth from the root down, and at the first
    depth that has an error, walk to it through the greatest keys that hold one. ``floors``:
    how many leading items of root arrays are known to be valid.
    """
    for depth in range(MAX_ERROR_DEPTH):
        reason = _reason_below(document, _ROOT, depth, [], floors=floors)
        if reason is not None:
            return reason
    raise _SearchFailedError


# --- the check every trace pays for -----------------------------------------------------------

_RUN = 1024  # items of a root array checked per call


@cache
def _root_arrays() -> dict[str, jsonschema_rs.Validator]:
    """Root properties holding arrays whose items are checked a run at a time (a trace's steps).

    Only arrays whose ``items`` sit in the property's own subschema (not behind a $ref, which
    other places may share), each with a check of its items.
    """
    arrays: dict[str, jsonschema_rs.Validator] = {}
    for name in sorted(_property_names(_ROOT)):
        view = _property_view(_ROOT, name)
        if all("items" in _at(node) and "$ref" not in _at(node) for node in view):
            arrays[name] = _items_within(_items_view(view), MAX_ERROR_DEPTH)
    return arrays


@cache
def _root_check() -> jsonschema_rs.Validator:
    """The whole schema but the items of ``_root_arrays``."""
    schema = copy.deepcopy(_schema())
    for name in _root_arrays():
        for node in _property_view(_ROOT, name):
            del _resolve(schema, node)["items"]
    return _compile(schema)


def _check(document: dict[str, Any]) -> tuple[bool, dict[str, int]]:
    """Whether ``document`` is valid; if not, how many leading items of root arrays are valid.

    The same checks as one call of the whole schema, in pieces: a root array's items a run at
    a time, in order. A trace whose only error is in its last steps then needs its error
    search over those steps alone, not over the ten thousand valid ones before them.
    """
    if not _root_check().is_valid(document):
        return False, {}
    for name, check in _root_arrays().items():
        items = document.get(name)
        if not isinstance(items, list):
            continue
        for start in range(0, len(items), _RUN):
            if not check.is_valid(items[start : start + _RUN]):
                return False, {name: start}
    return True, {}


def check_trace_document(document: dict[str, Any]) -> None:
    """Schema-check a decoded document; raises SchemaViolationError with the reason.

    The fast path builds no error objects; only an invalid document is searched.
    """
    try:
        valid, floors = _check(document)
        if valid:
            return
        reason = _reason(document, floors)
    except _SearchFailedError:
        reason = "does not match the schema"
    except ValueError as exc:
        # Only Python objects that JSON cannot hold (a set, an int key) get here: parse_trace
        # never passes one.
        reason = f"(root): not a JSON document ({str(exc)[:120]})"
    raise SchemaViolationError(reason)
