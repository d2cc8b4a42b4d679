"""Novelty per input partition: one VectorCache per (topic, partition), event-time TTL.

A trace's novelty depends only on the earlier traces of its own partition, so scoring a batch
equals scoring its records one at a time in offset order (the cache does the exact batch
arithmetic), and a worker that rebuilds a partition's cache from the log gets the same values.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np
import numpy.typing as npt

from worker.cache import VectorCache
from worker.scoring import Novelty

TopicPartition = tuple[str, int]


class Embedder(Protocol):
    model_id: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...

    def submit(self, texts: Sequence[str]) -> Future[npt.NDArray[np.float32]]:
        """``embed`` started in the background (on the embedder's own threads)."""
        ...


class PartitionCaches:
    """The caches of the partitions this worker currently owns."""

    def __init__(self, capacity: int = 1000, dimensions: int = 384, ttl_ms: int | None = None):
        self.capacity = capacity
        self.dimensions = dimensions
        self.ttl_ms = ttl_ms
        self._caches: dict[TopicPartition, VectorCache] = {}

    def __contains__(self, partition: TopicPartition) -> bool:
        return partition in self._caches

    def get(self, partition: TopicPartition) -> VectorCache:
        cache = self._caches.get(partition)
        if cache is None:
            cache = self._caches[partition] = VectorCache(
                self.capacity, self.dimensions, self.ttl_ms
            )
        return cache

    def drop(self, partition: TopicPartition) -> None:
        self._caches.pop(partition, None)

    def partitions(self) -> list[TopicPartition]:
        return list(self._caches)

    def sizes(self) -> dict[TopicPartition, int]:
        return {tp: len(cache) for tp, cache in self._caches.items()}

    def row_for_text(self, partition: TopicPartition, key: bytes) -> npt.NDArray[np.float32] | None:
        """The stored row of an earlier identical text of this partition, if still held."""
        cache = self._caches.get(partition)
        return None if cache is None else cache.row_for_key(key)

    def novelty_batch(
        self,
        partition: TopicPartition,
        embeddings: npt.NDArray[np.float32],
        event_times_ms: Sequence[int],
        text_keys: Sequence[bytes | None] | None = None,
        stored_rows: Sequence[bool] | None = None,
    ) -> list[Novelty]:
        """Novelty of consecutive records of one partition, in offset order; adds them after.

        Rows flagged in ``stored_rows`` are rows reused from :meth:`row_for_text`.
        """
        similarities = self.get(partition).query_then_add_batch(
            embeddings, event_times_ms, text_keys, stored_rows
        )
        return [
            Novelty.empty_cache() if similarity is None else Novelty.from_similarity(similarity)
            for similarity in similarities
        ]

    def warm(
        self,
        partition: TopicPartition,
        embeddings: npt.NDArray[np.float32],
        event_times_ms: Sequence[int],
        text_keys: Sequence[bytes | None] | None = None,
    ) -> None:
        """Fill a partition's cache from its log without scoring (rebuild on takeover)."""
        self.get(partition).add_batch(embeddings, event_times_ms, text_keys)
