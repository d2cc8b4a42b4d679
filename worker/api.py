"""The Python API: score traces in-process exactly as the worker does, and re-score outputs.

An agent framework can score a trace before it publishes it, with the scores the worker
would give: the same decoder, schema, model, novelty cache, profiles and thresholds
(``worker.core``), behind a few typed names. Everything else in the package is internal.

Novelty depends on the traces scored before in the same partition, in order, as it does in
the worker: a :class:`Partition` is one partition's cache, owned by the caller. Two
partitions share nothing; scoring a partition's traces one by one or as a batch gives the
same scores.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import orjson

from worker.core.cache import PartitionCaches
from worker.core.errors import InvalidJsonError, TraceError
from worker.core.records import Decision, LineRecords, RoutedRecord, SourceRecord
from worker.core.rescoring import NotRescored, Rescorer
from worker.core.schema import json_path
from worker.core.scorer import Scorer, build_scorer
from worker.core.scoring import Dimensions, ProfileError, ScoreBreakdown
from worker.core.trace import INT_RANGE, integer_out_of_range
from worker.embedding.protocol import EmbedderUnavailable
from worker.settings import Settings, SettingsError
from worker.settings import load_settings as _load_settings

__all__ = [
    "DeadLetter",
    "Decision",
    "Dimensions",
    "NotRescored",
    "Partition",
    "ScoreResult",
    "ScoredTrace",
    "Settings",
    "SettingsError",
    "TraceInput",
    "TraceScorer",
    "load_settings",
    "rescore_output",
]

# Kafka numbers a topic's partitions with 32-bit signed integers, from 0.
_KAFKA_PARTITION_MAX = 2**31 - 1

# One trace as a producer would publish it: its bytes, its JSON text, or the decoded object.
TraceInput: TypeAlias = bytes | bytearray | memoryview | str | Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class ScoredTrace:
    """An accepted or rejected trace: its score, how it was reached, and the output record.

    ``value`` is the record the worker publishes to the accepted or rejected topic (the
    scored-trace envelope, ``schemas/scored-trace.schema.json``), byte for byte; it is also
    the line ``kp-scorer score`` writes for the trace.
    """

    decision: Decision
    score: float
    threshold: float
    domain: str
    profile: str
    dimensions: Dimensions
    composite: float
    overrides: tuple[str, ...]
    novelty_source: str
    value: bytes = dataclasses.field(repr=False)

    @property
    def accepted(self) -> bool:
        return self.decision is Decision.ACCEPTED


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """Input that cannot be scored, and why: ``kind`` is the stable name the dead-letter
    topic's ``kp-error-kind`` header carries, ``reason`` the one line a producer can act on.
    ``value`` is the input as the worker would keep it (None where it keeps none)."""

    kind: str
    reason: str
    value: bytes | None = dataclasses.field(repr=False)

    @property
    def decision(self) -> Decision:
        return Decision.DEAD_LETTER

    @property
    def accepted(self) -> bool:
        return False


ScoreResult: TypeAlias = ScoredTrace | DeadLetter


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from ``environ`` (the process environment when None), then ``overrides``
    by field name (``accept_threshold=0.7``): the worker's settings, validated the same way.

    Raises :class:`SettingsError` naming each bad variable, as the worker does at start-up.
    """
    return _load_settings(None, environ=environ, **overrides)


def _scored(
    decision: Decision, breakdown: ScoreBreakdown, value: bytes, threshold: float, domain: str
) -> ScoredTrace:
    return ScoredTrace(
        decision=decision,
        score=breakdown.score,
        threshold=threshold,
        domain=domain,
        profile=breakdown.profile.name,
        dimensions=breakdown.dimensions,
        composite=breakdown.composite,
        overrides=tuple(str(override) for override in breakdown.overrides),
        novelty_source=str(breakdown.novelty_source),
        value=value,
    )


def _unwritable_number(node: Any, path: tuple[str | int, ...] = ()) -> TraceError | None:
    """Why the first number in ``node`` (document order) has no exact JSON text, if one has
    none: NaN or an infinity, or an integer beyond 64 bits (the worker's own kinds for them)."""
    if isinstance(node, float):
        if math.isfinite(node):
            return None
        where = json_path(path)
        return InvalidJsonError(f"not valid JSON: {where}: {node!r} is not a JSON number")
    if isinstance(node, int):
        if INT_RANGE[0] <= node <= INT_RANGE[1]:
            return None
        return integer_out_of_range(list(path), str(node))
    if isinstance(node, Mapping):
        children: Iterable[tuple[str | int, Any]] = node.items()
    elif isinstance(node, list | tuple):
        children = enumerate(node)
    else:
        return None
    for key, child in children:
        if (error := _unwritable_number(child, (*path, key))) is not None:
            return error
    return None


def _integer(value: int, name: str, unit: str = "") -> int:
    """``value`` as an integer (a numpy integer is one; a float, even a whole one, is not)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} is an integer{unit}, not {type(value).__name__}") from None


def _record_timestamp(event_time_ms: int) -> int:
    """``event_time_ms`` as a Kafka record timestamp is: a 64-bit integer (a numpy integer is
    one; a float such as ``time.time() * 1000`` is not, and the output's timestamp is one)."""
    milliseconds = _integer(event_time_ms, "event_time_ms", " of milliseconds")
    if not -(2**63) <= milliseconds < 2**63:
        raise ValueError(f"event_time_ms {milliseconds} is outside a record timestamp's 64 bits")
    return milliseconds


def _partition_number(number: int) -> int:
    index = _integer(number, "number")
    if not 0 <= index <= _KAFKA_PARTITION_MAX:
        raise ValueError(f"number {index} is not a Kafka partition's (0 to {_KAFKA_PARTITION_MAX})")
    return index


class Partition:
    """One partition's novelty cache and its next offset, owned by the caller.

    Made by :meth:`TraceScorer.partition`. Each trace scored in it is compared with the
    traces scored in it before (up to ``KP_CACHE_CAPACITY``, within ``KP_CACHE_TTL_SECONDS``
    of event time) and then joins them, as consecutive records of one Kafka partition do.
    ``topic`` and ``number`` are what the output's ``source`` names. One thread at a time
    may score in a partition (its order is the scores' order); partitions are independent.
    """

    def __init__(self, owner: TraceScorer, core: Scorer, topic: str, number: int) -> None:
        self._owner = owner
        self._core = core
        self.topic = topic
        self.number = number
        self.next_offset = 0

    def __len__(self) -> int:
        """Traces held in the cache (a model-less scorer keeps none)."""
        return self._core.cache_size((self.topic, self.number)) or 0

    def _record(
        self, trace: TraceInput, event_time_ms: int | None, offset: int
    ) -> SourceRecord | DeadLetter:
        if isinstance(trace, bytes | bytearray | memoryview):
            value = bytes(trace)
        elif isinstance(trace, str):
            # A lone surrogate becomes bytes that are not UTF-8: dead-lettered, as on the wire.
            value = trace.encode("utf-8", "surrogatepass")
        elif isinstance(trace, Mapping):
            try:
                value = orjson.dumps(dict(trace))
            except orjson.JSONEncodeError as exc:
                # The walk only where orjson met a number first: a mapping may hold itself.
                number = _unwritable_number(trace) if "64-bit" in str(exc) else None
                error = number or InvalidJsonError(f"the trace cannot be written as JSON: {exc}")
                return DeadLetter(kind=error.kind, reason=error.reason, value=None)
            # orjson writes NaN and the infinities as null: the trace would score with a value
            # it never held, where their JSON text is invalid_json.
            if b"null" in value and (number := _unwritable_number(trace)) is not None:
                return DeadLetter(kind=number.kind, reason=number.reason, value=None)
        else:
            raise TypeError(f"a trace is bytes, str or a mapping, not {type(trace).__name__}")
        # Event time as `kp-scorer score` reads it (metadata.created_at), unless given.
        record = LineRecords(self.topic, None).record(offset, value)
        return dataclasses.replace(
            record,
            partition=self.number,
            timestamp_ms=record.timestamp_ms if event_time_ms is None else event_time_ms,
        )

    def _score(
        self, traces: Iterable[TraceInput], event_times_ms: Iterable[int | None]
    ) -> list[ScoreResult]:
        items = []
        # Offsets are used up only once every trace is taken: a TypeError leaves none behind.
        offset = self.next_offset
        for trace, event_time_ms in zip(traces, event_times_ms, strict=True):
            event_time = None if event_time_ms is None else _record_timestamp(event_time_ms)
            items.append(self._record(trace, event_time, offset))
            offset += 1
        self.next_offset = offset
        records = [item for item in items if isinstance(item, SourceRecord)]
        routed = iter(self._core.score_batch(records).routed if records else ())
        return [
            item if isinstance(item, DeadLetter) else self._result(next(routed)) for item in items
        ]

    def _result(self, routed: RoutedRecord) -> ScoreResult:
        error = routed.error
        if error is not None:
            return DeadLetter(kind=error.kind, reason=error.reason, value=routed.value)
        assert routed.breakdown is not None and routed.value is not None  # a scored output
        # Domain and threshold as the published envelope states them.
        envelope = orjson.loads(routed.value)
        domain = envelope["trace"]["metadata"]["task_domain"]
        threshold = envelope["score"]["threshold"]
        return _scored(routed.decision, routed.breakdown, routed.value, threshold, domain)


class TraceScorer:
    """The worker's scorer in-process: the model, profiles and thresholds the settings name.

    Loads the embedding model once (``use_embedder=False``: novelty 0.5, as ``--no-embedder``);
    :meth:`close` (or ``with``) stops its threads. A bad setting or profile file raises
    :class:`SettingsError`. Bad input never raises: it gives a :class:`DeadLetter`.
    """

    def __init__(self, settings: Settings | None = None, *, use_embedder: bool = True) -> None:
        self.settings = load_settings() if settings is None else settings
        try:
            self._core = build_scorer(self.settings, use_embedder=use_embedder)
        except ProfileError as exc:
            raise SettingsError(f"invalid configuration:\n  KP_PROFILES_FILE: {exc}") from None
        except EmbedderUnavailable as exc:  # only raised when the settings require the model
            raise SettingsError(
                "invalid configuration:\n  KP_EMBEDDER_REQUIRED: true, and the model cannot be "
                f"loaded: {exc}"
            ) from None

    @property
    def embedder_available(self) -> bool:
        """Whether novelty is measured (False: every trace gets the 0.5 stand-in)."""
        return self._core.has_embedder

    @property
    def embedder_reason(self) -> str | None:
        """Why there is no model, when there is none."""
        return None if self._core.has_embedder else self._core.embedder_reason

    def partition(self, topic: str = "api", number: int = 0) -> Partition:
        """A new, empty partition: its own novelty cache, its offsets from 0. ``number`` is a
        Kafka partition's (0 to 2**31 - 1): the output's ``source.partition`` is one."""
        number = _partition_number(number)
        scorer = copy.copy(self._core)  # the same model, profiles, thresholds and limits
        caches = self._core.caches
        scorer.caches = PartitionCaches(caches.capacity, caches.dimensions, caches.ttl_ms)
        return Partition(self, scorer, topic, number)

    def score(
        self, trace: TraceInput, partition: Partition, *, event_time_ms: int | None = None
    ) -> ScoreResult:
        """Score one trace in ``partition`` (which it then joins). ``event_time_ms`` is the
        record timestamp the cache's TTL measures; by default ``metadata.created_at``."""
        return self._own(partition)._score([trace], [event_time_ms])[0]

    def score_many(
        self,
        traces: Iterable[TraceInput],
        partition: Partition,
        *,
        event_times_ms: Iterable[int] | None = None,
    ) -> list[ScoreResult]:
        """Score traces in order in ``partition``, in one batch: the same results as scoring
        them one at a time."""
        items = list(traces)
        times = [None] * len(items) if event_times_ms is None else event_times_ms
        return self._own(partition)._score(items, times)

    def _own(self, partition: Partition) -> Partition:
        if partition._owner is not self:
            raise ValueError("the partition belongs to another TraceScorer")
        return partition

    def close(self) -> None:
        """Stop the model's threads."""
        self._core.close()

    def __enter__(self) -> TraceScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def rescore_output(
    recorded: bytes | str | Mapping[str, Any],
    *,
    settings: Settings | None = None,
    threshold: float | None = None,
    domain_thresholds: Mapping[str, float] | None = None,
) -> ScoredTrace | NotRescored:
    """Re-score a recorded output (an accepted or rejected record, or a ``score`` line) with
    the settings' profiles and thresholds, ``threshold`` and ``domain_thresholds`` over them,
    from its recorded novelty (no model): what ``kp-scorer rescore`` writes for it.

    A record that cannot be re-scored gives :class:`NotRescored` with the reason.
    """
    settings = load_settings() if settings is None else settings
    given = {"threshold": threshold}
    given.update((f"domain threshold {d!r}", t) for d, t in (domain_thresholds or {}).items())
    for name, value in given.items():
        if value is not None and not 0.0 <= value <= 1.0:
            raise SettingsError(f"invalid configuration:\n  {name}: {value} is not in [0, 1]")
    rescorer = Rescorer.of(settings, threshold, domain_thresholds)
    if isinstance(recorded, Mapping):
        result = rescorer.rescore(dict(recorded))
    else:
        raw = recorded.encode("utf-8", "surrogatepass") if isinstance(recorded, str) else recorded
        result = rescorer.rescore_value(raw)
    if isinstance(result, NotRescored):
        return result
    return _scored(result.decision, result.breakdown, result.value, result.threshold, result.domain)
