"""Liveness and readiness of the worker, as the /healthz and /readyz endpoints answer them.

Both are read from the HTTP server's thread, which keeps running when the event loop hangs,
so neither may depend on the loop answering: the loop stamps a tick every second (more
often under a short ``stall_seconds``), the pipeline stamps progress whenever it takes or
finishes a record, and the answers compare those stamps with the clock.

- Live: the event loop ticked within a third of ``stall_seconds``, and, while records wait
  (behind the log's end or in the pipeline), one was taken or finished within
  ``stall_seconds`` (a cache rebuild in progress counts as progress).
- Ready: the scorer is built (model loaded, or running without one as configured), the
  broker answers (it has answered at least once, and the last request to it did not fail),
  it refuses none of the worker's requests for want of a permission (an ACL), the consumer
  has received a partition assignment, and the worker is not stopping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

LOOP_TICK_SECONDS = 1.0
# A stall setting shorter than this many ticks would fail liveness between two ticks of a
# loop that runs: such a setting makes the loop tick more often.
TICKS_PER_STALL_THIRD = 2


@dataclass(frozen=True)
class Verdict:
    ok: bool
    checks: dict[str, str] = field(default_factory=dict)  # name -> "ok" or why not

    def to_json(self) -> dict[str, object]:
        return {"status": "ok" if self.ok else "failing", "checks": self.checks}


class WorkerHealth:
    def __init__(
        self,
        stall_seconds: float,
        records_waiting: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
        broker: Callable[[], str] = lambda: "ok",
        permissions: Callable[[], str] = lambda: "ok",
    ) -> None:
        self.stall_seconds = stall_seconds
        # How often the event loop stamps its tick: well within a third of the stall time.
        self.tick_seconds = min(LOOP_TICK_SECONDS, stall_seconds / 3 / TICKS_PER_STALL_THIRD)
        self._records_waiting = records_waiting
        self._broker = broker  # "ok" or why not
        self._permissions = permissions  # "ok" or which are refused
        self._clock = clock
        self._lock = threading.Lock()
        started = clock()
        self._last_tick = started
        self._last_progress = started
        self._in_pipeline = 0
        self._rebuilding = 0
        self._model: str | None = None
        self._assignment_received = False
        self._stopping = False

    # -- reported by the worker --------------------------------------------------------------
    def loop_ticked(self) -> None:
        with self._lock:
            self._last_tick = self._clock()

    def progress(self, in_pipeline: int = 0, rebuilding: int = 0) -> None:
        """A record taken (+1) or finished (-1), a cache rebuild begun (+1) or ended (-1)."""
        with self._lock:
            self._in_pipeline += in_pipeline
            self._rebuilding += rebuilding
            self._last_progress = self._clock()

    def scorer_ready(self, model: str | None, reason: str | None) -> None:
        with self._lock:
            self._model = f"loaded: {model}" if model else f"none ({reason or 'not configured'})"

    def assignment_received(self) -> None:
        with self._lock:
            self._assignment_received = True

    def stopping(self) -> None:
        with self._lock:
            self._stopping = True

    # -- read by the endpoints ---------------------------------------------------------------
    def liveness(self) -> Verdict:
        waiting = self._records_waiting()
        with self._lock:
            now = self._clock()
            tick_age = now - self._last_tick
            progress_age = now - self._last_progress
            in_pipeline, rebuilding = self._in_pipeline, self._rebuilding
        checks = {"event_loop": "ok", "consume_loop": "ok"}
        if tick_age > self.stall_seconds / 3:
            checks["event_loop"] = f"no tick for {tick_age:.0f} s"
        pending = waiting + in_pipeline
        if pending and not rebuilding and progress_age > self.stall_seconds:
            checks["consume_loop"] = (
                f"{pending} records waiting and none taken or finished for {progress_age:.0f} s"
            )
        return Verdict(all(check == "ok" for check in checks.values()), checks)

    def readiness(self) -> Verdict:
        broker = self._broker()
        permissions = self._permissions()
        with self._lock:
            model, assigned, stopping = self._model, self._assignment_received, self._stopping
        checks = {
            "scorer": model or "starting",
            "broker": broker,
            "permissions": permissions,
            "assignment": "received" if assigned else "waiting for the group",
            "stopping": "yes" if stopping else "no",
        }
        ready = (
            model is not None
            and broker == "ok"
            and permissions == "ok"
            and assigned
            and not stopping
        )
        return Verdict(ready, checks)
