"""Record batches the Kafka client cannot read, or must not, become records the worker
dead-letters.

aiokafka reads a fetched batch record by record and raises on a record it cannot read: a
header name that is not UTF-8 (Go and C producers can send one; Java clients read it with
replacement characters), or a batch its codec cannot decode. The exception ends the consumer,
and a restarted worker meets the same batch at the same offset, forever. And it decompresses a
batch whole: a gzip batch within Kafka's 1 MiB can hold 1 GiB, a zstd one tens of GiB.

Installed by every consumer the product builds (:func:`install`), aiokafka reads each batch
whole before handing out its records, and decompresses gzip, lz4 and zstd batches into at most
``KP_MAX_BATCH_BYTES`` (snappy's format bounds it at ~21x); a batch that fails either way yields
one record per offset it spans, whose value is an :class:`~worker.core.records.UnreadableValue`
naming why, so the scorer dead-letters it (``unreadable``) and the worker moves on. With the
bound, a 1 GiB gzip bomb peaks at ~0.4 GB instead of 2.3 GB (``bench/compression_bomb.py``).

This overrides aiokafka's private ``PartitionRecords`` and its record modules' codec functions;
``tests/unit/io/test_unreadable.py`` fails when aiokafka changes what it builds on.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cramjam
import numpy as np
from aiokafka.consumer import fetcher
from aiokafka.record import default_records
from aiokafka.record._crecords import default_records as compiled_default_records

from worker.core.records import UnreadableValue
from worker.logs import one_line

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

    def __next__(self) -> Any:
        """A read_committed fetch reads a control batch's marker record with ``next``."""
        return next(self._batch)

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


class TolerantPartitionRecords(fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's partition records with each batch read whole: a batch it cannot read is one
    unreadable record per offset (what :func:`install` puts in every consumer)."""

    def __init__(self, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tp, _WholeBatches(records), *args, **kwargs)


class BatchTooLargeError(ValueError):
    """A batch that decompresses to more than ``KP_MAX_BATCH_BYTES``."""


def _too_large(limit: int) -> BatchTooLargeError:
    return BatchTooLargeError(
        f"the batch decompresses to more than {limit} bytes (KP_MAX_BATCH_BYTES)"
    )


def _bounded_gzip(limit: int) -> Callable[[Any], bytes]:
    def gzip_decode(payload: Any) -> bytes:
        parts: list[bytes] = []
        size = 0
        data = bytes(payload)
        while data:  # gzip members one after another, as gzip.GzipFile reads them
            member = zlib.decompressobj(16 + zlib.MAX_WBITS)
            part = member.decompress(data, limit + 1 - size)
            size += len(part)
            if size > limit:
                raise _too_large(limit)
            if not member.eof:
                raise EOFError("the gzip stream ends before its end marker")
            parts.append(part)
            data = member.unused_data.lstrip(b"\0")  # zero padding after a member
        return b"".join(parts)

    return gzip_decode


def _bounded_cramjam(
    decompress_into: Callable[[Any, Any], int], limit: int
) -> Callable[..., bytes]:
    def decode(payload: Any) -> bytes:
        # Pages of an untouched buffer cost no memory: only what is written is paid for.
        out = np.empty(limit + 1, dtype=np.uint8)
        try:
            size = decompress_into(bytes(payload), out)
        except cramjam.DecompressionError as exc:
            if "whole buffer" in str(exc):
                raise _too_large(limit) from None
            raise
        if size > limit:
            raise _too_large(limit)
        return out[:size].tobytes()

    return decode


def install(max_batch_bytes: int) -> None:
    """Make every aiokafka consumer of this process read batches as this module says."""
    if fetcher.PartitionRecords is not TolerantPartitionRecords:
        fetcher.PartitionRecords = TolerantPartitionRecords
    codecs = {
        "gzip_decode": _bounded_gzip(max_batch_bytes),
        "lz4_decode": _bounded_cramjam(cramjam.lz4.decompress_into, max_batch_bytes),
        "zstd_decode": _bounded_cramjam(cramjam.zstd.decompress_into, max_batch_bytes),
    }
    for module in (default_records, compiled_default_records):
        for name, decode in codecs.items():
            setattr(module, name, decode)


__all__ = ["BatchTooLargeError", "install"]
