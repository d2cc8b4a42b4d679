"""Schema Registry framing on a real broker: a worker scores a framed record as its document.

Partition 0 carries plain JSON traces, partition 1 the same traces framed by
``confluent_kafka``'s JSON serializer (mock registry), in the same order: each partition has
its own novelty cache, so every pair must come out alike, score, decision and novelty, but for
``source.schema_id``. ``kp-scorer replay`` of the same topic then gives the same outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from worker.core.output import prefixed_topics
from worker.core.records import Decision
from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs, first_by_source
from support.registry import Registry, schema_id_of
from support.traces import varied_traces
from support.workers import worker_topics

pytestmark = pytest.mark.broker

TRUNCATED_FRAME = b"\x00\x00\x00\x11"  # magic byte and 3 of the 4 schema-id bytes


def test_framed_and_plain_records_score_alike_on_a_worker(
    kafka_bootstrap: str, new_topic_name
) -> None:
    env, outputs = worker_topics(new_topic_name("framing"), partitions=2)
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic], partitions=2)
    documents = varied_traces(10)
    documents.append(documents[3])  # an exact repeat: novelty from the cache, on both
    lines = [orjson.dumps(document) for document in documents]
    registry = Registry()
    framed = [registry.frame(document, topic) for document in documents]
    records = [(b"plain", line, 0, None) for line in lines]
    records += [(b"framed", value, 1, [("origin", b"registry")]) for value in framed]
    records.append((b"cut", TRUNCATED_FRAME, 1, None))
    produced = produce(kafka_bootstrap, topic, records)
    expected = {(p.partition, p.offset) for p in produced}

    with WorkerProcess(kafka_bootstrap, **env) as worker:
        found = collect_outputs(kafka_bootstrap, outputs, expected, timeout=90)
        assert worker.process is not None and worker.process.poll() is None

    assert len(found) == len(records), "each record published exactly once"
    by_source = first_by_source(found)
    for offset, value in enumerate(framed):
        plain_out, framed_out = by_source[(0, offset)], by_source[(1, offset)]
        assert framed_out.decision == plain_out.decision != "dead_letter"
        assert framed_out.headers["origin"] == b"registry"
        assert framed_out.headers["kp-score"] == plain_out.headers["kp-score"]
        plain_doc, framed_doc = plain_out.document, framed_out.document
        assert framed_doc["source"].pop("schema_id") == schema_id_of(value)
        assert "schema_id" not in plain_doc["source"]
        assert framed_doc["source"]["partition"] == 1
        framed_doc["source"] = plain_doc["source"] = None
        assert framed_doc == plain_doc, f"offset {offset}: framed scored otherwise"
    repeat = by_source[(1, len(framed) - 1)].document["score"]
    assert repeat["novelty_source"] == "embedding" and repeat["dimensions"]["novelty"] < 0.01

    cut = by_source[(1, len(framed))]
    assert cut.decision == "dead_letter"
    assert cut.value == TRUNCATED_FRAME, "the bytes as received"
    assert cut.headers["kp-error-kind"] == b"framing"
    assert b"cut short" in cut.headers["kp-error-reason"]

    # `replay` decodes as the worker does: the same outputs, schema ids included.
    prefix = f"{topic}.replayed"
    replay = subprocess.run(
        [sys.executable, "-m", "worker.cli", "replay", "--topic", topic, "--output-prefix", prefix],
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert replay.returncode == 0, replay.stderr[-2000:]
    replayed_topics = {prefixed_topics(prefix)[d]: d.value for d in Decision}
    replayed = first_by_source(collect_outputs(kafka_bootstrap, replayed_topics, expected))
    for source, output in by_source.items():
        again = replayed[source]
        assert again.decision == output.decision, source
        if output.decision == "dead_letter":
            assert again.value == output.value
            assert again.headers["kp-error-kind"] == output.headers["kp-error-kind"]
        else:
            assert again.document == output.document, source


@pytest.mark.parametrize(
    ("framing", "dead_lettered", "kind"),
    [("json", "framed", b"invalid_json"), ("confluent", "plain", b"framing")],
)
def test_a_framing_mode_dead_letters_the_other_form(
    kafka_bootstrap: str, new_topic_name, framing: str, dead_lettered: str, kind: bytes
) -> None:
    """``json`` reads a framed record as text (``invalid_json``), as before framing existed;
    ``confluent`` dead-letters a plain one. The other form is scored."""
    env, outputs = worker_topics(
        new_topic_name(f"framing-{framing}"), partitions=1, KP_INPUT_FRAMING=framing
    )
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic], partitions=1)
    document = varied_traces(1)[0]
    values = {"plain": orjson.dumps(document), "framed": Registry().frame(document, topic)}
    produced = produce(
        kafka_bootstrap, topic, [(k.encode(), v, 0, None) for k, v in values.items()]
    )
    with WorkerProcess(kafka_bootstrap, **env):
        found = collect_outputs(kafka_bootstrap, outputs, {(0, p.offset) for p in produced})
    assert len(found) == 2
    by_key = {output.key: output for output in found}
    for form, value in values.items():
        output = by_key[form.encode()]
        if form == dead_lettered:
            assert output.decision == "dead_letter"
            assert output.headers["kp-error-kind"] == kind
            assert output.value == value, "the bytes as received"
        else:
            assert output.decision in ("accepted", "rejected")
