"""The records that flow through the scorer: one read from a topic (or a file line), and where
it is routed with what is written there."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

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

    @property
    def key(self) -> bytes | None:
        return b"" if self.empty_key else self.source.key
