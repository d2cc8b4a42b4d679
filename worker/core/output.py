"""The wire format of every output topic, written in one place for the worker, replay and demo.

Accepted and rejected records carry ``schemas/scored-trace.schema.json``; dead letters keep
the original bytes and explain themselves in headers (``schemas/dead-letter-headers.schema.json``).
"""

from __future__ import annotations

import dataclasses
import itertools
import unicodedata
from typing import TYPE_CHECKING, Any

import orjson

from worker.core.errors import InternalScoringError, OutputTooLargeError, TraceError
from worker.core.records import (
    OTHER_DOMAIN,
    Decision,
    Headers,
    RoutedRecord,
    SourceRecord,
    UnreadableValue,
)
from worker.core.scoring import ScoreBreakdown
from worker.core.trace import Trace
from worker.version import __version__

if TYPE_CHECKING:
    from worker.settings import Settings

HEADER_PREFIX = "kp-"
DEFAULT_MAX_OUTPUT_BYTES = 2_097_152
# On a dead letter whose input had a null key and that has a null value itself: its key is
# empty instead (a record needs a key or a value), and this says the original's was null.
KEY_NULL_HEADER = (f"{HEADER_PREFIX}key-null", b"true")
ERROR_KIND_HEADER = f"{HEADER_PREFIX}error-kind"  # a dead letter's; `rescore` and `report` read it

_Headers = tuple[tuple[str, bytes], ...]


def output_topics(settings: Settings) -> dict[Decision, str]:
    """The topic each decision is published to."""
    return {
        Decision.ACCEPTED: settings.accepted_topic,
        Decision.REJECTED: settings.rejected_topic,
        Decision.DEAD_LETTER: settings.dead_letter_topic,
    }


def prefixed_topics(prefix: str) -> dict[Decision, str]:
    """``PREFIX.accepted``, ``PREFIX.rejected``, ``PREFIX.dead-letter`` (replays write there)."""
    return {d: f"{prefix}.{d.value.replace('_', '-')}" for d in Decision}


def scored(
    record: SourceRecord,
    trace: Trace,
    breakdown: ScoreBreakdown,
    threshold: float,
    decision: Decision,
    domain_label: str,
    model_id: str | None,
) -> RoutedRecord:
    """An accepted or rejected output: the input key and headers, the trace with its score."""
    source: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
    }
    if trace.schema_id is not None:
        source["schema_id"] = trace.schema_id
    value = scored_value(
        trace.document,
        breakdown,
        threshold,
        decision,
        {"version": __version__, "model": model_id, "embedder_available": model_id is not None},
        source,
    )
    return RoutedRecord(
        source=record,
        decision=decision,
        value=value,
        headers=(*verdict_headers(decision, breakdown.score), *producer_headers(record.headers)),
        domain_label=domain_label,
        breakdown=breakdown,
    )


def verdict_headers(decision: Decision, score: float) -> _Headers:
    """The scorer's own headers on an accepted or rejected output."""
    return (
        (f"{HEADER_PREFIX}decision", decision.value.encode()),
        (f"{HEADER_PREFIX}score", repr(score).encode()),
        (f"{HEADER_PREFIX}scorer-version", __version__.encode()),
    )


def scored_value(
    document: dict[str, Any],
    breakdown: ScoreBreakdown,
    threshold: float,
    decision: Decision,
    scorer: dict[str, Any],
    source: dict[str, Any],
) -> bytes:
    """The value of an accepted or rejected record (``schemas/scored-trace.schema.json``)."""
    trace = dict(document)
    trace["metadata"] = {**trace["metadata"], "quality_score": breakdown.score}
    score: dict[str, Any] = breakdown.to_json()
    score["threshold"] = threshold
    score["decision"] = decision.value
    return orjson.dumps({"trace": trace, "score": score, "scorer": scorer, "source": source})


def producer_headers(headers: Headers) -> Headers:
    """The input's headers less any whose name reads as ``kp-`` (:func:`reads_as_scorers`):
    those are the scorer's alone on an output, so a producer cannot pass off a verdict of its
    own. Each output has the scorer's headers first and these after them, in their order."""
    return tuple(h for h in headers if not reads_as_scorers(h[0]))


def reads_as_scorers(name: str) -> bool:
    """Whether a header name reads as one of the scorer's ``kp-`` names, as a consumer that
    normalises Unicode reads it: compared after NFKC and case folding (``KP-``, fullwidth
    ``ｋｐ-``), with invisible format characters (a zero-width space) left out and any dash or
    minus sign (U+2010 hyphen, an en dash) read as ``-``."""
    read = (
        "-" if unicodedata.category(c) == "Pd" or c == "\N{MINUS SIGN}" else c
        for c in unicodedata.normalize("NFKC", name).casefold()
        if unicodedata.category(c) != "Cf"
    )
    return "".join(itertools.islice(read, len(HEADER_PREFIX))) == HEADER_PREFIX


def with_scorer_header(routed: RoutedRecord, header: tuple[str, bytes]) -> RoutedRecord:
    """``routed`` with one more of the scorer's headers: after its others, before the input's."""
    own = sum(
        1 for _ in itertools.takewhile(lambda h: h[0].startswith(HEADER_PREFIX), routed.headers)
    )
    return dataclasses.replace(
        routed, headers=(*routed.headers[:own], header, *routed.headers[own:])
    )


def dead_letter(record: SourceRecord, error: TraceError) -> RoutedRecord:
    """Original bytes untouched; the why and the where in headers. A record the Kafka client
    could not read has no bytes to keep: no value, and a pointer to the original."""
    if isinstance(record.value, UnreadableValue):
        return _dead_letter(record, error, omitted="the Kafka client could not read the record")
    return _dead_letter(record, error, record.value, input_headers=True)


def _dead_letter(
    record: SourceRecord,
    error: TraceError,
    value: bytes | None = None,
    *,
    input_headers: bool = False,
    omitted: str | None = None,
    key_omitted: bool = False,
) -> RoutedRecord:
    """A dead letter that a Kafka client can publish: with neither key nor value (a tombstone
    with a null key, or a value left out) it gets an empty key and ``kp-key-null``.
    ``omitted`` says why the value was left out and where the original is; ``key_omitted``
    leaves the key out as well (an empty key: the record must have one)."""
    headers = dead_letter_headers(record, error)
    if omitted is not None:
        where = "read the original at the source topic/partition/offset"
        headers += (
            (f"{HEADER_PREFIX}value-omitted", f"{omitted}; {where}".encode("utf-8", "replace")),
        )
    empty_key = record.key is None and value is None
    if empty_key:
        headers += (KEY_NULL_HEADER,)
    return RoutedRecord(
        source=record,
        decision=Decision.DEAD_LETTER,
        value=value,
        headers=(*headers, *(producer_headers(record.headers) if input_headers else ())),
        domain_label=OTHER_DOMAIN,
        error=error,
        empty_key=empty_key or key_omitted,
    )


def dead_letter_headers(record: SourceRecord, error: TraceError) -> tuple[tuple[str, bytes], ...]:
    return (
        (ERROR_KIND_HEADER, error.kind.encode()),
        (f"{HEADER_PREFIX}error-reason", error.reason[:500].encode("utf-8", "replace")),
        (f"{HEADER_PREFIX}source-topic", record.topic.encode()),
        (f"{HEADER_PREFIX}source-partition", str(record.partition).encode()),
        (f"{HEADER_PREFIX}source-offset", str(record.offset).encode()),
        (f"{HEADER_PREFIX}source-timestamp", str(record.timestamp_ms).encode()),
        (f"{HEADER_PREFIX}scorer-version", __version__.encode()),
    )


def without_value(routed: RoutedRecord, limit: int) -> RoutedRecord:
    """A record too large to publish, as a dead letter that points at the original instead:
    a scored output's is ``output_too_large``, a dead letter keeps its kind. Both say which
    part made it too large (:func:`_too_large_part`).

    Nothing is lost: the source headers locate the original in the input topic.
    """
    why = _too_large_part(routed, limit)
    error = routed.error or OutputTooLargeError(f"{routed.decision.value} output: {why}")
    return _dead_letter(routed.source, error, input_headers=True, omitted=why)


def _too_large_part(routed: RoutedRecord, limit: int) -> str:
    """Which part of a record refused as too large made it so, with every part's size. The
    value has ``limit`` bytes (KP_MAX_OUTPUT_BYTES) to itself, and the record limit adds room
    for the key and the headers (``Settings.output_record_limit``): a value within its own
    limit leaves the larger of the key and the headers (names and values) to blame."""
    sizes = {
        "value": len(routed.value or b""),
        "key": len(routed.key or b""),
        "headers": sum(
            len(n.encode("utf-8", "replace")) + len(v or b"") for n, v in routed.headers
        ),
    }
    part = "value" if sizes["value"] > limit else max(("key", "headers"), key=sizes.__getitem__)
    parts = ", ".join(f"{name} {size} bytes" for name, size in sizes.items())
    return (
        f"the {part} made it too large to publish ({parts}; the publish limit gives the "
        f"value {limit} bytes, KP_MAX_OUTPUT_BYTES)"
    )


def refused(routed: RoutedRecord, why: str, *, with_key: bool = True) -> RoutedRecord:
    """The least a dead letter can be, for a record the Kafka client refused to publish: the
    scorer's headers alone (none of the input's), no value, the input's key (or an empty one;
    without ``with_key``, an empty one whatever it was: a key too large to publish).

    Publishing the refused record again would be refused again, on every restart too; this
    form holds nothing of the input a client could refuse. A dead letter keeps its error; a
    scored output gets an ``internal`` one (a failure of the scorer's output, not of the input).
    """
    error = routed.error or InternalScoringError(
        f"the Kafka client refused the {routed.decision.value} output: {why}"
    )
    left_out = "value and input headers" if with_key else "value, key and input headers"
    omitted = f"the Kafka client refused the record ({why}); {left_out} left out"
    return _dead_letter(routed.source, error, omitted=omitted, key_omitted=not with_key)


def is_refused_form(routed: RoutedRecord) -> bool:
    """Whether ``routed`` is already as small as ``refused`` makes a record."""
    return routed.value is None and not producer_headers(routed.headers)
