"""The worker's /metrics read back: samples, deltas, histograms, per-stage lines, percentiles.

Run the benches as scripts from the repository root (``python bench/<name>.py``): this
directory is then on ``sys.path``, so ``import _metrics`` works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from worker.stream.timing import STAGES

BUDGET_SECONDS = 0.1

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def delta(after: Samples, before: Samples) -> Samples:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets (upper bound -> count), sum and count of one histogram (delta)."""

    buckets: list[tuple[float, float]]
    total: float
    count: float

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket, as Prometheus histogram_quantile does;
        inf when it falls in the +Inf bucket."""
        if self.count <= 0:
            return float("nan")
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if bound == float("inf"):
                    return float("inf")
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, cumulative
        return float("inf")

    def share_above(self, bound: float) -> float:
        """Exact share of observations > bound (bound must be a bucket boundary)."""
        for upper, cumulative in self.buckets:
            if upper == bound:
                return 1 - cumulative / self.count if self.count else float("nan")
        raise ValueError(f"{bound} is not a bucket boundary")


def histogram(samples: Samples, name: str, **labels: str) -> Histogram:
    buckets = []
    for (sample, sample_labels), count in samples.items():
        found = dict(sample_labels)
        if sample != f"{name}_bucket" or any(found.get(k) != v for k, v in labels.items()):
            continue
        buckets.append((float(found["le"]), count))
    buckets.sort()
    return Histogram(
        buckets, value(samples, f"{name}_sum", **labels), value(samples, f"{name}_count", **labels)
    )


def pipeline_lines(samples: Samples, span: float | None = None) -> list[str]:
    """Pipeline depth, reused vectors and per-stage times from /metrics deltas.

    Every record is its own pipeline and stages of different records overlap, so a stage's
    total ("busy s", summed over records) exceeds the span when records overlap in it;
    "x span" is that total over the span, i.e. how many records were in the stage on average.
    Waits are stages of their own: "embed" is the model run, "embed_wait" the wait for it.
    """
    entered = value(samples, "kp_batch_size_count")
    depth = value(samples, "kp_batch_size_sum") / entered if entered else 0.0
    reused = value(samples, "kp_embeddings_reused_total")
    lines = [
        f"  records {entered:.0f}, mean pipeline depth {depth:.2f} (records in the pipeline "
        f"when one enters, itself included), embeddings reused {reused:.0f}",
        f"  {'stage':<11} {'ms/trace':>9} {'busy s':>8}" + (f" {'x span':>7}" if span else ""),
    ]
    for stage in STAGES:
        total = value(samples, "kp_stage_latency_seconds_sum", stage=stage)
        count = value(samples, "kp_stage_latency_seconds_count", stage=stage)
        mean_ms = total / count * 1000 if count else 0.0
        share = f" {total / span:7.2f}" if span else ""
        lines.append(f"  {stage:<11} {mean_ms:9.2f} {total:8.2f}{share}")
    return lines


def fmt_ms(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "   -"
    if seconds == float("inf"):
        return ">1000"
    return f"{seconds * 1000:6.1f}"


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    if not len(values):
        return [float("nan")] * len(qs)
    return [float(np.percentile(values, q)) for q in qs]
