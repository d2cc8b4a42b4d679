"""VectorCache: the embeddings novelty is measured against. numpy ring buffer, exact scan.

Time is event time supplied by the caller (milliseconds), never the wall clock, so a replay
at any speed sees the same live entries.

Similarities must be bit-for-bit reproducible whatever the batch shape (a restarted worker
batches differently from a continuous one, and scores may not change). BLAS sums in an order
that depends on matrix shapes, so unit vectors are rounded to a 2**-20 grid (float32 holds
those values exactly). In float64 every product and partial sum of grid values is then an
exact multiple of 2**-40 below 384 (384 * 2**40 < 2**53 units), so the dot product is
exact in any order. The grid costs about 1e-6 of cosine accuracy. Scans first screen all
entries in float32 (fast), then compute exactly the few entries that can be the maximum:
exact at float32 speed, with one float32 copy of the entries for both passes.

Each entry may carry a key (a digest of the text it came from): a later record with the same
text reuses the stored grid row instead of running the model, which gives the same rows and
so the same similarities bit for bit, because a text's vector depends only on the text.

One cache per input partition (:class:`PartitionCaches`): a trace's novelty depends only on
the earlier traces of its own partition, so scoring a batch equals scoring its records one at
a time in offset order, and a worker that rebuilds a partition's cache from the log gets the
same values.

Expiry is applied as a mask at query time rather than by deleting entries: with
out-of-order timestamps a later record may legitimately still see an entry that an
earlier one considered expired, and the mask gives exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from worker.core.scoring import Novelty

FloatArray = npt.NDArray[np.float32]
GridArray = npt.NDArray[np.float64]
_GRID = float(2**20)
_INT64_MIN = -(2**63)
# float32 dot products of 384-dim unit vectors err by at most ~2.3e-5; every entry whose
# screened similarity is within this margin of the best is re-computed exactly.
_SCREEN_MARGIN = 1e-3


class DimensionError(ValueError):
    """A vector's length does not match the cache's dimensions."""


def _unit_rows(vectors: npt.ArrayLike, dimensions: int) -> FloatArray:
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != dimensions:
        raise DimensionError(
            f"expected vectors of {dimensions} dimensions, got shape {tuple(np.shape(vectors))}"
        )
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    # Zero vectors stay zero (similarity 0 to everything) instead of becoming NaN.
    return np.divide(array, norms, out=np.zeros_like(array), where=norms > 0)


def _on_grid(vectors: npt.ArrayLike, dimensions: int) -> FloatArray:
    """Unit rows rounded to the 2**-20 grid (see the module docstring), as float32."""
    unit = _unit_rows(vectors, dimensions).astype(np.float64)
    return (np.rint(unit * _GRID) / _GRID).astype(np.float32)


def _grid_rows(
    vectors: npt.ArrayLike, dimensions: int, stored_rows: Sequence[bool] | None
) -> FloatArray:
    """Vectors on the grid; those flagged in ``stored_rows`` are grid rows already (reused
    from a cache, or read back from the cache store) and are taken as they are."""
    rows = _on_grid(vectors, dimensions)
    if stored_rows is not None and any(stored_rows):
        reused = np.asarray(stored_rows, dtype=bool)
        rows[reused] = np.asarray(vectors, dtype=np.float32)[reused]
    return rows


def is_grid_row(row: npt.NDArray[np.float32], dimensions: int) -> bool:
    """Whether ``row`` can be a stored entry: the cache's dimensions, every value on the grid
    and a unit (or zero) length. What a store read back is checked so before it is used."""
    if row.shape != (dimensions,) or not np.all(np.isfinite(row)):
        return False
    wide = row.astype(np.float64)
    norm = float(np.linalg.norm(wide))
    on_grid = bool(np.array_equal(np.rint(wide * _GRID) / _GRID, wide))
    return on_grid and (norm == 0.0 or abs(norm - 1.0) < _SCREEN_MARGIN)


def _exact_best(
    screened: FloatArray, stored: FloatArray, batch: FloatArray, queries: FloatArray
) -> tuple[GridArray, npt.NDArray[np.bool_]]:
    """Per query (column): the exact max similarity among entries and whether any is live.

    ``screened`` holds float32 similarities (entries x queries, -inf where an entry is not
    live for that query); its rows are the ``stored`` entries followed by the ``batch`` ones.
    """
    top = screened.max(axis=0, initial=-np.inf)
    live = np.isfinite(top)
    candidate = screened >= np.where(live, top - _SCREEN_MARGIN, np.inf)
    entries = np.flatnonzero(candidate.any(axis=1))  # ascending: stored entries first
    in_stored = entries < len(stored)
    rows = np.concatenate([stored[entries[in_stored]], batch[entries[~in_stored] - len(stored)]])
    exact = rows.astype(np.float64) @ queries.astype(np.float64).T
    return np.where(candidate[entries], exact, -np.inf).max(axis=0, initial=-np.inf), live


def _live_from(now_ms: Sequence[int], ttl_ms: int) -> npt.NDArray[np.int64]:
    """Per query time, the oldest event time still live (``now - ttl``; an entry is live iff
    its time is at or after it). Computed on Python integers and floored at int64's minimum:
    the age ``now - time`` of two record timestamps (-1 and 2**63 - 1) overflows int64."""
    return np.array([max(int(now) - ttl_ms, _INT64_MIN) for now in now_ms], dtype=np.int64)


def _as_results(best: GridArray, live: npt.NDArray[np.bool_]) -> list[float | None]:
    return [float(value) if ok else None for value, ok in zip(best, live, strict=True)]


class VectorCache:
    """Up to ``max_elements`` unit vectors with event times; oldest evicted first over capacity."""

    def __init__(
        self, max_elements: int = 1000, dimensions: int = 384, ttl_ms: int | None = None
    ) -> None:
        if max_elements < 1 or dimensions < 1:
            raise ValueError("max_elements and dimensions must be positive")
        if ttl_ms is not None and ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive or None")
        self.max_elements = max_elements
        self.dimensions = dimensions
        self.ttl_ms = ttl_ms
        self._rows = np.zeros((max_elements, dimensions), dtype=np.float32)
        self._times = np.zeros(max_elements, dtype=np.int64)
        self.clear()

    def __len__(self) -> int:
        return self._count  # entries stored, expired or not

    def size(self, now_ms: int | None = None) -> int:
        """Entries live at ``now_ms`` (all stored entries when there is no TTL or no time)."""
        if self.ttl_ms is None or now_ms is None:
            return self._count
        return int((self._times[: self._count] >= _live_from([now_ms], self.ttl_ms)).sum())

    def clear(self) -> None:
        self._count = 0
        self._next = 0  # slot the next add writes
        self._keys: list[bytes | None] = [None] * self.max_elements
        self._slot_of_key: dict[bytes, int] = {}

    def entries(self) -> tuple[FloatArray, npt.NDArray[np.int64], list[bytes | None]]:
        """Rows, event times and keys of the stored entries, oldest first (copies)."""
        order = np.argsort(self._age_rank())
        return self._rows[order], self._times[order], [self._keys[i] for i in order]

    def row_for_key(self, key: bytes) -> FloatArray | None:
        """A copy of the stored (grid) row of an entry added with ``key``, if one is held."""
        slot = self._slot_of_key.get(key)
        return None if slot is None else self._rows[slot].copy()

    def add(self, vector: npt.ArrayLike, event_time_ms: int = 0) -> None:
        self.add_batch(vector, [event_time_ms])

    def add_batch(
        self,
        vectors: npt.ArrayLike,
        event_times_ms: Sequence[int],
        keys: Sequence[bytes | None] | None = None,
        stored_rows: Sequence[bool] | None = None,
    ) -> None:
        """Add in order; rows flagged in ``stored_rows`` are grid rows taken as they are."""
        rows = _grid_rows(vectors, self.dimensions, stored_rows)
        self._add_grid_rows(rows, event_times_ms, keys)

    def _add_grid_rows(
        self,
        rows: FloatArray,
        event_times_ms: Sequence[int],
        keys: Sequence[bytes | None] | None = None,
    ) -> None:
        if len(rows) != len(event_times_ms) or (keys is not None and len(keys) != len(rows)):
            raise ValueError("one event time per vector is required (and one key, if any)")
        rows = rows[-self.max_elements :]
        times = np.asarray(event_times_ms, dtype=np.int64)[-self.max_elements :]
        slots = (self._next + np.arange(len(rows))) % self.max_elements
        self._rows[slots] = rows
        self._times[slots] = times
        kept_keys = [None] * len(rows) if keys is None else list(keys)[-self.max_elements :]
        for slot, key in zip(slots.tolist(), kept_keys, strict=True):
            old = self._keys[slot]
            if old is not None and self._slot_of_key.get(old) == slot:
                del self._slot_of_key[old]
            self._keys[slot] = key
            if key is not None:
                self._slot_of_key[key] = slot
        self._next = int((self._next + len(rows)) % self.max_elements)
        self._count = min(self._count + len(rows), self.max_elements)

    def _age_rank(self) -> npt.NDArray[np.int64]:
        """Per stored slot: 0 for the oldest entry ... count-1 for the newest."""
        slots = np.arange(self._count)
        if self._count < self.max_elements:
            return slots
        return (slots - self._next) % self.max_elements

    def max_cosine_similarity(
        self, query: npt.ArrayLike, now_ms: int | None = None
    ) -> float | None:
        """Highest cosine similarity to a live entry, or None when nothing is live."""
        return self.max_cosine_similarity_batch(query, None if now_ms is None else [now_ms])[0]

    def max_cosine_similarity_batch(
        self, queries: npt.ArrayLike, now_ms: Sequence[int] | None = None
    ) -> list[float | None]:
        """Independent queries against the current entries (nothing is added)."""
        rows = _on_grid(queries, self.dimensions)
        if self._count == 0:
            return [None] * len(rows)
        stored = self._rows[: self._count]
        screened = stored @ rows.T  # [entries, queries]
        if self.ttl_ms is not None and now_ms is not None:
            live_from = _live_from(now_ms, self.ttl_ms)
            expired = self._times[: self._count][:, None] < live_from[None, :]
            screened[expired] = -np.inf
        return _as_results(*_exact_best(screened, stored, rows[:0], rows))

    def query_then_add_batch(
        self,
        vectors: npt.ArrayLike,
        event_times_ms: Sequence[int],
        keys: Sequence[bytes | None] | None = None,
        stored_rows: Sequence[bool] | None = None,
    ) -> list[float | None]:
        """For each vector in order: max similarity to what is live, then add it.

        Equal to calling ``max_cosine_similarity`` then ``add`` one vector at a time,
        including capacity eviction caused by the earlier vectors of the same batch,
        but with two matrix products and one exact pass instead of a scan per vector.
        Rows flagged in ``stored_rows`` came from :meth:`row_for_key` and are used as they are.
        """
        rows = _grid_rows(vectors, self.dimensions, stored_rows)
        count = len(rows)
        if count != len(event_times_ms):
            raise ValueError("one event time per vector is required")
        times = np.asarray(event_times_ms, dtype=np.int64)
        n = self._count
        held_rows, held_times = self._rows[:n], self._times[:n]
        position = np.arange(count)
        # The stored entry of age rank k (0 = oldest) is still held when vector i is
        # queried iff fewer than capacity entries came after it: k >= n + i - capacity.
        held = self._age_rank()[:, None] >= (n + position - self.max_elements)[None, :]
        earlier = position[:, None] < position[None, :]  # batch entry j precedes i
        earlier &= position[:, None] >= (position - self.max_elements)[None, :]
        if self.ttl_ms is not None:
            live_from = _live_from(event_times_ms, self.ttl_ms)[None, :]
            held &= held_times[:, None] >= live_from
            earlier &= times[:, None] >= live_from
        screened = np.concatenate([held_rows @ rows.T, rows @ rows.T])  # [entries, queries]
        screened[~np.concatenate([held, earlier])] = -np.inf
        results = _as_results(*_exact_best(screened, held_rows, rows, rows))
        self._add_grid_rows(rows, times.tolist(), keys)
        return results


TopicPartition = tuple[str, int]


@dataclass(eq=False)
class PartitionCaches:
    """The caches of the partitions this worker currently owns."""

    capacity: int = 1000
    dimensions: int = 384
    ttl_ms: int | None = None
    _caches: dict[TopicPartition, VectorCache] = field(default_factory=dict, init=False)

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
        stored_rows: Sequence[bool] | None = None,
    ) -> None:
        """Fill a partition's cache from its log without scoring (rebuild on takeover)."""
        self.get(partition).add_batch(embeddings, event_times_ms, text_keys, stored_rows)
