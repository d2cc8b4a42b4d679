"""The records that flow through the scorer: one read from a topic (or a JSON line of a file or
the Python API, event time from ``metadata.created_at``), and where it is routed with what is
written there."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import orjson

from worker.core.errors import TraceError
from worker.core.scoring import ScoreBreakdown

# The domain label of dead letters and of domains without a configured profile, so metric
# labels stay bounded whatever producers send.
OTHER_DOMAIN = "other"


class Decision(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    DEAD_LETTER = "dead_letter"

    @classmethod
    def of(cls, score: float, threshold: float) -> Decision:
        """The accept rule, for the worker and re-scoring alike: score >= threshold."""
        return cls.ACCEPTED if score >= threshold else cls.REJECTED


class UnreadableValue(bytes):
    """The value of a record the Kafka client could not read (its batch failed to decode):
    no bytes, and why. The scorer dead-letters such a record as ``unreadable``."""

    reason: str

    def __new__(cls, reason: str) -> UnreadableValue:
        value = super().__new__(cls, b"")
        value.reason = reason
        return value


# A header's value may be null on the wire (a producer may send a header without one): it is
# passed on as null, as the output contract keeps the input's headers.
Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One input record as read from the log (or a line of a file, offline)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()

    @property
    def topic_partition(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class RoutedRecord:
    """Where one source record goes, and what is written there."""

    source: SourceRecord
    decision: Decision
    value: bytes | None  # None only for a dead letter: a tombstone, or a value left out
    headers: Headers
    domain_label: str
    breakdown: ScoreBreakdown | None = None
    error: TraceError | None = None
    # Kafka clients refuse a record with neither key nor value (see output.KEY_NULL_HEADER).
    empty_key: bool = False
    # The novelty cache entry this record's trace added, as the cache store keeps it (key,
    # value): published with the output (worker.core.cache_store).
    cache_entry: tuple[bytes, bytes] | None = None

    @property
    def key(self) -> bytes | None:
        return b"" if self.empty_key else self.source.key


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The Gregorian calendar repeats every 400 years, leap days included: year 0000, which RFC
# 3339 allows and datetime cannot hold, is read as year 0400, one cycle earlier.
_GREGORIAN_CYCLE = timedelta(days=146_097)
_ABSENT = object()


def _find(document: Any, dotted: str) -> Any:
    """The value at a dotted path, or ``_ABSENT`` where the path does not exist."""
    for part in dotted.split("."):
        if not isinstance(document, dict) or part not in document:
            return _ABSENT
        document = document[part]
    return document


def _event_time_ms(document: Any) -> int:
    created = _find(document, "metadata.created_at")
    if not isinstance(created, str):
        return 0
    # RFC 3339 allows a lower-case t and z, which fromisoformat refuses, and a leap second
    # (23:59:60), which datetime cannot hold: it is read as the second after 23:59:59, added
    # to the interval (the one after 9999-12-31T23:59:59 is past datetime's range).
    text, shift = created.upper(), timedelta(0)
    if text[16:19] == ":60":
        text, shift = f"{text[:17]}59{text[19:]}", timedelta(seconds=1)
    if text.startswith("0000"):
        text, shift = f"0400{text[4:]}", shift - _GREGORIAN_CYCLE
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return 0
    if moment.tzinfo is None:
        # A time without an offset is UTC, not this machine's zone: scores may not depend on
        # where the file is scored.
        moment = moment.replace(tzinfo=UTC)
    # Integer arithmetic: float seconds * 1000 truncates about 1 % of times 1 ms short.
    return (moment - _EPOCH + shift) // timedelta(milliseconds=1)


class LineRecords:
    """Turns numbered lines into SourceRecords, assigning partitions by key value."""

    def __init__(self, source_name: str, partition_by: str | None) -> None:
        self.source_name = source_name
        self.partition_by = partition_by
        self._partitions: dict[str, int] = {}
        # Lines that hold the ``partition_by`` field: none means a misspelt path, under which
        # every line shared one cache.
        self.lines_with_field = 0

    def record(self, index: int, line: bytes) -> SourceRecord:
        try:
            document = orjson.loads(line)
        except orjson.JSONDecodeError:
            document = None
        partition = 0
        if self.partition_by is not None:
            value = _find(document, self.partition_by)
            self.lines_with_field += value is not _ABSENT
            if value is _ABSENT:
                value = None
            try:
                key = orjson.dumps(value).decode()
            except orjson.JSONEncodeError:  # nested too deep to write back: one shared group
                key = "<unserialisable>"
            partition = self._partitions.setdefault(key, len(self._partitions))
        return SourceRecord(
            topic=self.source_name,
            partition=partition,
            offset=index,
            timestamp_ms=_event_time_ms(document),
            key=None,
            value=line,
        )
