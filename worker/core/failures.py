"""Where each kind of failure is decided, one method per kind. No Kafka.

- A scoring bug (an exception scoring one valid trace) dead-letters that record
  (``internal``) and the worker goes on: the record ends in an output, nothing is lost.
- A publish failure, or any other failure to finish a record (its embedding, its novelty),
  stops the worker: that record is not acknowledged, so it and every later record of its
  partition are delivered again to the next worker. Going on would leave a gap behind a
  committed offset.
- A partition lost to another worker while its records were in flight (exactly-once: the
  other worker fenced this one) drops them, unacknowledged: the partition's new owner scores
  them, and this worker goes on with its other partitions.
- A consumer error (the broker unreachable while probing or fetching) is counted and the
  worker goes on: the Kafka client reconnects by itself, and nothing was taken that is not
  delivered again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from worker.core.errors import InternalScoringError
from worker.core.output import dead_letter
from worker.core.records import RoutedRecord, SourceRecord

log = logging.getLogger(__name__)

Stop = Callable[[BaseException], object]


class PartitionLost(Exception):
    """The partition belongs to another worker now: its records here are dropped."""


class FailurePolicy:
    """The policy above, as one object: ``stop`` ends the worker, ``unreachable`` counts the
    broker unreachable; offline scoring has neither."""

    def __init__(self, stop: Stop | None = None, unreachable: Stop | None = None) -> None:
        self._stop = stop
        self._unreachable = unreachable

    def scoring_failed(self, record: SourceRecord, exc: Exception) -> RoutedRecord:
        """A bug must not lose the record: it is dead-lettered."""
        log.exception("scoring failed", extra={"source_offset": record.offset}, exc_info=exc)
        return dead_letter(record, InternalScoringError(f"scoring failed: {exc!r}"[:300]))

    def publish_failed(self, record: SourceRecord, exc: BaseException) -> None:
        """The broker did not take a record's output: stop, unless the partition is lost."""
        if not isinstance(exc, PartitionLost):
            self._stop_worker(record, exc)

    def processing_failed(self, record: SourceRecord, exc: BaseException) -> None:
        """A record could not be decoded, embedded or scored in order: stop."""
        self._stop_worker(record, exc)

    def consumer_failed(self, exc: BaseException) -> None:
        """The broker did not answer the consumer: counted; the client retries."""
        if self._unreachable is not None:
            self._unreachable(exc)

    def stopping(self) -> None:
        """The worker is stopping and abandons what is in flight: nothing more to stop."""
        self._stop = None

    def _stop_worker(self, record: SourceRecord, exc: BaseException) -> None:
        if self._stop is None:
            return
        log.error(
            "scoring or publishing failed; stopping",
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
            exc_info=exc,
        )
        self._stop(exc)
