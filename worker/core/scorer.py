"""A batch of source records -> routed outputs (accepted / rejected / dead-letter). No Kafka.

Data flows one way: bytes -> trace -> embedding -> novelty -> score -> route. The stream
pipeline (the worker's and replay's) calls its steps one record at a time (``prepare``,
``finish``), the offline scorer and the Python API ``Scorer.score_batch``; only what they read
from and write to differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from time import perf_counter

import numpy as np

from worker.core.cache import PartitionCaches
from worker.core.cache_store import embedder_tag, entry, stored_rows
from worker.core.errors import (
    OutputTooLargeError,
    TraceError,
    UnreadableRecordError,
)
from worker.core.failures import FailurePolicy
from worker.core.output import DEFAULT_MAX_OUTPUT_BYTES, dead_letter, scored
from worker.core.records import (
    OTHER_DOMAIN,
    Decision,
    RoutedRecord,
    SourceRecord,
    UnreadableValue,
)
from worker.core.scoring import Novelty, ProfileSet, load_profiles, score_trace
from worker.core.trace import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CONTAINERS,
    Framing,
    Trace,
    parse_trace,
)
from worker.embedding import Embedder
from worker.embedding.protocol import RunTiming
from worker.settings import Settings


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Accept threshold, with per-domain overrides (KP_ACCEPT_THRESHOLD, KP_DOMAIN_THRESHOLDS)."""

    default: float = 0.75
    per_domain: Mapping[str, float] = field(default_factory=dict)

    def for_domain(self, domain: str) -> float:
        return self.per_domain.get(domain, self.default)


@dataclass(frozen=True, slots=True)
class BatchResult:
    routed: list[RoutedRecord]
    embedded: int  # valid traces, i.e. vectors used (model runs + reused)
    reused: int = 0  # vectors taken from an identical earlier text instead of the model


@dataclass(slots=True)
class Prepared:
    """A decoded record on its way to novelty: the trace (or why not) and, once known, its
    vector. ``stored_row`` marks a vector reused from the partition's cache as stored there."""

    record: SourceRecord
    item: Trace | TraceError
    text: str | None = None
    text_key: bytes | None = None
    vector: np.ndarray | None = None
    stored_row: bool = False

    @property
    def needs_vector(self) -> bool:
        return self.text_key is not None and self.vector is None


def text_key(text: str) -> bytes:
    """A digest of the embedding text: equal texts have equal vectors, so it keys reuse."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(eq=False)
class Scorer:
    """Everything needed to score records: profiles, thresholds, caches and an embedder."""

    profiles: ProfileSet
    thresholds: Thresholds
    caches: PartitionCaches
    embedder: Embedder | None
    max_message_bytes: int = DEFAULT_MAX_BYTES
    embedder_reason: str | None = None
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_json_containers: int = DEFAULT_MAX_CONTAINERS
    failures: FailurePolicy = field(default_factory=FailurePolicy)
    framing: Framing = "auto"

    @property
    def model_id(self) -> str | None:
        return self.embedder.model_id if self.embedder else None

    @cached_property
    def store_tag(self) -> bytes | None:
        """This embedder's tag in the cache store (None without a model: nothing is stored)."""
        return embedder_tag(self.embedder.identity) if self.embedder else None

    def with_cache_entry(self, routed: RoutedRecord, prepared: Prepared) -> RoutedRecord:
        """``routed`` carrying the cache entry its trace added (the row as the cache holds it),
        if it added one."""
        tp, key = prepared.record.topic_partition, prepared.text_key
        row = None if key is None else self.caches.row_for_text(tp, key)
        if row is None or key is None or self.store_tag is None:
            return routed
        return dataclasses.replace(routed, cache_entry=entry(self.store_tag, key, row))

    def stored_rows(self, records: Sequence[SourceRecord]) -> dict[bytes, np.ndarray]:
        """This embedder's sound rows among records read from the cache store, by text key."""
        if self.store_tag is None:
            return {}
        return stored_rows(records, self.store_tag, self.caches.dimensions)

    # -- the stream's door to the embedder and the caches ------------------------------------
    @property
    def has_embedder(self) -> bool:
        """Without a model novelty is 0.5 and no cache is kept."""
        return self.embedder is not None

    def submit_embedding(self, text: str, timing: RunTiming | None = None) -> Future[np.ndarray]:
        """One text's vector (a 1-row matrix) from one of the model's threads, for the stream."""
        assert self.embedder is not None  # only a scorer with a model prepares texts
        return self.embedder.submit([text], timing)

    def close(self) -> None:
        """Stop the model's threads."""
        if self.embedder is not None:
            self.embedder.close()

    @property
    def cache_capacity(self) -> int:
        return self.caches.capacity

    def cache_size(self, partition: tuple[str, int]) -> int | None:
        """None while the partition has no cache (revoked, not started)."""
        return self.caches.sizes().get(partition)

    def drop_partition(self, partition: tuple[str, int]) -> None:
        """Revoked: the cache is rebuilt before the partition's next record is scored."""
        self.caches.drop(partition)

    def domain_label(self, domain: str | None) -> str:
        """Bounded metric label: a configured profile name, or ``other``."""
        return domain if domain in self.profiles.names else OTHER_DOMAIN

    def decode(self, record: SourceRecord) -> Trace | TraceError:
        if isinstance(record.value, UnreadableValue):
            return UnreadableRecordError(record.value.reason)
        try:
            return parse_trace(
                record.value, self.max_message_bytes, self.max_json_containers, self.framing
            )
        except TraceError as error:
            return error

    def prepare(self, records: Sequence[SourceRecord]) -> list[Prepared]:
        """Decode each record and, for valid traces, its embedding text and that text's key."""
        return [self._prepared(record, self.decode(record)) for record in records]

    def _prepared(self, record: SourceRecord, item: Trace | TraceError) -> Prepared:
        if not isinstance(item, Trace) or self.embedder is None:
            return Prepared(record, item)
        text = item.embedding_text()
        return Prepared(record, item, text, text_key(text))

    def reuse_stored(self, prepared: Prepared) -> bool:
        """Take the vector of an identical earlier text still in the partition's cache."""
        if not prepared.needs_vector:
            return False
        assert prepared.text_key is not None
        row = self.caches.row_for_text(prepared.record.topic_partition, prepared.text_key)
        if row is None:
            return False
        prepared.vector, prepared.stored_row = row, True
        return True

    def embed_missing(
        self, prepared: Sequence[Prepared], *, from_cache: bool = True
    ) -> tuple[int, int]:
        """Vectors for every prepared trace: reused where the text was seen, else from the
        model (each distinct text once). Returns (model runs, reused)."""
        reused = sum(self.reuse_stored(item) for item in prepared) if from_cache else 0
        missing: dict[bytes, list[Prepared]] = {}
        for item in prepared:
            if item.needs_vector:
                assert item.text_key is not None
                missing.setdefault(item.text_key, []).append(item)
        if not missing:
            return 0, reused
        groups = list(missing.values())
        assert self.embedder is not None  # only a scorer with a model prepares texts
        vectors = self.embedder.embed([group[0].text or "" for group in groups])
        for group, vector in zip(groups, vectors, strict=True):
            for item in group:
                item.vector = vector
            reused += len(group) - 1
        return len(groups), reused

    def finish(self, prepared: Sequence[Prepared]) -> tuple[list[RoutedRecord], float, float]:
        """Novelty in offset order per partition (updating the caches), then routing.

        Returns the routed records and the seconds spent on novelty and on scoring.
        """
        started = perf_counter()
        novelty: dict[int, Novelty] = {}
        by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, item in enumerate(prepared):
            if isinstance(item.item, Trace):
                if item.vector is None:
                    novelty[i] = Novelty.unavailable()
                else:
                    by_partition[item.record.topic_partition].append(i)
        for partition, rows in by_partition.items():
            values = self.caches.novelty_batch(
                partition,
                np.stack([prepared[i].vector for i in rows]),  # type: ignore[misc]
                [prepared[i].record.timestamp_ms for i in rows],
                [prepared[i].text_key for i in rows],
                [prepared[i].stored_row for i in rows],
            )
            novelty.update(zip(rows, values, strict=True))
        novelty_seconds = perf_counter() - started
        started = perf_counter()
        routed = [
            self._route(item.record, item.item, novelty.get(i)) for i, item in enumerate(prepared)
        ]
        return routed, novelty_seconds, perf_counter() - started

    def score_batch(self, records: Sequence[SourceRecord]) -> BatchResult:
        """Score records (any partitions, each partition's records in offset order)."""
        prepared = self.prepare(records)
        _, reused = self.embed_missing(prepared)
        routed, _, _ = self.finish(prepared)
        valid = sum(isinstance(item.item, Trace) for item in prepared)
        return BatchResult(routed=routed, embedded=valid, reused=reused)

    def _route(
        self, record: SourceRecord, item: Trace | TraceError, novelty: Novelty | None
    ) -> RoutedRecord:
        if isinstance(item, TraceError):
            return dead_letter(record, item)
        try:
            assert novelty is not None
            breakdown = score_trace(item, novelty, self.profiles)
            threshold = self.thresholds.for_domain(item.domain)
            decision = Decision.of(breakdown.score, threshold)
            routed = scored(
                record,
                item,
                breakdown,
                threshold,
                decision,
                self.domain_label(item.domain),
                self.model_id,
            )
        except Exception as exc:  # a bug must not lose the record: the policy decides
            return self.failures.scoring_failed(record, exc)
        size = len(routed.value or b"")
        if size > self.max_output_bytes:
            return dead_letter(
                record,
                OutputTooLargeError(
                    f"scored output would be {size} bytes, over the "
                    f"{self.max_output_bytes}-byte publish limit (KP_MAX_OUTPUT_BYTES)"
                ),
            )
        return routed

    def valid_traces(self, records: Sequence[SourceRecord]) -> list[tuple[SourceRecord, Trace]]:
        """The records that were scored (not dead-lettered), with their traces."""
        return [(r, t) for r in records if isinstance(t := self.decode(r), Trace)]

    def warm_partition(
        self,
        partition: tuple[str, int],
        traces: Sequence[tuple[SourceRecord, Trace]],
        stored: Mapping[bytes, np.ndarray] | None = None,
    ) -> tuple[int, int]:
        """Rebuild a cache from already-scored traces, oldest first; publishes nothing.

        A trace whose text has a row in ``stored`` (read from the cache store) takes it; every
        other is embedded, even one expired for the next record: expiry is a mask at query
        time, and a later record with an older timestamp sees it live, as it did in the live
        run. Returns (rows restored from ``stored``, traces embedded).
        """
        if self.embedder is None or not traces:
            return 0, 0
        prepared = [self._prepared(record, trace) for record, trace in traces]
        for item in prepared:
            row = (stored or {}).get(item.text_key or b"")
            if row is not None:
                item.vector, item.stored_row = row, True
        self.embed_missing(prepared, from_cache=False)
        self.caches.warm(
            partition,
            np.stack([item.vector for item in prepared]),  # type: ignore[misc]
            [record.timestamp_ms for record, _ in traces],
            [item.text_key for item in prepared],
            [item.stored_row for item in prepared],
        )
        restored = sum(item.stored_row for item in prepared)
        return restored, len(prepared) - restored


def build_scorer(settings: Settings, *, use_embedder: bool = True) -> Scorer:
    """The scorer the settings describe; loads the model unless told not to."""
    profiles = load_profiles(settings.profiles_file)  # a bad file refused before the model loads
    embedder: Embedder | None = None
    reason: str | None = "disabled by flag"
    if use_embedder:
        from worker.embedding import EmbedderConfig, load_embedder

        embedder, reason = load_embedder(EmbedderConfig.from_settings(settings))
    ttl_ms = (
        None if settings.cache_ttl_seconds is None else round(settings.cache_ttl_seconds * 1000)
    )
    return Scorer(
        profiles=profiles,
        thresholds=Thresholds(settings.accept_threshold, settings.domain_thresholds),
        caches=PartitionCaches(settings.cache_capacity, ttl_ms=ttl_ms),
        embedder=embedder,
        max_message_bytes=settings.max_message_bytes,
        embedder_reason=reason,
        max_output_bytes=settings.max_output_bytes,
        max_json_containers=settings.max_json_containers,
        framing=settings.input_framing,
    )
