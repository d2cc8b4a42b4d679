"""The shutdown deadline: a SIGTERM during a broker outage must not leave the process hanging.

On the first SIGTERM/SIGINT the worker stops taking records and publishes and commits what it
can, as usual; :class:`ShutdownDeadline` starts a daemon timer beside it. If the process is
still alive when ``KP_SHUTDOWN_TIMEOUT_SECONDS`` have passed (a commit or a publish waiting on
an unreachable broker), it logs one line and ends the process with :data:`EXIT_DEADLINE`.
Nothing is lost: records whose offsets were not committed are redelivered to the next worker.
A second signal ends the process at once, with the same code. A stop that finished in time
but could not confirm that every published record's offset was committed (step 5 of
:mod:`worker.stream.checkpoint`) exits with the same code too: the redelivery is expected, not
a clean stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# EX_TEMPFAIL (sysexits.h): stopped before everything was committed; a retry redelivers it.
EXIT_DEADLINE = 75


class ShutdownDeadline:
    """Ends the process ``timeout`` seconds after :meth:`start` unless it exited by then."""

    def __init__(self, timeout: float, exit: Callable[[int], object] = os._exit) -> None:
        self.timeout = timeout
        self._exit = exit
        self._timer: threading.Timer | None = None

    @property
    def started(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        """The first signal: start the countdown (later calls are no-ops)."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(
            self.timeout,
            self._end,
            ["shutdown deadline reached; records not committed will be redelivered"],
            {"deadline_s": self.timeout},
        )
        self._timer.daemon = True
        self._timer.start()
        log.info("shutting down", extra={"deadline_s": self.timeout})

    def now(self, reason: str) -> None:
        """A second signal: exit at once."""
        if self._timer is not None:
            self._timer.cancel()
        self._end("%s: exiting at once; records not committed will be redelivered", reason)

    def _end(self, message: str, *args: object, **extra: object) -> None:
        log.error(message, *args, extra={**extra, "exit_code": EXIT_DEADLINE})
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # exiting anyway
                handler.flush()
        self._exit(EXIT_DEADLINE)
