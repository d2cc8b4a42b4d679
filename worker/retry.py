"""Backoff for every retry loop (start-up, publishing, waiting for a broker): one schedule shape."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def backoff(schedule: Sequence[float]) -> Iterator[float]:
    """Seconds to wait before each retry: the schedule in order, then its last value forever."""
    if not schedule:
        raise ValueError("a backoff schedule needs at least one delay")
    yield from schedule
    while True:
        yield schedule[-1]
