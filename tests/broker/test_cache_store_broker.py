"""The novelty cache store: a partition's next owner reads its cache back from the store
instead of embedding it, and falls back to embedding whatever the store cannot vouch for, with
every score equal to the offline scorer's (the determinism scenario, support/determinism.py:
600 traces over three partitions, a 50-vector cache and an event-time TTL that each decide
scores).

Four workers of one group take turns on the input, each stopped cleanly part way:
- the first starts cold (nothing committed: no cache to rebuild) and stores an entry per trace;
- the second restores every cache from the store, embedding nothing;
- the third has another embedder identity (two model threads a run instead of one): no entry
  of the store is its own, so it embeds every cache;
- the fourth is given a store topic that holds nothing (a store deleted and created anew):
  it embeds every cache too.
"""

from __future__ import annotations

import uuid

import pytest

from support.determinism import TRACES, Run, scores_of

pytestmark = pytest.mark.broker


def _rebuilds(worker) -> list[dict[str, object]]:
    return [e for e in worker.events() if e.get("event") == "rebuilt novelty cache"]


def test_a_new_owner_restores_caches_from_the_store_and_falls_back_to_embedding(
    kafka_bootstrap: str, scenario, offline
) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, f"store-{uuid.uuid4().hex[:6]}")
    run.env["KP_CACHE_STORE_TOPIC"] = f"{input_topic}.{run.name}.cache"
    turns = [
        (0.25, {}),
        (0.5, {}),
        (0.7, {"KP_EMBED_THREADS": "2"}),
        (None, {"KP_CACHE_STORE_TOPIC": f"{input_topic}.{run.name}.empty-cache"}),
    ]
    rebuilds = []
    for until, env in turns:
        worker = run.worker_with(env)
        try:
            if until is None:
                outputs = run.collect(expected)
            else:
                run.wait_published(int(TRACES * until))
        finally:
            assert worker.stop() == 0, worker.tail()
        rebuilds.append(_rebuilds(worker))
    cold, restored, other_identity, empty_store = rebuilds
    for name, rebuilt in zip(
        ("restored", "other identity", "empty store"), rebuilds[1:], strict=True
    ):
        print(name, [(r["partition"], r["restored"], r["embedded"], r["seconds"]) for r in rebuilt])
    assert cold == []
    assert restored and all(r["embedded"] == 0 and r["restored"] for r in restored), restored
    for rebuilt in (other_identity, empty_store):
        assert rebuilt and all(r["restored"] == 0 and r["embedded"] for r in rebuilt), rebuilt
    assert scores_of(outputs) == offline
