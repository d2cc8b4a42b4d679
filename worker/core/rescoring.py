"""What-if re-scoring of recorded outputs: new profiles and thresholds, the recorded novelty.

Every accepted or rejected output carries its trace and the novelty measured when it was
scored, and profiles, thresholds and overrides never change novelty. So ``score_trace`` over
the recorded trace with the recorded novelty gives exactly what scoring the trace from
scratch with the new settings gives, without a model or a cache: arithmetic only.

A record that cannot be re-scored that way (not a scored output, one that breaks the output
schema, novelty that was a stand-in for a missing model, a trace this version scores
differently) is answered with the reason, never with a guess. Pure; no I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import orjson

from worker.core.output import HEADER_PREFIX, producer_headers, scored_value, verdict_headers
from worker.core.records import Decision, RoutedRecord, SourceRecord
from worker.core.schema import output_violation
from worker.core.scoring import (
    DIMENSION_NAMES,
    Novelty,
    NoveltySource,
    ProfileSet,
    ScoreBreakdown,
    load_profiles,
    score_trace,
)
from worker.core.trace import Trace
from worker.version import __version__

if TYPE_CHECKING:
    from worker.settings import Settings

# The same bins as `kp-scorer replay`, so the two summaries read alike.
DELTA_BINS = (-1.0, -0.2, -0.1, -0.05, -0.01, -1e-12, 1e-12, 0.01, 0.05, 0.1, 0.2, 1.0)


def delta_bin(delta: float) -> int:
    """The index of a score change's bin in ``DELTA_BINS``: [low, high), the last one closed."""
    return min(max(bisect_right(DELTA_BINS, delta) - 1, 0), len(DELTA_BINS) - 2)


def delta_rows(histogram: Sequence[int]) -> list[tuple[str, float, float, int]]:
    """(label, low, high, records) per bin of a ``delta_bin`` histogram; the bin around 0 is
    "unchanged"."""
    return [
        ("unchanged" if low == -1e-12 else f"[{low:+.2f}, {high:+.2f})", low, high, count)
        for (low, high), count in zip(pairwise(DELTA_BINS), histogram, strict=True)
    ]


MAX_EXAMPLES = 20
_DECISIONS = {d.value: d for d in (Decision.ACCEPTED, Decision.REJECTED)}
_NOVELTY_SOURCES = {s.value: s for s in NoveltySource}


# A trace as producers publish it, never scored: `kp-scorer score` (or `replay`) is what it needs.
RAW_TRACE = "a raw ReasoningTrace, not a scored output (score it with `kp-scorer score`)"


class Unrescorable(StrEnum):
    """Why a recorded output was not re-scored."""

    NOT_AN_OUTPUT = "not_an_output"  # not JSON, or not a scored-trace envelope at all
    INCOMPLETE = "incomplete"  # the envelope breaks the output schema (a field missing, ...)
    NO_EMBEDDER = "no_embedder"  # novelty was the 0.5 stand-in of a scorer without a model
    INVALID_TRACE = "invalid_trace"  # the trace breaks today's trace schema
    DIMENSIONS_DIFFER = "dimensions_differ"  # this version derives other dimensions from it


@dataclass(frozen=True, slots=True)
class NotRescored:
    reason: Unrescorable
    detail: str
    scorer_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason.value}


@dataclass(slots=True)  # not frozen: built once per record, and frozen __init__ costs
class Rescored:
    """A re-scored output (``value``, the worker's envelope) and what it was before."""

    value: bytes
    breakdown: ScoreBreakdown
    threshold: float
    decision: Decision
    before_score: float
    before_decision: Decision
    domain: str
    rescore_of: str


def is_error_line(document: Any) -> bool:
    """A line `kp-scorer score` writes for a record it could not score (never scored); the
    key test first, as nearly every line is an output."""
    return type(document) is dict and "error" in document and set(document) == {"line", "error"}


def decoded(raw: bytes) -> Any:
    """The JSON of a recorded output, or why it has none (a :class:`NotRescored`)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return NotRescored(Unrescorable.NOT_AN_OUTPUT, f"not JSON: {str(exc)[:120]}")


@dataclass(frozen=True)
class Rescorer:
    """The settings under test: weight profiles and the accept thresholds."""

    profiles: ProfileSet
    threshold: float = 0.75
    domain_thresholds: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        settings: Settings,
        threshold: float | None = None,
        domain_thresholds: Mapping[str, float] | None = None,
    ) -> Rescorer:
        """The settings' profiles and thresholds, ``threshold`` and ``domain_thresholds`` over
        them (`rescore`, `report` and the API's ``rescore_output`` alike)."""
        return cls(
            load_profiles(settings.profiles_file),
            settings.accept_threshold if threshold is None else threshold,
            {**settings.domain_thresholds, **(domain_thresholds or {})},
        )

    def rescore_value(self, raw: bytes | None) -> Rescored | NotRescored:
        """Re-score one recorded output as published (bytes)."""
        document = decoded(raw or b"")
        return document if type(document) is NotRescored else self.rescore(document)

    def rescore(self, recorded: Any) -> Rescored | NotRescored:
        """Re-score one decoded recorded output (not modified)."""
        if type(recorded) is not dict or type(recorded.get("trace")) is not dict:
            if type(recorded) is dict and recorded.get("@type") == "ReasoningTrace":
                return NotRescored(Unrescorable.NOT_AN_OUTPUT, RAW_TRACE)
            return NotRescored(Unrescorable.NOT_AN_OUTPUT, "not a scored-trace envelope")
        scorer = recorded.get("scorer")
        version = scorer.get("version") if type(scorer) is dict else None
        version = version if type(version) is str else None
        # The output schema, today's trace rules included, whatever version the output names:
        # a rule added since it was scored (or an edited output) must not give a score to a
        # trace this worker would dead-letter. The envelope's errors are reported first.
        broken = output_violation(recorded)
        if broken is not None and not broken[0]:
            return NotRescored(Unrescorable.INCOMPLETE, broken[1][:300], version)
        score, scorer = recorded["score"], recorded["scorer"]
        novelty_source = _NOVELTY_SOURCES[score["novelty_source"]]
        if novelty_source is NoveltySource.NO_EMBEDDER:
            return NotRescored(
                Unrescorable.NO_EMBEDDER,
                "scored without an embedding model: novelty 0.5 was a stand-in, not a measure",
                version,
            )
        if broken is not None:
            return NotRescored(Unrescorable.INVALID_TRACE, broken[1][:300], version)
        recorded_dimensions = tuple(score["dimensions"][name] for name in DIMENSION_NAMES)
        trace = Trace(recorded["trace"])
        novelty = Novelty(recorded_dimensions[1], novelty_source)
        breakdown = score_trace(trace, novelty, self.profiles)
        for name, was in zip(DIMENSION_NAMES, recorded_dimensions, strict=True):
            now = getattr(breakdown.dimensions, name)
            if now != was:
                return NotRescored(
                    Unrescorable.DIMENSIONS_DIFFER,
                    f"recorded {name} {was!r}, this version computes {now!r}",
                    version,
                )
        domain = trace.domain
        origin = scorer.get("rescore_of", version)
        threshold = self.domain_thresholds.get(domain, self.threshold)
        decision = Decision.of(breakdown.score, threshold)
        value = scored_value(
            trace.document,
            breakdown,
            threshold,
            decision,
            {**scorer, "version": __version__, "rescore_of": origin},
            recorded["source"],
        )
        return Rescored(
            value=value,
            breakdown=breakdown,
            threshold=threshold,
            decision=decision,
            before_score=float(score["score"]),
            before_decision=_DECISIONS[score["decision"]],
            domain=domain,
            rescore_of=origin,
        )


def rescored_record(recorded: SourceRecord, rescored: Rescored) -> RoutedRecord:
    """The record to publish: the recorded output's key and headers, with the new verdict (the
    old one's are the scorer's ``kp-`` headers, the only ones an output has)."""
    headers = (
        *verdict_headers(rescored.decision, rescored.breakdown.score),
        (f"{HEADER_PREFIX}rescore-of", rescored.rescore_of.encode()),
        *producer_headers(recorded.headers),
    )
    return RoutedRecord(
        source=recorded,
        decision=rescored.decision,
        value=rescored.value,
        headers=headers,
        domain_label=rescored.domain,
        breakdown=rescored.breakdown,
    )


@dataclass
class DomainTally:
    records: int = 0
    accepted_before: int = 0
    accepted_after: int = 0
    accepted_to_rejected: int = 0
    rejected_to_accepted: int = 0


@dataclass
class RescoreSummary:
    """Before/after of a re-scoring run, accumulated record by record (no per-record list)."""

    records: int = 0
    dead_letters: int = 0  # `score` error lines passed through: never scored, nothing to redo
    unrescorable: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    before: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    domains: dict[str, DomainTally] = field(default_factory=lambda: defaultdict(DomainTally))
    histogram: list[int] = field(default_factory=lambda: [0] * (len(DELTA_BINS) - 1))
    identical: int = 0
    delta_sum: float = 0.0
    delta_min: float = math.inf
    delta_max: float = -math.inf

    @property
    def rescored(self) -> int:
        return sum(self.after.values())

    @property
    def accepted_to_rejected(self) -> int:
        return sum(t.accepted_to_rejected for t in self.domains.values())

    @property
    def rejected_to_accepted(self) -> int:
        return sum(t.rejected_to_accepted for t in self.domains.values())

    def add(self, result: Rescored | NotRescored, where: str = "") -> None:
        """Count one result; ``where`` locates an unrescorable record in the report."""
        self.records += 1
        if isinstance(result, NotRescored):
            self.unrescorable[result.reason.value] += 1
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append({"at": where, **result.to_json()})
            return
        before, after = result.before_decision, result.decision
        self.before[before] += 1  # Decision keys: equal to, and hashed as, their values
        self.after[after] += 1
        tally = self.domains[result.domain]
        tally.records += 1
        tally.accepted_before += before is Decision.ACCEPTED
        tally.accepted_after += after is Decision.ACCEPTED
        tally.accepted_to_rejected += before is Decision.ACCEPTED and after is Decision.REJECTED
        tally.rejected_to_accepted += before is Decision.REJECTED and after is Decision.ACCEPTED
        delta = result.breakdown.score - result.before_score
        self.identical += delta == 0.0
        self.delta_sum += delta
        self.delta_min = min(self.delta_min, delta)
        self.delta_max = max(self.delta_max, delta)
        self.histogram[delta_bin(delta)] += 1

    def add_dead_letter(self, kind: str | None) -> None:
        """Count one dead letter (a `score` error line, or a record of the dead-letter topic):
        never scored, so nothing to re-score; ``kind`` is its error kind, when known."""
        self.records += 1
        self.dead_letters += 1

    def delta_histogram(self) -> list[tuple[str, float, float, int]]:
        return delta_rows(self.histogram)

    def to_json(self) -> dict[str, Any]:
        rescored = self.rescored
        return {
            "records": self.records,
            "rescored": rescored,
            "dead_letters": self.dead_letters,
            "unrescorable": dict(sorted(self.unrescorable.items())),
            "unrescorable_examples": self.examples,
            "decisions": {
                "before": {d: self.before[d] for d in _DECISIONS},
                "after": {d: self.after[d] for d in _DECISIONS},
            },
            "flips": {
                "accepted_to_rejected": self.accepted_to_rejected,
                "rejected_to_accepted": self.rejected_to_accepted,
            },
            "domains": {name: vars(tally).copy() for name, tally in sorted(self.domains.items())},
            "score_delta": {
                "identical": self.identical,
                "mean": self.delta_sum / rescored if rescored else None,
                "min": self.delta_min if rescored else None,
                "max": self.delta_max if rescored else None,
                "histogram": [
                    {"bin": label, "low": low, "high": high, "records": count}
                    for label, low, high, count in self.delta_histogram()
                ],
            },
        }
