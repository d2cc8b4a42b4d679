"""Decode, validate, embed-text and scoring time of the costliest inputs under the size limit.

    python bench/hostile_inputs.py [--repeats 7] [--max-bytes 1048576]

Targets: every input up to KP_MAX_MESSAGE_BYTES decoded and validated in <= 50 ms (off the
event loop), a typical trace (10-30 steps) in <= 0.2 ms.

Every case is built here, in memory, as close to the size limit as its shape allows:

- valid: typical traces (created_at with a lower-case t and z, or a leap second at an offset,
  too); the most steps that fit; long strings full of escapes and non-ASCII; a distinct tool
  per step; step inputs nested to the depth limit; escapes in every key and value; colons
  written as the escape \\u003a; one field padding the trace to exactly the limit; an unknown
  field holding the most small arrays or numbers that fit (the most Python objects per byte);
  integers at the ends of the 64-bit range, floats of 2**63 or more, and 20-digit float
  literals in every step (the last two look like integers beyond 64 bits once decoded);
- invalid: an error in the last of the most steps that fit, in every one of them, or at the
  root of such a trace; created_at not RFC 3339 in a typical trace and in the largest; a
  duplicate key deep in the last step, written compactly or with Python json.dumps' spaces;
  the root's "id" given twice, as its first member or its last, compact, spaced, with a key
  that holds a space, and as json.dumps writes non-ASCII, escapes and emoji by default; an
  integer beyond 64 bits in every step, in the last one, or 400 digits long; nesting one
  level over the limit and past orjson's own limit; JSON cut short by one byte; one byte over
  the limit.

Columns, in milliseconds, each the median of ``--repeats`` runs: ``orjson`` is bare
``orjson.loads`` (the floor any decode pays: it builds every Python object), ``decode`` is
``worker.core.trace.decode_json`` (orjson, depth, duplicate-key and 64-bit integer checks),
``json`` the standard decoder with strictness hooks (a key given twice, an integer beyond 64
bits, NaN and Infinity refused; 1e400, lone surrogates and depth left unchecked): the
alternative whose figures the module docstring of ``worker.core.trace`` quotes,
``validate`` is ``validate_trace`` (``jsonschema-rs``; for an invalid trace, also describing the
first error it reports),
then ``Trace.embedding_text()`` and ``score_trace`` for the traces that parse, and ``free``:
dropping the decoded document (paid once the record is done with; each timed run above drops
the previous run's result before its clock starts, so no column pays it twice). ``total`` is
decode + validate + embed-text + score + free. A thread ticking every 0.5 ms meanwhile measures the
longest time it was kept waiting: what the worker's event loop (heartbeats, other partitions)
would wait while a record is checked in the scoring thread.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import orjson

from worker.core.errors import TraceError
from worker.core.scoring import BUILTIN_PROFILES, Novelty, ProfileSet, score_trace
from worker.core.trace import DEFAULT_MAX_BYTES, MAX_DEPTH, Trace, decode_json, validate_trace

TARGET_WORST_MS = 50.0
TARGET_TYPICAL_MS = 0.2
PROFILES = ProfileSet(BUILTIN_PROFILES)
TOOLS = ["search", "grep", "shell", "browser", "calc", "sql"]
TEXT = 'Checked the "retry" path: naïve backoff → 3 × 200 ms\n\tthen ✓ 🚀 \\ done'


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes
    typical: bool = False


def base(**top: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "@context": "https://openknowledgepulse.org/schema/v1",
        "@type": "ReasoningTrace",
        "id": "kp:trace:hostile-0001",
        "metadata": {
            "created_at": "2025-01-15T12:00:00Z",
            "task_domain": "code",
            "success": True,
            "quality_score": 0.5,
            "visibility": "network",
            "privacy_level": "aggregated",
        },
        "task": {"objective": "Find why the nightly build fails"},
        "steps": [],
        "outcome": {"result_summary": "found it", "confidence": 0.8},
    }
    document.update(top)
    return document


def realistic_step(index: int) -> dict[str, Any]:
    kind = ["thought", "tool_call", "observation", "error_recovery"][index % 4]
    step: dict[str, Any] = {"step_id": index, "type": kind, "content": f"{TEXT} #{index}"}
    if kind == "tool_call":
        step["tool"] = {"name": TOOLS[index % len(TOOLS)], "mcp_server": "ci"}
        step["input"] = {"query": f"job {index}", "limit": 20, "filters": {"branch": "main"}}
        step["latency_ms"] = 12.5
    if kind == "observation":
        step["output_summary"] = "3 failures in test_stream.py"
    return step


def short_step(index: int) -> dict[str, Any]:
    """About 89 bytes: 10,000 of them make the 890 kB trace of the issue."""
    return {
        "step_id": index,
        "type": "thought",
        "content": f"Read the log of job {index:05d}, no hit",
    }


def thin_step(index: int) -> dict[str, Any]:
    return {"step_id": index, "type": "thought"}


def tool_step(index: int) -> dict[str, Any]:
    return {
        **realistic_step(1),
        "step_id": index,
        "tool": {"name": f"tool-{index}", "mcp_server": f"s{index}"},
    }


def deep_input_step(index: int) -> dict[str, Any]:
    # the document is level 1, steps 2, a step 3, its input 4: n objects reach level 3 + n
    return {
        "step_id": index,
        "type": "tool_call",
        "tool": {"name": "t"},
        "input": nested(MAX_DEPTH - 3),
    }


def escaped_step(index: int) -> dict[str, Any]:
    return {
        "step_id": index,
        "type": "observation",
        "content": 'é"\\\u2028\u0001✓',
        'x_ключ\n"': ["\\u003a", "🚀", "\t"],
    }


def long_text_step(index: int) -> dict[str, Any]:
    return {"step_id": index, "type": "thought", "content": TEXT * 4_000}


def fill(document: dict[str, Any], limit: int, make: Callable[[int], Any], field: str) -> bytes:
    """The document with as many ``make(i)`` in ``document[field]`` as fit in ``limit`` bytes."""
    document[field] = []
    size = len(orjson.dumps(document))
    items: list[Any] = []
    while True:
        item = make(len(items))
        size += len(orjson.dumps(item)) + (1 if items else 0)
        if size > limit and items:
            break
        items.append(item)
    document[field] = items
    return orjson.dumps(document)


def fill_steps(limit: int, make: Callable[[int], dict[str, Any]]) -> bytes:
    return fill(base(), limit, make, "steps")


def padded(document: dict[str, Any], limit: int) -> bytes:
    document["x_pad"] = ""
    document["x_pad"] = "p" * (limit - len(orjson.dumps(document)))
    return orjson.dumps(document)


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def escaped_colons(limit: int) -> bytes:
    """A content of colons all written as the escape \\u003a, which orjson writes back as ':'."""
    head, tail = orjson.dumps(base(steps=[{"step_id": 0, "type": "thought", "content": ""}])).split(
        b'"content":""'
    )
    count = (limit - len(head) - len(tail) - len(b'"content":""')) // 6
    return head + b'"content":"' + b"\\u003a" * count + b'"' + tail


def escape_dense_duplicate(limit: int) -> bytes:
    """One step's content as dense in escapes as json.dumps writes (an accent, a quote, a
    backslash and a letter written as \\u0041 in every 17 bytes), spaced, "id" given twice."""
    unit = '\\u00e9\\"\\\\\\u0041 '
    text = json.dumps(base(steps=[{"step_id": 0, "type": "thought", "content": "C"}]))
    head, tail = text.split('"C"')
    pair = ', "id": "kp:trace:dup"'
    count = (limit - len(head) - len(tail) - len(pair) - 2) // len(unit)
    return (head + '"' + unit * count + '"' + tail[:-1] + pair + "}").encode()


def replace_last(raw: bytes, old: bytes, new: bytes) -> bytes:
    cut = raw.rindex(old)
    return raw[:cut] + new + raw[cut + len(old) :]


def nesting_in_last_step(steps: bytes, levels: int) -> bytes:
    """``steps`` (a trace of thin steps) with the last step's input nesting to ``levels``."""
    deep = b'"input":' + b'{"a":' * (levels - 3) + b"1" + b"}" * (levels - 3) + b","
    return replace_last(steps, b'"type":"thought"}', deep + b'"type":"thought"}')


def spaced_steps(
    limit: int, document: dict[str, Any], make: Callable[[int], dict[str, Any]] = thin_step
) -> str:
    """``document`` written as Python's json.dumps writes it, with as many steps as fit."""
    size = len(json.dumps(document))
    steps: list[dict[str, Any]] = []
    while size + len(json.dumps(make(len(steps)))) + 2 <= limit:
        size += len(json.dumps(make(len(steps)))) + 2
        steps.append(make(len(steps)))
    return json.dumps({**document, "steps": steps})


def accented_step(index: int) -> dict[str, Any]:
    return {"step_id": index, "type": "thought", "content": "café, naïve ✓"}


def emoji_step(index: int) -> dict[str, Any]:
    """Escaped by json.dumps as surrogate pairs, and DEL, which orjson writes as it is."""
    return {"step_id": index, "type": "thought", "content": "😀\x7f" * 8}


def spaced_duplicate(limit: int) -> bytes:
    """A trace written as Python's json.dumps writes it, with a duplicate key in its last step.

    Thin steps, as many as fit with a space after each separator; the last step's input nests
    five objects deep, the innermost with a key twice.
    """
    deep = '"input": ' + '{"a": ' * 4 + '{"a": 1, "a": 2}' + "}" * 4 + ", "
    text = spaced_steps(limit - len(deep), base())
    cut = text.rindex('"type": "thought"}')
    return (text[:cut] + deep + text[cut:]).encode()


DUPLICATE_ID = {"id": "kp:trace:dup"}


def root_duplicate(
    limit: int,
    first: bool,
    spaced: bool = False,
    make: Callable[[int], dict[str, Any]] = thin_step,
    **extra: Any,
) -> bytes:
    """The most steps that fit, ``"id"`` given twice at the root: as its first member or last.

    Compact as orjson writes, or as Python's json.dumps writes with its defaults (spaced,
    non-ASCII as \\u escapes); ``extra`` adds root fields.
    """
    pair = json.dumps(DUPLICATE_ID, separators=(", ", ": ") if spaced else (",", ":"))[1:-1]
    separator = ", " if spaced else ","
    room = limit - len(pair) - len(separator)
    if spaced:
        text = spaced_steps(room, base(**extra), make)
    else:
        text = fill(base(**extra), room, make, "steps").decode()
    if first:
        return ("{" + pair + separator + text[1:]).encode()
    return (text[:-1] + separator + pair + "}").encode()


BIG = 123456789012345678901234567890  # beyond 64 bits: dead-lettered, never read as a float


BIG_HOLDER = "B" * (len(str(BIG)) - 2)  # as long as BIG once quoted: orjson cannot write BIG


def big_integer_step(index: int) -> dict[str, Any]:
    return {"step_id": index, "type": "thought", "x_n": BIG_HOLDER}


def u64_step(index: int) -> dict[str, Any]:
    """19- and 20-digit integers still in range: kept exactly, as orjson reads them."""
    return {"step_id": index, "type": "thought", "x_n": [2**63 - 1, 2**64 - 1, -(2**63)]}


def large_float_step(index: int) -> dict[str, Any]:
    """Floats at least 2**63, which orjson writes as 1e+19 like an integer it read as a float."""
    return {"step_id": index, "type": "thought", "x_f": 1e19}


def typical_created_at(created_at: str) -> bytes:
    document = base(steps=[realistic_step(i) for i in range(10)])
    document["metadata"]["created_at"] = created_at
    return orjson.dumps(document)


def cases(limit: int) -> list[Case]:
    most = fill_steps(limit, thin_step)
    room = fill_steps(limit - 2 * MAX_DEPTH * 6, thin_step)  # room for a deep last input
    one = [thin_step(0)]
    return [
        Case(
            "typical, 10 steps",
            orjson.dumps(base(steps=[realistic_step(i) for i in range(10)])),
            True,
        ),
        Case(
            "typical, 30 steps",
            orjson.dumps(base(steps=[realistic_step(i) for i in range(30)])),
            True,
        ),
        Case(
            "10,000 steps (the issue's)",
            orjson.dumps(base(steps=[short_step(i) for i in range(10_000)])),
        ),
        Case("most steps that fit", most),
        Case("long strings, escapes, non-ASCII", fill_steps(limit, long_text_step)),
        Case("a distinct tool per step", fill_steps(limit, tool_step)),
        Case("inputs at the depth limit", fill_steps(limit, deep_input_step)),
        Case("escapes in keys and values", fill_steps(limit, escaped_step)),
        Case("colons escaped as \\u003a", escaped_colons(limit)),
        Case("padded to the limit", padded(base(steps=[realistic_step(0)]), limit)),
        Case("extra field: [] x N", fill(base(steps=one), limit, lambda i: [], "x_lists")),
        Case("extra field: {} x N", fill(base(steps=one), limit, lambda i: {}, "x_objects")),
        Case("extra field: 0 x N", fill(base(steps=one), limit, lambda i: 0, "x_numbers")),
        Case("depth = limit, most steps", nesting_in_last_step(room, MAX_DEPTH)),
        Case("bad: depth = limit + 1", nesting_in_last_step(room, MAX_DEPTH + 1)),
        Case(
            "bad: depth 1025 (orjson's limit)",
            nesting_in_last_step(fill_steps(limit - 12_400, thin_step), 1025),
        ),
        Case("bad: last of most steps", replace_last(most, b'"thought"', b'"thougxt"')),
        Case("bad: every one of most steps", most.replace(b'"thought"', b'"thougxt"')),
        Case("bad: root field missing", most.replace(b'"@type":"ReasoningTrace",', b"")),
        Case(
            "bad: duplicate key deep in last step",
            nesting_in_last_step(room, 8).replace(b'"a":1}', b'"a":1,"a":2}'),
        ),
        Case("bad: duplicate key, json.dumps spacing", spaced_duplicate(limit)),
        Case("bad: duplicate root key, first member", root_duplicate(limit, first=True)),
        Case("bad: duplicate root key, last member", root_duplicate(limit, first=False)),
        Case(
            "bad: duplicate root key, first, spaced",
            root_duplicate(limit, first=True, spaced=True),
        ),
        Case(
            "bad: duplicate root key, last, spaced",
            root_duplicate(limit, first=False, spaced=True),
        ),
        Case(
            "bad: dup root key, spaced, 'a b' key",
            root_duplicate(limit, first=True, spaced=True, x_notes={"run by": "nightly"}),
        ),
        Case(
            "bad: dup root key, json.dumps, non-ASCII",
            root_duplicate(limit, first=True, spaced=True, make=accented_step),
        ),
        Case(
            "bad: dup root key, json.dumps, escapes",
            root_duplicate(limit, first=False, spaced=True, make=escaped_step),
        ),
        Case(
            "bad: dup root key, json.dumps, emoji",
            root_duplicate(limit, first=False, spaced=True, make=emoji_step),
        ),
        Case("bad: dup root key, json.dumps, dense escapes", escape_dense_duplicate(limit)),
        Case("in-range 64-bit integers in every step", fill_steps(limit, u64_step)),
        Case("floats >= 2**63 in every step", fill_steps(limit, large_float_step)),
        Case(
            "20-digit float literals in every step",
            fill_steps(limit, large_float_step).replace(b"1e19", b"10000000000000000000.0"),
        ),
        Case(
            "bad: integer beyond 64 bits, every step",
            fill_steps(limit, big_integer_step).replace(b'"%s"' % BIG_HOLDER.encode(), b"%d" % BIG),
        ),
        Case(
            "bad: integer beyond 64 bits, last step",
            replace_last(room, b'"type":"thought"}', b'"type":"thought","x_n":%d}' % BIG),
        ),
        Case(
            "bad: 400-digit integer, last step",
            replace_last(room, b"}]", b',"x_n":%s}]' % (b"9" * 400)),
        ),
        Case("created_at lower-case t and z", typical_created_at("2025-01-15t12:00:00z"), True),
        Case(
            "created_at leap second, offset", typical_created_at("2016-12-31T18:59:60-05:00"), True
        ),
        Case("bad: created_at '2025-01-15 12'", typical_created_at("2025-01-15 12")),
        Case(
            "bad: created_at wrong, most steps",
            most.replace(b"2025-01-15T12:00:00Z", b"2025-01-15T12:00:00", 1),
        ),
        Case("bad: cut one byte short", most[:-1]),
        Case("bad: one byte over the limit", padded(base(steps=one), limit + 1)),
    ]


def median_ms(action: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``action`` in ms, and its result (or the TraceError it raised)."""
    times: list[float] = []
    outcome: Any = None
    for _ in range(repeats):
        outcome = None  # the previous run's result is freed here, not on the clock
        started = time.perf_counter()
        try:
            outcome = action()
        except TraceError as error:
            outcome = error
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), outcome


@dataclass
class Row:
    case: Case
    outcome: str
    orjson_ms: float | None
    decode_ms: float
    json_ms: float | None = None
    validate_ms: float | None = None
    embed_ms: float | None = None
    score_ms: float | None = None
    free_ms: float | None = None

    @property
    def checked_ms(self) -> float:
        return self.decode_ms + (self.validate_ms or 0.0)

    @property
    def total_ms(self) -> float:
        rest = (self.embed_ms, self.score_ms, self.free_ms)
        return self.checked_ms + sum(value or 0.0 for value in rest)


def bare_orjson(raw: bytes) -> Any:
    """orjson.loads as decode_json runs it (collector paused): the floor of any decode."""
    gc.disable()
    try:
        return orjson.loads(raw)
    finally:
        gc.enable()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) < len(pairs):
        raise ValueError("a key given twice")
    return document


def _int_in_range(literal: str) -> int:
    value = int(literal)
    if not -(2**63) <= value <= 2**64 - 1:
        raise ValueError("an integer beyond 64 bits")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


STANDARD = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_int=_int_in_range, parse_constant=_no_constant
)


def standard_json(raw: bytes) -> Any:
    """The standard decoder with strictness hooks, collector paused as decode_json runs it: a
    Python call per object and per integer. Timed to its answer, a refusal included."""
    gc.disable()
    try:
        return STANDARD.decode(raw.decode())
    except (ValueError, RecursionError) as error:
        return error
    finally:
        gc.enable()


def measure(case: Case, repeats: int, limit: int) -> Row:
    raw = case.raw
    orjson_ms = json_ms = None
    if len(raw) <= limit:
        with contextlib.suppress(orjson.JSONDecodeError):
            orjson_ms, _ = median_ms(lambda: bare_orjson(raw), repeats)
        json_ms, _ = median_ms(lambda: standard_json(raw), repeats)
    decode_ms, document = median_ms(lambda: decode_json(raw, limit), repeats)
    if isinstance(document, TraceError):
        return Row(case, document.kind, orjson_ms, decode_ms, json_ms)
    validate_ms, trace = median_ms(lambda: validate_trace(document), repeats)
    if isinstance(trace, TraceError):
        return Row(case, trace.kind, orjson_ms, decode_ms, json_ms, validate_ms)
    assert isinstance(trace, Trace)
    embed_ms, _ = median_ms(trace.embedding_text, repeats)
    score_ms, _ = median_ms(lambda: score_trace(trace, Novelty.empty_cache(), PROFILES), repeats)
    free_ms = median_ms_of_free(raw, limit, repeats)
    return Row(
        case, "valid", orjson_ms, decode_ms, json_ms, validate_ms, embed_ms, score_ms, free_ms
    )


def median_ms_of_free(raw: bytes, limit: int, repeats: int) -> float:
    """Median time to drop the only reference to a freshly decoded document of ``raw``."""
    times: list[float] = []
    for _ in range(repeats):
        holder = [decode_json(raw, limit)]
        started = time.perf_counter()
        holder.clear()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def longest_wait_ms(raw: bytes, limit: int, rounds: int) -> float:
    """Longest gap a thread ticking every 0.5 ms sees while this input is decoded and checked."""
    stop = threading.Event()
    gaps: list[float] = []

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.0005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    time.sleep(0.05)
    gaps.clear()
    for _ in range(rounds):
        with contextlib.suppress(TraceError):
            validate_trace(decode_json(raw, limit))
    stop.set()
    ticker.join()
    return max(gaps) * 1000


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    args = parser.parse_args()
    limit = args.max_bytes

    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"orjson {version('orjson')}, jsonschema-rs {version('jsonschema-rs')}; "
        f"limit {limit} bytes; median of {args.repeats} runs; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    built = cases(limit)
    validate_trace(decode_json(built[0].raw))  # compile the validator before timing
    header = (
        f"{'case (ms)':38} {'bytes':>9} {'outcome':>13} {'orjson':>7} {'decode':>7} "
        f"{'json':>7} {'validate':>8} {'embed-text':>10} {'score':>6} {'free':>6} {'total':>7}"
    )
    print(header)
    print("-" * len(header))
    rows: list[Row] = []
    for case in built:
        gc.collect()
        row = measure(case, args.repeats, limit)
        rows.append(row)
        print(
            f"{case.name:38} {len(case.raw):>9} {row.outcome:>13} {fmt(row.orjson_ms):>7} "
            f"{fmt(row.decode_ms):>7} {fmt(row.json_ms):>7} {fmt(row.validate_ms):>8} "
            f"{fmt(row.embed_ms):>10} {fmt(row.score_ms):>6} {fmt(row.free_ms):>6} "
            f"{fmt(row.total_ms):>7}",
            flush=True,
        )

    worst = max(rows, key=lambda r: r.checked_ms)
    typical = max((r for r in rows if r.case.typical), key=lambda r: r.checked_ms)
    over = [r for r in rows if r.checked_ms > TARGET_WORST_MS]
    print()
    print(
        f"worst decode+validate: {worst.checked_ms:.2f} ms ({worst.case.name}), "
        f"target <= {TARGET_WORST_MS:.0f} ms: {'met' if not over else 'NOT met'}"
    )
    for row in over:
        floor = row.orjson_ms or 0.0
        print(
            f"  over: {row.case.name}: {row.checked_ms:.2f} ms = {floor:.2f} bare orjson.loads "
            f"+ {row.checked_ms - floor:.2f} the checks"
        )
    print(
        f"typical trace decode+validate: {typical.checked_ms:.3f} ms ({typical.case.name}), "
        f"target <= {TARGET_TYPICAL_MS} ms: "
        f"{'met' if typical.checked_ms <= TARGET_TYPICAL_MS else 'NOT met'}"
    )
    rounds = max(3, args.repeats)
    wait = longest_wait_ms(worst.case.raw, limit, rounds)
    print(
        f"longest wait of a thread ticking every 0.5 ms while the worst case is checked "
        f"{rounds} times: {wait:.2f} ms"
    )


if __name__ == "__main__":
    main()
