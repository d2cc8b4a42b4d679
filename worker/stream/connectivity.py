"""Broker connectivity as state: reachable or not, and since when, for logs and metrics.

The worker reports what it saw (records fetched, outputs acknowledged, a probe of the input
topic that succeeded or failed); :class:`BrokerHealth` turns that into one log line per state
change ("broker unreachable since ...", "broker reachable again after ...") and into the values
behind ``kp_broker_reachable`` and ``kp_seconds_since_last_fetch``/``_publish``, which are read
at scrape time so they keep growing while nothing succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

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
        self.reachable = True
        self.unreachable_since: float | None = None  # monotonic
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
        with self._lock:
            if self.reachable:
                return
            self.reachable = True
            assert self.unreachable_since is not None
            outage = self._clock() - self.unreachable_since
            self.unreachable_since = None
        log.warning(
            "broker reachable again after %.0f s", outage, extra={"outage_s": round(outage, 1)}
        )

    def unreachable(self, error: BaseException | str) -> None:
        """A request the broker should have answered failed or timed out."""
        with self._lock:
            if not self.reachable:
                return
            self.reachable = False
            self.unreachable_since = self._clock()
            since = datetime.fromtimestamp(self._wall_clock(), UTC).isoformat(timespec="seconds")
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        log.error("broker unreachable since %s", since, extra={"error": reason[:300]})

    def reachable_value(self) -> float:
        return 1.0 if self.reachable else 0.0

    def seconds_since_fetch(self) -> float:
        return max(0.0, self._clock() - self.last_fetch)

    def seconds_since_publish(self) -> float:
        return max(0.0, self._clock() - self.last_publish)
