"""Determinism (c): a second worker joining and leaving mid-stream changes no score: every
record is scored exactly as the offline scorer (e) does, which the continuous worker (a)
equals (``test_determinism.py``, where the five ways are described).
"""

from __future__ import annotations

import pytest

from support.determinism import TRACES, Run, scores_of

pytestmark = pytest.mark.broker


def test_second_worker_joins_and_leaves(kafka_bootstrap: str, scenario, offline) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "c")
    first = run.worker()
    second = None
    try:
        run.wait_published(int(TRACES * 0.25))
        second = run.worker()
        second.wait_ready()
        run.wait_published(int(TRACES * 0.6))
        second.stop()
        outputs = run.collect(expected)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    got_partitions = [
        e.get("partitions") for e in second.events() if e.get("event") == "partitions assigned"
    ]
    print(f"\nsecond worker held {got_partitions}; {len(outputs) - TRACES} duplicates")
    assert any(got_partitions), "the second worker must have owned partitions"
    assert scores_of(outputs) == offline  # (a) == (e) is test_determinism.py's
