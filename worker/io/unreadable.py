"""Record batches the Kafka client cannot read become records the worker dead-letters.

aiokafka reads a fetched batch record by record and raises on a record it cannot read: a
header name that is not UTF-8 (Go and C producers can send one; Java clients read it with
replacement characters), or a batch its codec cannot decode. The exception ends the consumer,
and a restarted worker meets the same batch at the same offset, forever. Installed once per
process (:func:`install`, done when ``worker.io.kafka`` is imported), every aiokafka consumer
reads each batch whole before handing out its records; a batch that fails yields one record per
offset it spans, whose value is an :class:`~worker.core.records.UnreadableValue` naming the
client's error, so the scorer dead-letters it (``unreadable``) and the worker moves on.

This overrides aiokafka's private ``PartitionRecords``; ``tests/unit/test_unreadable.py``
fails when aiokafka changes what it builds on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.consumer import fetcher

from worker.core.errors import one_line
from worker.core.records import UnreadableValue

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _UnreadableRecord:
    """What aiokafka's consumer reads of a record: the offset and time of its batch, no key,
    no headers, and a value saying why the batch could not be read."""

    offset: int
    timestamp: int
    timestamp_type: int
    value: UnreadableValue
    key: None = None
    checksum: None = None
    headers: tuple[()] = ()


class _WholeBatch:
    """A record batch read whole when first iterated; its other attributes are the batch's."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        batch = self._batch
        try:
            return iter(list(batch))
        except Exception as exc:  # any failure to read the batch is the batch's, not ours
            why = f"the Kafka client cannot read this record's batch: {one_line(exc)}"[:300]
            log.warning(
                "unreadable record batch",
                extra={
                    "first_offset": batch.base_offset,
                    "next_offset": batch.next_offset,
                    "error": type(exc).__name__,
                },
            )
            timestamp = getattr(batch, "max_timestamp", None) or 0
            return iter(
                _UnreadableRecord(offset, timestamp, 0, UnreadableValue(why))
                for offset in range(batch.base_offset, batch.next_offset)
            )


class _WholeBatches:
    """Fetched records whose batches are each read whole (:class:`_WholeBatch`)."""

    def __init__(self, records: Any) -> None:
        self._records = records

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> _WholeBatch | None:
        batch = self._records.next_batch()
        return None if batch is None else _WholeBatch(batch)


class _TolerantPartitionRecords(fetcher.PartitionRecords):  # type: ignore[misc]
    def __init__(self, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tp, _WholeBatches(records), *args, **kwargs)


def install() -> None:
    """Make every aiokafka consumer of this process read batches as this module says."""
    if fetcher.PartitionRecords is not _TolerantPartitionRecords:
        fetcher.PartitionRecords = _TolerantPartitionRecords


__all__ = ["install"]
