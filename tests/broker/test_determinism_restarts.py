"""Determinism (b): a worker SIGKILLed and restarted twice mid-stream scores every record
exactly as the offline scorer (e) does, which the continuous worker (a) equals
(``test_determinism.py``, where the five ways are described).
"""

from __future__ import annotations

import pytest

from support.determinism import PARTITIONS, TRACES, Run, scores_of

pytestmark = pytest.mark.broker


def test_sigkill_and_restart_twice(kafka_bootstrap: str, scenario, offline) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "b")
    worker = run.worker()
    rebuilt = 0
    for fraction in (0.3, 0.6):
        run.wait_published(int(TRACES * fraction))
        worker.kill()
        rebuilt += sum(1 for e in worker.events() if e.get("event") == "rebuilt novelty cache")
        worker = run.worker()
    try:
        outputs = run.collect(expected)
    finally:
        rebuilt += sum(1 for e in worker.events() if e.get("event") == "rebuilt novelty cache")
        worker.stop()
    scores = scores_of(outputs)
    print(f"\nkilled twice: {len(outputs) - TRACES} duplicates, {rebuilt} cache rebuilds")
    assert rebuilt >= PARTITIONS, "restarted workers must rebuild the caches they take over"
    assert scores == offline  # (a) == (e) is test_determinism.py's
