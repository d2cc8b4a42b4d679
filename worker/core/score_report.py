"""The numbers of `kp-scorer report`: how scored outputs are distributed, and how acceptance
moves with the accept threshold.

Built from the same re-scoring as `kp-scorer rescore` (a :class:`ScoreReport` is the summary
that :func:`worker.cli.rescore.rescore_stream` and ``rescore_topics`` fill), so its scores are
the ones `rescore` computes with the same settings, and its acceptance curve is exact: the
accepted count at threshold T is the number of scores >= T, as `rescore --threshold T`
decides. Pure; no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from worker.core.records import Decision
from worker.core.rescoring import NotRescored, Rescored, RescoreSummary
from worker.core.scoring import DIMENSION_NAMES as DIMENSIONS

SCORE_BINS = 50  # of width 0.02 over [0, 1]
DIMENSION_BINS = 20  # of width 0.05
GRID_STEPS = 100  # the acceptance table: thresholds 0.00, 0.01, ..., 1.00
UNKNOWN_KIND = "unknown"


def _bin(value: float, bins: int) -> int:
    """Bins are [low, high) of equal width over [0, 1], the last one closed."""
    return min(max(int(value * bins), 0), bins - 1)


def histogram_edges(bins: int) -> list[float]:
    return [round(i / bins, 6) for i in range(bins + 1)]


@dataclass(frozen=True)
class AcceptanceCurve:
    """Accepted count as a function of the threshold, exact: ``thresholds`` are the distinct
    scores, ascending, and ``accepted[i]`` the number of scores >= ``thresholds[i]``."""

    records: int
    thresholds: list[float]
    accepted: list[int]

    @classmethod
    def of(cls, scores: Counter[float]) -> AcceptanceCurve:
        distinct = sorted(scores)
        at_or_above = list(accumulate(scores[s] for s in reversed(distinct)))[::-1]
        return cls(sum(scores.values()), distinct, at_or_above)

    def accepted_at(self, threshold: float) -> int:
        """How many records a threshold accepts (score >= threshold)."""
        index = bisect_left(self.thresholds, threshold)
        return self.accepted[index] if index < len(self.accepted) else 0

    def to_json(self) -> dict[str, Any]:
        grid = [round(i / GRID_STEPS, 2) for i in range(GRID_STEPS + 1)]
        return {
            "records": self.records,
            "steps": {"threshold": self.thresholds, "accepted": self.accepted},
            "grid": [
                {
                    "threshold": t,
                    "accepted": self.accepted_at(t),
                    "share": self.accepted_at(t) / self.records if self.records else None,
                }
                for t in grid
            ],
        }


@dataclass
class ScoreReport(RescoreSummary):
    """A :class:`RescoreSummary` that also keeps every score (as counts per value, by domain)
    and the distributions of dimensions, novelty sources and dead-letter kinds."""

    domain_scores: dict[str, Counter[float]] = field(default_factory=lambda: defaultdict(Counter))
    # The configured threshold of each domain (the last seen: they are all the same).
    domain_threshold: dict[str, float] = field(default_factory=dict)
    dimension_counts: dict[str, list[int]] = field(
        default_factory=lambda: {name: [0] * DIMENSION_BINS for name in DIMENSIONS}
    )
    dimension_sums: Counter[str] = field(default_factory=Counter)
    novelty_sources: Counter[str] = field(default_factory=Counter)
    dead_letter_kinds: Counter[str] = field(default_factory=Counter)

    def add(self, result: Rescored | NotRescored, where: str = "") -> None:
        super().add(result, where)
        if isinstance(result, NotRescored):
            return
        breakdown = result.breakdown
        self.domain_scores[result.domain][breakdown.score] += 1
        self.domain_threshold[result.domain] = result.threshold
        for name in DIMENSIONS:
            value = getattr(breakdown.dimensions, name)
            self.dimension_counts[name][_bin(value, DIMENSION_BINS)] += 1
            self.dimension_sums[name] += value
        self.novelty_sources[str(breakdown.novelty_source)] += 1

    def add_dead_letter(self, kind: str | None) -> None:
        super().add_dead_letter(kind)
        self.dead_letter_kinds[kind or UNKNOWN_KIND] += 1

    def report_json(self, threshold: float, domain_thresholds: dict[str, float]) -> dict[str, Any]:
        """Everything the page shows, as numbers (``kp-scorer report --json``); domains
        largest first."""
        scored = self.rescored
        every: Counter[float] = Counter()
        for scores in self.domain_scores.values():
            every.update(scores)
        return {
            "records": self.records,
            "scored": scored,
            "not_scored": dict(sorted(self.unrescorable.items())),
            "dead_letters": {
                "total": self.dead_letters,
                "by_kind": dict(self.dead_letter_kinds.most_common()),
            },
            "thresholds": {
                "default": threshold,
                "domains": dict(sorted(domain_thresholds.items())),
            },
            "accepted_at_configured_thresholds": self.after[Decision.ACCEPTED],
            "score": _distribution(every),
            "domains": {
                name: {
                    "threshold": self.domain_threshold[name],
                    "accepted_at_threshold": self.domains[name].accepted_after,
                    "score": _distribution(self.domain_scores[name]),
                    "acceptance": AcceptanceCurve.of(self.domain_scores[name]).to_json(),
                }
                for name in sorted(self.domains, key=lambda d: (-self.domains[d].records, d))
            },
            "dimensions": {
                name: {
                    "edges": histogram_edges(DIMENSION_BINS),
                    "counts": self.dimension_counts[name],
                    "mean": self.dimension_sums[name] / scored if scored else None,
                }
                for name in DIMENSIONS
            },
            "novelty_sources": dict(self.novelty_sources.most_common()),
            "acceptance": AcceptanceCurve.of(every).to_json(),
        }


def _distribution(scores: Counter[float]) -> dict[str, Any]:
    counts = [0] * SCORE_BINS
    for value, count in scores.items():
        counts[_bin(value, SCORE_BINS)] += count
    records = sum(scores.values())
    ordered = sorted(scores.elements()) if records else []
    return {
        "records": records,
        "mean": sum(v * c for v, c in scores.items()) / records if records else None,
        "min": ordered[0] if ordered else None,
        "median": ordered[len(ordered) // 2] if ordered else None,
        "max": ordered[-1] if ordered else None,
        "edges": histogram_edges(SCORE_BINS),
        "counts": counts,
    }
