"""A backlog larger than the fetch buffer: fetching pauses, resumes, and loses nothing."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.paths import EXAMPLES
from support.workers import metric_total, worker_topics

pytestmark = pytest.mark.broker

PARTITIONS = 2


def traces(count: int, tag: str) -> list[bytes]:
    """The examples replicated, each with an id of its own (texts repeat: vectors are reused)."""
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    records = []
    for index in range(count):
        document = orjson.loads(lines[index % len(lines)])
        document["id"] = f"kp:trace:flow-{tag}-{index}-{uuid.uuid4().hex[:6]}"
        records.append(orjson.dumps(document))
    return records


def produce_spread(bootstrap: str, topic: str, values: list[bytes]) -> set[tuple[int, int]]:
    produced = produce(
        bootstrap, topic, [(None, value, i % PARTITIONS, []) for i, value in enumerate(values)]
    )
    return {(p.partition, p.offset) for p in produced}


def metric(worker: WorkerProcess, name: str) -> float:
    return metric_total(worker.metrics_port, name)


def test_backlog_pauses_fetching_then_resumes_and_scores_every_record_once(
    kafka_bootstrap: str, new_topic_name
) -> None:
    env, outputs = worker_topics(
        new_topic_name("flow"),
        partitions=PARTITIONS,
        # Room for 8 records taken from the broker: fetching pauses above 6 waiting.
        KP_FETCH_BUFFER_RECORDS="8",
        KP_MAX_IN_FLIGHT_RECORDS="2",
    )
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=PARTITIONS)
    backlog = produce_spread(kafka_bootstrap, env["KP_INPUT_TOPIC"], traces(120, "backlog"))

    with WorkerProcess(kafka_bootstrap, **env) as worker:
        collect_outputs(kafka_bootstrap, outputs, backlog, timeout=120, settle=0)
        assert metric(worker, "kp_fetch_pauses_total") >= 1, "the backlog never paused fetching"
        # The buffer drained: every partition is fetched again, so new records are scored.
        deadline = time.monotonic() + 10
        while metric(worker, "kp_fetch_paused_partitions") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(worker, "kp_fetch_paused_partitions") == 0
        later = produce_spread(kafka_bootstrap, env["KP_INPUT_TOPIC"], traces(10, "later"))
        found = collect_outputs(kafka_bootstrap, outputs, backlog | later, timeout=60)
        assert worker.alive

    sources = [(o.source_partition, o.source_offset) for o in found]
    assert len(sources) == len(set(sources)), "a record was published twice"
    assert set(sources) == backlog | later, "a record was lost"
    assert all(o.decision != "dead_letter" for o in found)
