"""Backoff for every retry loop (start-up, publishing, waiting for a broker): one schedule shape."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence

# Each wait is the schedule's delay less up to this share of it, drawn anew for every wait.
# Replicas that lost the broker at the same moment would otherwise all retry at the same
# moments, and reach a broker that comes back in one burst, every time.
JITTER = 0.5


def backoff(
    schedule: Sequence[float],
    jitter: float = JITTER,
    uniform: Callable[[], float] = random.random,
) -> Iterator[float]:
    """Seconds to wait before each retry: the schedule in order, then its last value forever,
    each delay ``d`` drawn from ``[d * (1 - jitter), d]`` (``uniform`` gives [0, 1); pass a
    seeded ``random.Random().random`` for a reproducible sequence). Never longer than the
    schedule says, so a documented delay stays an upper bound."""
    if not schedule:
        raise ValueError("a backoff schedule needs at least one delay")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    for delay in itertools.chain(schedule, itertools.repeat(schedule[-1])):
        yield delay * (1.0 - jitter * uniform())
