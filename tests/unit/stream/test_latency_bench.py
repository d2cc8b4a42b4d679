"""``bench/latency_under_load.py`` reads per-record stages and simulates the model alone right.

Its breakdown of the slowest traces comes from each output's ``kp-timing-ms`` header, and its
"worker p99 / simulated p99" feeds a phase's own send times to ``bench/budget_floor.py``'s
fluid model of the embedder as shipped.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from worker.stream.timing import STAGES, TIMING_HEADER

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import latency_under_load

        yield latency_under_load
    finally:
        sys.path.remove(str(BENCH))


def test_the_header_stages_are_the_worker_stages_before_publish(bench: ModuleType) -> None:
    assert tuple(stage for stage in STAGES if stage != "publish") == bench.HEADER_STAGES
    message = SimpleNamespace(headers=[("kp-decision", b"accepted"), (TIMING_HEADER, b'{"a":1.5}')])
    assert bench._worker._timing(message) == {"a": 1.5}
    assert bench._worker._timing(SimpleNamespace(headers=None)) is None


def test_breakdown_means_the_slowest_five_percent_by_send_to_stamp(bench: ModuleType) -> None:
    outputs, sent = [], []
    for index in range(40):  # two slowest: 5 % of 40
        slow = index in (7, 30)
        timing = dict.fromkeys(bench.HEADER_STAGES, 1.0)
        timing["embed_wait"] = 100.0 if slow else 10.0
        total = sum(timing.values()) + 0.5  # the stamp lands 0.5 ms after score ends
        sent.append(bench._worker.Sent(0, index, 1000.0 + index))
        outputs.append(
            bench._worker.Output("accepted", (0, index), 1000.0 + index + total / 1000, 0.0, timing)
        )
    slowest, every = bench.breakdown_lines(outputs, sent)
    assert "slowest 5% (2 of 40" in slowest
    assert "embed_wait 100.0" in slowest and "rest 0.5 = 108.5 ms" in slowest
    assert "embed_wait 14.5" in every  # (2 * 100 + 38 * 10) / 40


def test_the_simulation_runs_the_model_alone_on_the_phase_send_times(bench: ModuleType) -> None:
    engine = bench.budget_floor.Engine(
        "model",
        work=np.array([0.04, 0.08]),
        alone=np.array([0.04, 0.08]),  # as fast alone as on one thread
        max_rate=50.0,  # two at once at full speed: 2 / mean work = 33 < 50
    )
    apart = [bench._worker.Sent(0, i, 100.0 + i) for i in range(100)]
    # Far apart, each trace takes its own text's time: half 40 ms, half 80 ms.
    assert bench.simulated_p99(engine, apart) == pytest.approx(0.08)
    # All at once on two threads: the last pair waits for 49 pairs ahead.
    together = [bench._worker.Sent(0, i, 100.0) for i in range(100)]
    assert bench.simulated_p99(engine, together) > 1.0


def test_the_worker_cpu_simulation_stretches_each_run_by_cpu_a_trace(bench: ModuleType) -> None:
    engine = bench.budget_floor.Engine(
        "model", work=np.array([0.04, 0.08]), alone=np.array([0.04, 0.08]), max_rate=50.0
    )
    apart = [bench._worker.Sent(0, i, 100.0 + i) for i in range(100)]
    # The model's CPU a trace is 60 ms; a worker spending 9 s on 100 traces spends 90.
    p99, worker_ms, model_ms = bench.simulated_at_worker_cpu(engine, apart, 9.0)
    assert (worker_ms, model_ms) == pytest.approx((90.0, 60.0))
    assert p99 == pytest.approx(0.08 * 1.5)


def test_the_cpu_a_trace_by_thread_puts_the_event_loop_first(bench: ModuleType) -> None:
    """Each thread's ms on a core per trace over the phase: the main thread (the event loop)
    named first, the others largest first, and threads that hardly ran summed."""
    machine = sys.modules["_machine"]
    before = {1: (1.0, 0.0), 2: (10.0, 0.0), 3: (0.5, 0.0)}
    after = {1: (1.4, 0.0), 2: (14.0, 0.0), 3: (0.7, 0.0), 4: (0.001, 0.0)}
    line = machine.thread_ms_per_item(before, after, main_tid=1, items=100)
    assert line == "main thread 4.00; the others 40.00, 2.00 (and 0.01 more)"
    assert machine.thread_ms_per_item(before, after, main_tid=1, items=0) == ""
