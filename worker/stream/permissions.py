"""What the broker refuses the worker's user (its ACLs), as state: one log line when a refusal
is first seen, one when the refused operation works again, and the ``permissions`` check of
/readyz in between. No Kafka: the clients report what they were refused
(:mod:`worker.io.access` names each refusal) and what worked since.

A refusal is not an outage: the broker answered, and asking again changes nothing until an
operator grants the permission. So the worker neither stops (a restart would be refused the
same) nor commits past a record it could not publish: it keeps asking, and goes on where it
was once the permission is there (docs/operations.md, "Permissions (ACLs)").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

WHERE_TO_LOOK = "docs/operations.md#permissions-acls"


@dataclass(frozen=True, order=True)
class Refusal:
    """The permission the broker refused: ``operation`` on ``resource`` (topic, group) ``name``;
    ``alternative`` says what else would do (Create, for a topic the worker cannot see)."""

    operation: str  # as Kafka's ACLs name it: Read, Write, Create, Describe
    resource: str  # topic, group
    name: str
    alternative: str = ""

    def __str__(self) -> str:
        also = f" ({self.alternative})" if self.alternative else ""
        return f"{self.operation} on {self.resource} {self.name!r}{also}"


class Permissions:
    """The refusals in force, safe to report from any thread (the consumer has its own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._refused: dict[Refusal, float] = {}  # -> when last refused (monotonic)

    def refused(self, refusal: Refusal) -> None:
        """The broker refused ``refusal`` (again): the line is logged the first time only."""
        with self._lock:
            first = refusal not in self._refused
            self._refused[refusal] = self._clock()
        if first:
            log.error(
                "not authorized: %s",
                refusal,
                extra={
                    "operation": refusal.operation,
                    refusal.resource: refusal.name,
                    "grant": WHERE_TO_LOOK,
                },
            )

    def granted(self, refusal: Refusal, quiet_seconds: float = 0.0) -> None:
        """What ``refusal`` refused worked: it is over, unless it was refused again within the
        last ``quiet_seconds`` (a client that cannot tell success from not asking)."""
        if refusal not in self._refused:  # the usual case, every record: no lock
            return
        with self._lock:
            last = self._refused.get(refusal)
            if last is None or self._clock() - last < quiet_seconds:
                return
            del self._refused[refusal]
        log.info(
            "authorized: %s",
            refusal,
            extra={"operation": refusal.operation, refusal.resource: refusal.name},
        )

    def refusals(self) -> list[Refusal]:
        with self._lock:
            return sorted(self._refused)

    def readiness(self) -> str:
        """``ok``, or the permissions refused (for /readyz)."""
        refused = self.refusals()
        if not refused:
            return "ok"
        return "not authorized: " + "; ".join(str(refusal) for refusal in refused)
