"""Broker connectivity as state: reachable or not, and since when.

What the worker saw (records fetched, outputs acknowledged, probes that succeeded or failed)
becomes one log line per state change and the values behind ``kp_broker_reachable`` and
``kp_seconds_since_last_fetch``/``_publish``, read at scrape time so they grow while nothing
succeeds. The broker is unreachable until it has answered once: a worker given a wrong
bootstrap address reads 0 from its first scrape and is not ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from worker.logs import error_line

log = logging.getLogger(__name__)


class BrokerHealth:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        started = clock()
        self.reachable = False
        self.ever_reached = False
        self.unreachable_since: float | None = started  # monotonic
        self.last_error: str | None = None
        self.last_fetch = started
        self.last_publish = started

    def fetched(self) -> None:
        """Records (or the input topic's offsets) came back from the broker."""
        with self._lock:
            self.last_fetch = self._clock()
        self.reached()

    def published(self) -> None:
        """The broker acknowledged outputs."""
        with self._lock:
            self.last_publish = self._clock()
        self.reached()

    def reached(self) -> None:
        """The broker answered a request (the first answer at start-up included)."""
        with self._lock:
            if self.reachable:
                return
            self.reachable = True
            first = not self.ever_reached
            self.ever_reached = True
            assert self.unreachable_since is not None
            outage = self._clock() - self.unreachable_since
            self.unreachable_since = None
            self.last_error = None
        if not first:
            log.warning(
                "broker reachable again after %.0f s", outage, extra={"outage_s": round(outage, 1)}
            )

    def unreachable(self, error: BaseException | str) -> None:
        """A request the broker should have answered failed or timed out. Before its first
        answer only the reason is kept: the start-up retries log each failure themselves."""
        reason = error[:300] if isinstance(error, str) else error_line(error)
        with self._lock:
            self.last_error = reason
            if not self.reachable:
                return
            self.reachable = False
            self.unreachable_since = self._clock()
            since = datetime.fromtimestamp(self._wall_clock(), UTC).isoformat(timespec="seconds")
        log.error("broker unreachable since %s", since, extra={"error": reason})

    def reachable_value(self) -> float:
        return 1.0 if self.reachable else 0.0

    def readiness(self) -> str:
        """``ok``, or why the worker cannot work with its broker now (for /readyz)."""
        with self._lock:
            if self.reachable:
                return "ok"
            assert self.unreachable_since is not None
            for_s = self._clock() - self.unreachable_since
            state = "unreachable" if self.ever_reached else "never reached"
            error = f": {self.last_error}" if self.last_error else ""
        return f"{state} for {for_s:.0f} s{error}"

    def seconds_since_fetch(self) -> float:
        return max(0.0, self._clock() - self.last_fetch)

    def seconds_since_publish(self) -> float:
        return max(0.0, self._clock() - self.last_publish)
