"""The schedules ``bench/budget_floor.py`` bounds the latency target with are computed right.

Its verdict (whether any schedule of the model's work can keep fewer than 1 % of traces over
the budget) rests on ``fewest_late`` being the true minimum, so it is checked against an
exhaustive search over every subset of small random instances.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "budget_floor.py"


@pytest.fixture(scope="module")
def floor() -> Iterator[ModuleType]:
    name = "bench_budget_floor"
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


def test_arrival_order_waits_for_the_run_ahead(floor: ModuleType) -> None:
    response = floor.in_arrival_order(np.array([0.0, 0.01, 0.5]), np.array([0.05, 0.02, 0.01]))
    assert response == pytest.approx([0.05, 0.06, 0.01])


def test_first_free_core_runs_two_at_once(floor: ModuleType) -> None:
    arrivals, work = np.array([0.0, 0.0, 0.0]), np.array([0.05, 0.03, 0.01])
    assert floor.on_first_free(arrivals, work, 2) == pytest.approx([0.05, 0.03, 0.04])


def test_fewest_late_gives_up_the_run_that_frees_the_most_time(floor: ModuleType) -> None:
    # All three cannot finish within 0.1 s; giving up the long one keeps the two short ones.
    arrivals, work = np.array([0.0, 0.01, 0.02]), np.array([0.02, 0.09, 0.03])
    assert floor.fewest_late(arrivals, work, 0.1) == 1
    assert floor.fewest_late(arrivals, work, 0.2) == 0


def test_fewest_late_is_the_minimum_over_every_subset(floor: ModuleType) -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        count = int(rng.integers(1, 8))
        arrivals = np.sort(rng.uniform(0, 0.2, count))
        work = rng.uniform(0.005, 0.09, count)
        least = next(
            count - size
            for size in range(count, -1, -1)
            for kept in itertools.combinations(range(count), size)
            if np.all(floor.in_arrival_order(arrivals[list(kept)], work[list(kept)]) <= 0.1)
        )
        assert floor.fewest_late(arrivals, work, 0.1) == least


def test_shipped_rule_splits_a_lone_run_and_shares_the_cores(floor: ModuleType) -> None:
    # The first run is alone for 10 ms at twice the speed (20 ms of its 60 ms of work), then
    # side by side with the second at half speed each (side_by_side 2) until the second's
    # 10 ms of work is done 20 ms later; alone again, its last 30 ms take 15 ms.
    response = floor.as_shipped(
        np.array([0.0, 0.01]), np.array([0.06, 0.01]), np.array([2.0, 2.0]), 2.0
    )
    assert response == pytest.approx([0.045, 0.02])


def test_shipped_rule_queues_a_third_run(floor: ModuleType) -> None:
    response = floor.as_shipped(np.zeros(3), np.full(3, 0.02), np.ones(3), 1.0)
    assert response == pytest.approx([0.02, 0.02, 0.04])


def test_shipped_rule_with_one_model_thread_runs_in_arrival_order(floor: ModuleType) -> None:
    # One core, one model thread (the shipped count on one core): the second waits its turn.
    response = floor.as_shipped(
        np.array([0.0, 0.01]), np.array([0.06, 0.01]), np.ones(2), 2.0, slots=1
    )
    assert response == pytest.approx([0.06, 0.06])
