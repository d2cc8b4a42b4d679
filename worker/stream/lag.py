"""How far behind the log's end each owned partition is, in records and seconds.

Computed when read (at scrape time) from what the worker reports: assignments, where scoring
starts, each record finished, and the log's end offsets (each fetched record's high watermark,
and a periodic probe that keeps coming while no record arrives), so a worker that stops
finishing records shows its lag growing instead of a frozen value.

Seconds behind, without reading the log: for a partition behind, now minus the newer of its
last finished record's timestamp and the last moment it was caught up (before either, its
assignment); 0 when caught up. A timestamp ahead of the clock counts as now: taken as it is,
an hour-ahead record would pin lag seconds at 0 for an hour; ignored, every record of a
producer a second fast would show a lag that is not there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]

# A record timestamp more ahead of the clock than this is reported as a future timestamp:
# clocks of different hosts differ by milliseconds, which is not worth a count.
FUTURE_TOLERANCE_SECONDS = 1.0


@dataclass
class _Partition:
    assigned_at: float  # wall clock, seconds
    position: int | None = None  # next offset to finish
    log_end: int | None = None
    last_timestamp: float | None = None  # of the last finished record, seconds
    caught_up_at: float | None = None
    end_moved_at: float | None = None

    def note_caught_up(self, now: float) -> None:
        if self.position is not None and self.log_end is not None and self.position >= self.log_end:
            self.caught_up_at = now


@dataclass(frozen=True)
class Lag:
    topic: str
    partition: int
    records: int
    seconds: float


class PartitionLag:
    """Thread-safe: updated from the event loop, read from the metrics and health endpoints."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._finished: dict[TopicPartition, int] = {}  # kept across revocations

    def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions owned now; others stop being reported."""
        now, wanted = self._clock(), set(partitions)
        with self._lock:
            self._partitions = {
                tp: self._partitions.get(tp) or _Partition(assigned_at=now) for tp in wanted
            }

    def started(self, tp: TopicPartition, position: int | None) -> None:
        """Scoring of ``tp`` starts at ``position`` (the committed offset); None: revoked or
        failed, unknown until scoring starts again."""
        with self._lock:
            state = self._partitions.get(tp)
            if state is not None:
                state.position = position
                state.note_caught_up(self._clock())

    def restarted(self, tp: TopicPartition) -> None:
        """tp's log started over: its old offsets (finished, log end) are another log's."""
        with self._lock:
            self._finished.pop(tp, None)
            state = self._partitions.get(tp)
            if state is not None:
                state.position = state.log_end = None

    def finished(self, tp: TopicPartition, offset: int, timestamp_ms: int) -> bool:
        """The record at ``offset`` was published. Returns whether its timestamp was ahead of
        the clock (beyond :data:`FUTURE_TOLERANCE_SECONDS`)."""
        now = self._clock()
        seconds = timestamp_ms / 1000
        # 0, or -1 as Kafka reads a record without one: no timestamp.
        ahead = timestamp_ms > 0 and seconds - now > FUTURE_TOLERANCE_SECONDS
        with self._lock:
            self._finished[tp] = max(self._finished.get(tp, 0), offset + 1)
            state = self._partitions.get(tp)
            if state is None:
                return ahead
            state.position = max(state.position or 0, offset + 1)
            if timestamp_ms > 0:
                seconds = min(seconds, now)
                state.last_timestamp = max(state.last_timestamp or seconds, seconds)
            state.note_caught_up(now)
        return ahead

    def log_ends(self, ends: Mapping[TopicPartition, int]) -> None:
        """End offsets (high watermarks) seen in a fetch or a probe."""
        now = self._clock()
        with self._lock:
            for tp, end in ends.items():
                state = self._partitions.get(tp)
                if state is not None:
                    if state.log_end is None or end > state.log_end:
                        state.log_end, state.end_moved_at = end, now
                    state.note_caught_up(now)

    def snapshot(self) -> list[Lag]:
        """Every owned partition whose position and log end are known, with its lag now."""
        now = self._clock()
        lags = []
        with self._lock:
            for (topic, partition), state in sorted(self._partitions.items()):
                if state.position is None or state.log_end is None:
                    continue
                behind = max(0, state.log_end - state.position)
                seconds = 0.0
                if behind:
                    known = [t for t in (state.last_timestamp, state.caught_up_at) if t is not None]
                    seconds = max(0.0, now - (max(known) if known else state.assigned_at))
                lags.append(Lag(topic, partition, behind, seconds))
        return lags

    def finished_positions(self) -> dict[TopicPartition, int]:
        """Every partition this worker published a record of: the offset after the last."""
        with self._lock:
            return dict(self._finished)

    def records_waiting(self, settled_after: float) -> int:
        """Records behind the log's end, for liveness. A partition exactly one behind whose end
        has not moved for ``settled_after`` seconds does not count: on a topic written in
        transactions, the last commit marker takes an offset that no record fills."""
        now = self._clock()
        waiting = 0
        with self._lock:
            for state in self._partitions.values():
                if state.position is None or state.log_end is None:
                    continue
                behind = state.log_end - state.position
                settled = state.end_moved_at is None or now - state.end_moved_at > settled_after
                if behind > 1 or (behind == 1 and not settled):
                    waiting += behind
        return waiting
