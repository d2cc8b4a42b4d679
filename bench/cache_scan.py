"""VectorCache scan cost over a full cache, and worker memory with 16 partitions of full caches.

    python bench/cache_scan.py [--quick]

Part 1 (target <= 50 us per query): a VectorCache of 1,000 x 384 random unit vectors;
`max_cosine_similarity` (1 query), `max_cosine_similarity_batch` (8 queries),
`query_then_add_batch` (8 vectors, and 1 vector), against the raw numpy float32 floor
(`rows @ q` then max, for 1 and for 8 queries) that any exact scan must pay. Every variant
runs in every round, in rotating order; the figure is the median over rounds of the mean
time per call. OPENBLAS_NUM_THREADS=1 as in the worker (importing `worker` sets it).

Part 2 (target <= 350 MB RSS): a child process imports what the worker imports (faust,
aiokafka, worker.app), builds the real Scorer (worker.pipeline.build_scorer(load_settings())),
embeds batches of 8 texts of 256 tokens (the longest input the model takes), fills 16
partitions' caches with 1,000 vectors each through scorer.caches.warm(...), and reads VmRSS
from /proc/self/status after each step. It runs once as shipped (KP_EMBED_BATCH_SIZE=1) and
once with KP_EMBED_BATCH_SIZE=8, the earlier default, to show what the onnxruntime arena
keeps for an 8 x 256-token run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import _machine
import numpy as np

from worker.core.cache import VectorCache

DIMS = 384
CAPACITY = 1000
BATCH = 8
PARTITIONS_FOR_RSS = 16
TARGET_US = 50.0
TARGET_RSS_MB = 350.0


def unit_rows(rng: np.random.Generator, count: int) -> np.ndarray:
    rows = rng.standard_normal((count, DIMS)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def scan_bench(rounds: int, calls: int) -> None:
    rng = np.random.default_rng(7)
    cache = VectorCache(CAPACITY, DIMS)
    cache.add_batch(unit_rows(rng, CAPACITY), list(range(CAPACITY)))
    queries = [unit_rows(rng, BATCH) for _ in range(64)]
    rows = cache._rows.copy()
    clock = [CAPACITY]

    def next_times(n: int) -> list[int]:
        start = clock[0]
        clock[0] += n
        return list(range(start, start + n))

    # name -> (call, queries per call)
    variants: dict[str, tuple[Callable[[int], object], int]] = {
        "max_cosine_similarity (1 query)": (
            lambda i: cache.max_cosine_similarity(queries[i % 64][0]),
            1,
        ),
        "max_cosine_similarity_batch (8)": (
            lambda i: cache.max_cosine_similarity_batch(queries[i % 64]),
            BATCH,
        ),
        "query_then_add_batch (8)": (
            lambda i: cache.query_then_add_batch(queries[i % 64], next_times(BATCH)),
            BATCH,
        ),
        "query_then_add_batch (1)": (
            lambda i: cache.query_then_add_batch(queries[i % 64][:1], next_times(1)),
            1,
        ),
        "floor: f32 matmul + max (1)": (lambda i: (rows @ queries[i % 64][0]).max(), 1),
        "floor: f32 matmul + max (8)": (
            lambda i: (rows @ queries[i % 64].T).max(axis=0),
            BATCH,
        ),
    }
    names = list(variants)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up
        for i in range(20):
            variants[name][0](i)
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            call = variants[name][0]
            started = time.perf_counter()
            for i in range(calls):
                call(i)
            per_call[name].append((time.perf_counter() - started) / calls)
    assert len(cache) == CAPACITY

    print(
        f"cache scan: {CAPACITY} x {DIMS}, OPENBLAS_NUM_THREADS="
        f"{os.environ.get('OPENBLAS_NUM_THREADS')}, {rounds} rounds x {calls} calls, "
        f"load average {_machine.load_average()}"
    )
    print(f"  {'variant':<34} {'us/call':>9} {'us/query':>9} {'p10-p90 us/query':>19}  target")
    for name in names:
        values = np.array(per_call[name]) * 1e6
        width = variants[name][1]
        median = float(np.median(values))
        low, high = np.percentile(values, [10, 90]) / width
        verdict = ""
        if not name.startswith("floor"):
            verdict = "met" if median / width <= TARGET_US else "NOT met"
        print(
            f"  {name:<34} {median:9.1f} {median / width:9.1f} {low:9.1f}-{high:<9.1f}  {verdict}"
        )


# -- RSS ---------------------------------------------------------------------------------------
def rss_child() -> None:
    """Runs in a fresh process; prints one JSON object per step."""

    def report(step: str) -> None:
        rss = _machine.proc_status_kib("self", "VmRSS") / 1024
        print(json.dumps({"step": step, "rss_mb": rss}), flush=True)

    report("python + numpy + bench helpers")
    import faust  # noqa: F401

    from worker.core.scorer import build_scorer
    from worker.settings import load_settings

    report("+ worker imports (faust, aiokafka, onnxruntime)")
    settings = load_settings()
    scorer = build_scorer(settings)
    assert scorer.embedder is not None, scorer.embedder_reason
    report(f"+ build_scorer (model loaded, {settings.resolved_embed_concurrency} concurrent runs)")
    long_text = " ".join(["knowledge"] * 300)
    for _ in range(3):
        scorer.embedder.embed([long_text] * BATCH)
    report(f"+ embed() 3 x 8 texts of 256 tokens (embed batch {settings.embed_batch_size})")
    rng = np.random.default_rng(3)
    for partition in range(PARTITIONS_FOR_RSS):
        scorer.caches.warm(
            ("kp.traces.raw", partition), unit_rows(rng, CAPACITY), list(range(CAPACITY))
        )
    sizes = scorer.caches.sizes()
    assert len(sizes) == PARTITIONS_FOR_RSS and set(sizes.values()) == {CAPACITY}
    report(f"+ {PARTITIONS_FOR_RSS} partitions x {CAPACITY} vectors (scorer.caches.warm)")
    print(
        json.dumps(
            {"step": "peak (VmHWM)", "rss_mb": _machine.proc_status_kib("self", "VmHWM") / 1024}
        ),
        flush=True,
    )


def rss_bench() -> None:
    for batch, label in (("1", "as shipped (embed batch 1)"), ("8", "embed batch 8")):
        env = {**os.environ, "KP_EMBED_BATCH_SIZE": batch}
        command = [sys.executable, __file__, "--rss-child"]
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=300, env=env
        )
        if done.returncode != 0:
            print(f"RSS child failed ({label}):\n{done.stderr[-2000:]}")
            continue
        print(f"worker RSS, {label}:")
        steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for step in steps:
            print(f"  {step['step']:<58} {step['rss_mb']:7.1f} MB")
        final = next(s for s in steps if s["step"].startswith(f"+ {PARTITIONS_FOR_RSS}"))
        verdict = "met" if final["rss_mb"] <= TARGET_RSS_MB else "NOT met"
        print(f"  -> {final['rss_mb']:.0f} MB with full caches (target <= {TARGET_RSS_MB:.0f}: "
              f"{verdict})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child()
        return
    print(_machine.machine_line())
    scan_bench(rounds=15 if args.quick else 41, calls=100 if args.quick else 300)
    rss_bench()


if __name__ == "__main__":
    main()
