"""A real worker's stages: every published record is observed in each stage of
kp_stage_latency_seconds, and with KP_TIMING_HEADER=true its outputs carry them in kp-timing-ms,
adding up to no more than the time since the record's timestamp."""

from __future__ import annotations

import time
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.dev.process import WorkerProcess
from worker.stream.timing import STAGES, TIMING_HEADER

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.paths import EXAMPLES
from support.workers import worker_topics

pytestmark = pytest.mark.broker


def stage_counts(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kp_stage_latency_seconds_count":
                counts[sample.labels["stage"]] = sample.value
    return counts


def test_a_worker_observes_every_stage_and_puts_them_on_its_outputs(
    kafka_bootstrap: str, new_topic_name
) -> None:
    env, outputs = worker_topics(new_topic_name("timing"), partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()][:4]
    lines.append(b"not json")
    stamped_ms = int(time.time() * 1000)
    produced = produce(
        kafka_bootstrap,
        env["KP_INPUT_TOPIC"],
        [(None, line, 0, None, stamped_ms) for line in lines],
    )
    with WorkerProcess(kafka_bootstrap, KP_TIMING_HEADER="true", **env) as worker:
        found = collect_outputs(kafka_bootstrap, outputs, {(0, p.offset) for p in produced})
        time.sleep(0.5)  # metrics are observed right after the broker's acks
        counts = stage_counts(worker.metrics_port)
    since_ms = time.time() * 1000 - stamped_ms
    assert counts == dict.fromkeys(STAGES, len(lines))
    assert {output.decision for output in found} >= {"dead_letter"}
    for output in found:
        timing = orjson.loads(output.headers[TIMING_HEADER])
        assert list(timing) == [stage for stage in STAGES if stage != "publish"]
        assert all(millis >= 0 for millis in timing.values())
        assert timing["embed"] > 0 or output.decision == "dead_letter"
        assert 0 < sum(timing.values()) <= since_ms
