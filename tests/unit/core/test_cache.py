"""VectorCache and PartitionCaches: eviction, event-time TTL, exactness, batch == sequential."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from worker.core.cache import DimensionError, PartitionCaches, VectorCache
from worker.core.scoring import NoveltySource

DIMS = 4


def basis(i: int, dims: int = DIMS) -> npt.NDArray[np.float32]:
    vector = np.zeros(dims, dtype=np.float32)
    vector[i] = 1.0
    return vector


E0, E1, E2, E3 = (basis(i) for i in range(DIMS))


# --- basics -------------------------------------------------------------------------------


def test_empty_cache_has_no_similarity() -> None:
    cache = VectorCache(10, DIMS)
    assert cache.max_cosine_similarity(E0) is None
    assert cache.max_cosine_similarity_batch(np.stack([E0, E1])) == [None, None]
    assert len(cache) == 0
    assert cache.size() == 0


def test_cosine_similarity_values() -> None:
    cache = VectorCache(10, DIMS)
    cache.add(E0 * 7.5)  # scale does not matter
    assert cache.max_cosine_similarity(E0) == 1.0
    assert cache.max_cosine_similarity(-E0) == -1.0
    assert cache.max_cosine_similarity(E1) == 0.0
    assert cache.max_cosine_similarity(np.array([1, 1, 0, 0])) == pytest.approx(
        1 / math.sqrt(2), abs=1e-5
    )
    cache.add(np.array([0.0, 1.0, 1.0, 0.0]))
    # the maximum over all entries
    assert cache.max_cosine_similarity(np.array([0, 1, 1, 0])) == pytest.approx(1.0, abs=1e-5)
    assert cache.max_cosine_similarity(np.array([1, 1, 0, 0])) == pytest.approx(
        1 / math.sqrt(2), abs=1e-5
    )
    assert cache.max_cosine_similarity(np.array([1.0, 1.0, 1.0, 0.0])) == pytest.approx(
        2 / math.sqrt(6), abs=1e-5
    )


def test_default_shape_is_1000_by_384() -> None:
    cache = VectorCache()
    assert cache.max_elements == 1000
    assert cache.dimensions == 384
    assert cache.ttl_ms is None
    rng = np.random.default_rng(1)
    vector = rng.standard_normal(384).astype(np.float32)
    cache.add(vector)
    similarity = cache.max_cosine_similarity(vector)
    assert similarity == pytest.approx(1.0, abs=1e-5)


def test_zero_vector_gives_similarity_zero_not_nan() -> None:
    cache = VectorCache(10, DIMS)
    cache.add(np.zeros(DIMS))
    similarity = cache.max_cosine_similarity(E0)
    assert similarity == 0.0
    assert similarity is not None and not math.isnan(similarity)
    cache.clear()
    cache.add(E2)
    assert cache.max_cosine_similarity(np.zeros(DIMS)) == 0.0
    assert cache.query_then_add_batch(np.zeros((2, DIMS)), [0, 0]) == [0.0, 0.0]


@pytest.mark.parametrize(
    "vector",
    [np.zeros(3), np.zeros(5), np.zeros((1, 3)), np.zeros((2, 2, DIMS)), np.zeros(0)],
)
def test_dimension_error_on_add(vector: npt.NDArray[np.float64]) -> None:
    cache = VectorCache(10, DIMS)
    with pytest.raises(DimensionError) as excinfo:
        cache.add(vector)
    message = str(excinfo.value)
    assert f"expected vectors of {DIMS} dimensions" in message
    assert str(tuple(vector.shape)) in message
    assert len(cache) == 0


def test_dimension_error_on_add_batch_and_queries() -> None:
    cache = VectorCache(10, DIMS)
    cache.add(E0)
    with pytest.raises(
        DimensionError, match=r"expected vectors of 4 dimensions, got shape \(2, 3\)"
    ):
        cache.add_batch(np.zeros((2, 3)), [0, 0])
    with pytest.raises(DimensionError, match=r"got shape \(384,\)"):
        cache.max_cosine_similarity(np.zeros(384))
    with pytest.raises(DimensionError, match=r"got shape \(1, 5\)"):
        cache.max_cosine_similarity_batch(np.zeros((1, 5)))
    with pytest.raises(DimensionError):
        cache.query_then_add_batch(np.zeros((3, 2)), [0, 0, 0])
    assert len(cache) == 1
    assert issubclass(DimensionError, ValueError)


def test_event_times_must_match_vectors() -> None:
    cache = VectorCache(10, DIMS)
    with pytest.raises(ValueError, match="one event time per vector"):
        cache.add_batch(np.stack([E0, E1]), [0])
    with pytest.raises(ValueError, match="one event time per vector"):
        cache.query_then_add_batch(np.stack([E0, E1]), [0, 1, 2])
    assert len(cache) == 0


@pytest.mark.parametrize(
    ("kwargs"),
    [{"max_elements": 0}, {"dimensions": 0}, {"ttl_ms": 0}, {"ttl_ms": -5}],
)
def test_constructor_validation(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        VectorCache(**kwargs)


def test_size_len_and_clear() -> None:
    cache = VectorCache(3, DIMS, ttl_ms=100)
    cache.add(E0, 0)
    cache.add(E1, 50)
    assert len(cache) == 2
    assert cache.size() == 2  # no time given: everything stored counts
    assert cache.size(now_ms=120) == 1  # E0 expired (120 - 0 > 100)
    assert cache.size(now_ms=151) == 0
    assert len(cache) == 2  # expiry is a mask, not a deletion
    cache.clear()
    assert len(cache) == 0
    assert cache.size() == 0
    assert cache.max_cosine_similarity(E0) is None
    cache.add(E3, 10)
    assert len(cache) == 1
    assert cache.max_cosine_similarity(E3, now_ms=10) == 1.0
    assert cache.max_cosine_similarity(E0, now_ms=10) == 0.0


# --- eviction -----------------------------------------------------------------------------


def test_fifo_eviction_over_capacity() -> None:
    cache = VectorCache(3, DIMS)
    for vector in (E0, E1, E2):
        cache.add(vector)
    assert len(cache) == 3
    assert cache.max_cosine_similarity(E0) == 1.0
    cache.add(E3)  # evicts E0, the oldest
    assert len(cache) == 3
    assert cache.max_cosine_similarity(E0) == 0.0
    for vector in (E1, E2, E3):
        assert cache.max_cosine_similarity(vector) == 1.0
    cache.add(E0)  # evicts E1
    assert cache.max_cosine_similarity(E1) == 0.0
    assert cache.max_cosine_similarity(E0) == 1.0


def test_eviction_follows_insertion_order_not_timestamps() -> None:
    cache = VectorCache(2, DIMS)
    cache.add(E0, 500)
    cache.add(E1, 100)
    cache.add(E2, 300)  # evicts E0 (first in) although E1 has the older timestamp
    assert cache.max_cosine_similarity(E0) == 0.0
    assert cache.max_cosine_similarity(E1) == 1.0


def test_add_batch_larger_than_capacity_keeps_the_last() -> None:
    cache = VectorCache(2, DIMS)
    cache.add_batch(np.stack([E0, E1, E2, E3]), [1, 2, 3, 4])
    assert len(cache) == 2
    assert cache.max_cosine_similarity(E0) == 0.0
    assert cache.max_cosine_similarity(E1) == 0.0
    assert cache.max_cosine_similarity(E2) == 1.0
    assert cache.max_cosine_similarity(E3) == 1.0


def test_capacity_one() -> None:
    cache = VectorCache(1, DIMS)
    assert cache.query_then_add_batch(np.stack([E0, E0, E1, E0]), [0, 1, 2, 3]) == [
        None,
        1.0,
        0.0,
        0.0,
    ]
    assert len(cache) == 1
    assert cache.max_cosine_similarity(E0) == 1.0


# --- TTL (event time) ---------------------------------------------------------------------


def test_ttl_boundary_exactly_ttl_old_is_live() -> None:
    cache = VectorCache(10, DIMS, ttl_ms=100)
    cache.add(E0, 1000)
    assert cache.max_cosine_similarity(E0, now_ms=1000) == 1.0
    assert cache.max_cosine_similarity(E0, now_ms=1100) == 1.0  # exactly ttl old: live
    assert cache.max_cosine_similarity(E0, now_ms=1101) is None  # ttl + 1: expired
    assert cache.size(1100) == 1
    assert cache.size(1101) == 0
    # without a query time nothing expires
    assert cache.max_cosine_similarity(E0) == 1.0


def test_ttl_boundary_in_batch_queries() -> None:
    cache = VectorCache(10, DIMS, ttl_ms=100)
    cache.add(E0, 1000)
    queries = np.stack([E0, E0, E0])
    assert cache.max_cosine_similarity_batch(queries, [1100, 1101, 900]) == [1.0, None, 1.0]
    # inside one query_then_add batch: the boundary holds between batch entries too
    fresh = VectorCache(10, DIMS, ttl_ms=100)
    assert fresh.query_then_add_batch(np.stack([E1, E1, E1]), [0, 100, 200]) == [None, 1.0, 1.0]
    late = VectorCache(10, DIMS, ttl_ms=100)
    assert late.query_then_add_batch(np.stack([E1, E1, E1]), [0, 100, 201]) == [None, 1.0, None]
    other = VectorCache(10, DIMS, ttl_ms=100)
    assert other.query_then_add_batch(np.stack([E1, E2, E1]), [0, 50, 101]) == [None, 0.0, 0.0]


def test_a_batch_sees_stored_entries_up_to_their_ttl_and_capacity_boundaries() -> None:
    """The live path (query_then_add_batch) against entries stored before the batch: an
    entry exactly TTL old is live and one millisecond older is not; a full cache still
    holds its oldest entry for the first query, and the batch's own first add evicts it."""
    on_time = VectorCache(10, DIMS, ttl_ms=100)
    on_time.add(E0, 1000)
    assert on_time.query_then_add_batch(np.stack([E0]), [1100]) == [1.0]
    late = VectorCache(10, DIMS, ttl_ms=100)
    late.add(E0, 1000)
    assert late.query_then_add_batch(np.stack([E0]), [1101]) == [None]

    full = VectorCache(2, DIMS)
    full.add_batch(np.stack([E0, E1]), [0, 1])
    assert full.query_then_add_batch(np.stack([E0]), [2]) == [1.0]
    full = VectorCache(2, DIMS)
    full.add_batch(np.stack([E0, E1]), [0, 1])
    assert full.query_then_add_batch(np.stack([E2, E0]), [2, 3]) == [0.0, 0.0]


def test_only_expired_entries_means_none() -> None:
    cache = VectorCache(10, DIMS, ttl_ms=10)
    cache.add_batch(np.stack([E0, E1]), [0, 5])
    assert cache.max_cosine_similarity(E0, now_ms=16) is None
    assert cache.max_cosine_similarity(E1, now_ms=15) == 1.0


def test_out_of_order_timestamps() -> None:
    cache = VectorCache(10, DIMS, ttl_ms=100)
    cache.add(E0, 0)
    # a later query sees E0 expired ...
    assert cache.max_cosine_similarity(E0, now_ms=200) is None
    # ... but an out-of-order earlier record still sees it: expiry is a mask, not a deletion
    assert cache.max_cosine_similarity(E0, now_ms=50) == 1.0
    # an entry from the "future" is live for an earlier query (it came earlier in the log)
    cache.add(E1, 5000)
    assert cache.max_cosine_similarity(E1, now_ms=60) == 1.0
    assert cache.max_cosine_similarity(E0, now_ms=60) == 1.0
    assert cache.size(now_ms=60) == 2
    assert cache.size(now_ms=5050) == 1


def test_ttl_applies_to_stored_and_batch_entries_with_mixed_order() -> None:
    cache = VectorCache(10, DIMS, ttl_ms=100)
    cache.add(E0, 1000)
    result = cache.query_then_add_batch(np.stack([E0, E0, E1, E1]), [1200, 1050, 1300, 1150])
    # E0@1200: stored E0 is 200 old -> None.  E0@1050: stored E0 live and E0@1200 in the
    # future -> 1.0.  E1@1300: nothing similar -> max(0, ...) = 0.0 (E0@1200 live).
    # E1@1150: E1@1300 is live (future) -> 1.0.
    assert result == [None, 1.0, 0.0, 1.0]


# --- batch == sequential, exactly ---------------------------------------------------------


def sequential(
    cache: VectorCache, vectors: npt.NDArray[np.float32], times: list[int]
) -> list[float | None]:
    out = []
    for vector, when in zip(vectors, times, strict=True):
        out.append(cache.max_cosine_similarity(vector, now_ms=when))
        cache.add(vector, when)
    return out


def random_vectors(rng: np.random.Generator, count: int, dims: int) -> npt.NDArray[np.float32]:
    vectors = rng.standard_normal((count, dims)).astype(np.float32)
    for i in range(count):  # duplicates, scaled copies and zero vectors
        roll = rng.random()
        if roll < 0.15 and i:
            vectors[i] = vectors[rng.integers(0, i)]
        elif roll < 0.2 and i:
            vectors[i] = vectors[rng.integers(0, i)] * np.float32(rng.uniform(0.1, 10))
        elif roll < 0.23:
            vectors[i] = 0
    return vectors


@pytest.mark.parametrize("seed", range(6))
def test_query_then_add_batch_equals_sequential(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(60):
        dims = int(rng.choice([3, 8, 384]))
        capacity = int(rng.integers(1, 12))
        ttl = None if rng.random() < 0.3 else int(rng.integers(1, 60))
        prefill = int(rng.integers(0, 25))
        batch = int(rng.integers(1, 30))  # often larger than capacity
        vectors = random_vectors(rng, prefill + batch, dims)
        times = [int(t) for t in rng.integers(0, 100, size=prefill + batch)]

        batched = VectorCache(capacity, dims, ttl)
        one_by_one = VectorCache(capacity, dims, ttl)
        if prefill:
            batched.add_batch(vectors[:prefill], times[:prefill])
            for vector, when in zip(vectors[:prefill], times[:prefill], strict=True):
                one_by_one.add(vector, when)

        got = batched.query_then_add_batch(vectors[prefill:], times[prefill:])
        expected = sequential(one_by_one, vectors[prefill:], times[prefill:])
        assert got == expected  # exact, not approximate
        assert len(batched) == len(one_by_one) == min(capacity, prefill + batch)

        # and the two caches now hold the same entries
        probes = random_vectors(rng, 5, dims)
        probe_times = [int(t) for t in rng.integers(0, 120, size=5)]
        assert batched.max_cosine_similarity_batch(probes, probe_times) == [
            one_by_one.max_cosine_similarity(p, now_ms=t)
            for p, t in zip(probes, probe_times, strict=True)
        ]


def test_batch_query_equals_single_queries_exactly() -> None:
    rng = np.random.default_rng(42)
    cache = VectorCache(50, 384, ttl_ms=500)
    stored = random_vectors(rng, 80, 384)
    cache.add_batch(stored, [int(t) for t in rng.integers(0, 1000, size=80)])
    queries = np.concatenate([stored[-10:], random_vectors(rng, 30, 384)])
    times = [int(t) for t in rng.integers(0, 1600, size=len(queries))]
    batch = cache.max_cosine_similarity_batch(queries, times)
    singles = [
        cache.max_cosine_similarity(q, now_ms=t) for q, t in zip(queries, times, strict=True)
    ]
    assert batch == singles
    # sub-batches of any shape agree too
    assert cache.max_cosine_similarity_batch(queries[3:17], times[3:17]) == singles[3:17]


def test_stored_duplicate_is_exactly_one_whatever_the_batch() -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((16, 384)).astype(np.float32)
    cache = VectorCache(100, 384)
    cache.add_batch(vectors, [0] * 16)
    own = cache.max_cosine_similarity_batch(vectors)
    assert own == [cache.max_cosine_similarity(v) for v in vectors]
    assert all(abs(value - 1.0) < 1e-5 for value in own if value is not None)


# --- PartitionCaches ----------------------------------------------------------------------


def test_partition_caches_are_isolated() -> None:
    caches = PartitionCaches(capacity=10, dimensions=DIMS)
    first = caches.novelty_batch(("t", 0), np.stack([E0, E0, E1]), [0, 1, 2])
    assert [n.source for n in first] == [
        NoveltySource.EMPTY_CACHE,
        NoveltySource.EMBEDDING,
        NoveltySource.EMBEDDING,
    ]
    assert first[0].value == 0.5
    assert first[1].value == 0.0  # exact duplicate
    assert first[2].value == 1.0  # orthogonal
    # same vector, other partition: its cache is empty
    other = caches.novelty_batch(("t", 1), np.stack([E0]), [3])
    assert other[0].source is NoveltySource.EMPTY_CACHE
    # same partition number, other topic: isolated as well
    assert caches.novelty_batch(("u", 0), np.stack([E0]), [3])[0].source is (
        NoveltySource.EMPTY_CACHE
    )
    assert caches.sizes() == {("t", 0): 3, ("t", 1): 1, ("u", 0): 1}
    assert set(caches.partitions()) == {("t", 0), ("t", 1), ("u", 0)}
    assert ("t", 1) in caches
    caches.drop(("t", 1))
    assert ("t", 1) not in caches
    caches.drop(("t", 1))  # dropping twice is harmless
    assert caches.novelty_batch(("t", 1), np.stack([E0]), [4])[0].source is (
        NoveltySource.EMPTY_CACHE
    )


def test_partition_caches_use_their_settings() -> None:
    caches = PartitionCaches(capacity=2, dimensions=DIMS, ttl_ms=10)
    cache = caches.get(("t", 0))
    assert (cache.max_elements, cache.dimensions, cache.ttl_ms) == (2, DIMS, 10)
    assert caches.get(("t", 0)) is cache
    values = caches.novelty_batch(("t", 0), np.stack([E0, E0, E0]), [0, 10, 20])
    assert [v.value for v in values] == [0.5, 0.0, 0.0]
    assert values[2].source is NoveltySource.EMBEDDING  # E0@10 is exactly ttl old at 20
    assert len(cache) == 2  # capacity 2: E0@0 was evicted
    expired = caches.novelty_batch(("t", 0), np.stack([E0]), [100])
    assert expired[0].source is NoveltySource.EMPTY_CACHE


def test_partition_warm_fills_without_scoring() -> None:
    caches = PartitionCaches(capacity=10, dimensions=DIMS)
    caches.warm(("t", 2), np.stack([E0, E1]), [0, 0])
    assert caches.sizes() == {("t", 2): 2}
    values = caches.novelty_batch(("t", 2), np.stack([E1, E2]), [1, 1])
    assert [v.value for v in values] == [0.0, 1.0]
    assert caches.sizes() == {("t", 2): 4}


# Kafka record timestamps span int64: -1 (none) up to 2**63 - 1, which a producer may set.
LATEST_MS = 2**63 - 1


def test_ttl_compares_the_farthest_timestamps_without_overflow() -> None:
    """``now - time`` of -1 and 2**63 - 1 wrapped around int64 to a negative age, so an entry
    2**63 ms old was live, in every query path."""
    cache = VectorCache(10, DIMS, ttl_ms=100)
    cache.add(E0, -1)
    assert cache.max_cosine_similarity(E0, now_ms=LATEST_MS) is None
    assert cache.max_cosine_similarity_batch(np.stack([E0]), [LATEST_MS]) == [None]
    assert cache.size(LATEST_MS) == 0
    assert cache.query_then_add_batch(np.stack([E0]), [LATEST_MS]) == [None]
    fresh = VectorCache(10, DIMS, ttl_ms=100)
    assert fresh.query_then_add_batch(np.stack([E0, E0]), [-1, LATEST_MS]) == [None, None]
    # the other way round the entry is from the future: live, as any out-of-order one is
    future = VectorCache(10, DIMS, ttl_ms=100)
    assert future.query_then_add_batch(np.stack([E0, E0]), [LATEST_MS, -1]) == [None, 1.0]
