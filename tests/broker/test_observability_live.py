"""What a real worker's logs and metrics tell an operator, on the broker.

- At ``KP_LOG_LEVEL=DEBUG`` no log line holds a record's content: a marker string placed in
  the values (a valid trace, invalid JSON, a schema failure), in the keys and in the header
  values of records (a tombstone too) appears nowhere in the worker's stdout or stderr.
- A record whose CreateTime is an hour ahead cannot hold ``kp_consumer_lag_seconds`` at 0
  while the records after it wait, and it is counted in ``kp_future_timestamps_total``.
- While the worker scores a backlog, 200 idle connections to its metrics port cost it no
  thread each and /metrics still answers promptly.
"""

from __future__ import annotations

import os
import re
import socket
import time
import urllib.request
import uuid

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.traces import make_trace, step
from support.workers import metric_total, worker_topics

pytestmark = pytest.mark.broker


def _records_with(marker: str) -> list[tuple]:
    """(key, value, partition, headers): the marker in every value, key and header value."""
    headers = [("origin", f"agent {marker}".encode())]
    valid = orjson.dumps(
        make_trace(
            objective=f"Objective {marker}",
            steps=[step(0, "thought", f"thinking {marker}"), step(1, "observation", marker)],
            metadata={"agent_id": marker},
        )
    )
    schema_failure = orjson.dumps(make_trace(objective=f"Objective {marker}", steps=[]))
    invalid_json = b'{"task": {"objective": "' + marker.encode() + b'", '
    return [
        (f"key-{marker}-valid".encode(), valid, 0, headers),
        (f"key-{marker}-json".encode(), invalid_json, 0, headers),
        (f"key-{marker}-schema".encode(), schema_failure, 0, headers),
        (f"key-{marker}-tombstone".encode(), None, 0, headers),
        (None, valid, 0, None),
    ]


def test_debug_logs_hold_no_record_content(kafka_bootstrap: str, new_topic_name) -> None:
    marker = f"KPMARKER{uuid.uuid4().hex}"
    env, outputs = worker_topics(
        new_topic_name("logs"), partitions=1, KP_LOG_LEVEL="DEBUG", KP_EMBED_CONCURRENCY="1"
    )
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    records = _records_with(marker)
    worker = WorkerProcess(kafka_bootstrap, **env)
    with worker:
        worker.wait_ready()
        produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], records)
        got = collect_outputs(kafka_bootstrap, outputs, {(0, i) for i in range(len(records))})
        decisions = sorted(o.decision for o in got)
        # A commit and a fetch at DEBUG after the outputs: what the client logs about them too.
        time.sleep(2)
    text = worker.log_text()
    assert decisions.count("dead_letter") == 3, decisions
    assert any(o.value and marker.encode() in o.value for o in got), "the marker went through"
    published = [e for e in worker.events() if e.get("event") == "record published"]
    assert len(published) >= len(records), "DEBUG was in effect: a line per record"
    assert {e["level"] for e in published} == {"debug"}
    lines = [line for line in text.splitlines() if marker in line]
    assert not lines, f"{len(lines)} log lines hold record content, e.g. {lines[0][:300]}"
    print(f"\n{len(text.splitlines())} log lines at DEBUG ({len(text)} bytes), none with content")


def _lag_seconds(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r"^kp_consumer_lag_seconds\{[^}]*\} (\S+)$", text, re.M)
    return max((float(v) for v in found), default=-1.0)


HOLD_ON_KEY = """
import asyncio

from worker.stream import processor

_submit = processor.StreamScorer.submit


async def submit(self, delivered, *args, **kwargs):
    if any(record.key == b"hold" for record in delivered):
        await asyncio.Event().wait()  # never set
    return await _submit(self, delivered, *args, **kwargs)


processor.StreamScorer.submit = submit
"""


def test_a_future_timestamp_does_not_pin_lag_seconds(
    kafka_bootstrap: str, new_topic_name, tmp_path
) -> None:
    """An hour-ahead record is scored; then the consume loop holds the next record for good
    (a start-up hook), so lag seconds must grow with the wait instead of staying at 0."""
    (tmp_path / "sitecustomize.py").write_text(HOLD_ON_KEY)
    env, outputs = worker_topics(
        new_topic_name("future"),
        partitions=1,
        KP_EMBED_CONCURRENCY="1",
        KP_SHUTDOWN_TIMEOUT_SECONDS="5",
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    )
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic], partitions=1)
    trace = orjson.dumps(make_trace())
    now_ms = int(time.time() * 1000)
    worker = WorkerProcess(kafka_bootstrap, **env)
    with worker:
        port = worker.metrics_port
        worker.wait_ready()
        before = metric_total(port, "kp_future_timestamps_total")
        produce(kafka_bootstrap, topic, [(None, trace, 0, None, now_ms + 3_600_000)])
        collect_outputs(kafka_bootstrap, outputs, {(0, 0)}, settle=0)
        # One record per batch: the embedded broker reports a partition's end as its last
        # batch's first offset + 1.
        for key in (b"hold", None, None):
            produce(kafka_bootstrap, topic, [(key, trace, 0, None)])
        deadline = time.monotonic() + 20
        seconds = -1.0
        while time.monotonic() < deadline:
            seconds = _lag_seconds(port)
            if seconds >= 4:
                break
            time.sleep(0.5)
        counted = metric_total(port, "kp_future_timestamps_total") - before
    assert seconds >= 4, f"lag seconds {seconds} while records wait behind an hour-ahead record"
    assert seconds < 600, "the hour ahead is not subtracted either"
    assert counted == 1


def test_a_record_without_a_timestamp_adds_no_latency_from_1970(
    kafka_bootstrap: str, new_topic_name
) -> None:
    """Kafka gives a record without a timestamp (one an old-format producer wrote) as -1: it
    is scored, and its time in the topic is not measured from the epoch."""
    env, outputs = worker_topics(
        new_topic_name("nots"), partitions=1, KP_EMBED_CONCURRENCY="1", KP_TIMING_HEADER="true"
    )
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic], partitions=1)
    worker = WorkerProcess(kafka_bootstrap, **env)
    with worker:
        worker.wait_ready()
        produce(kafka_bootstrap, topic, [(None, orjson.dumps(make_trace()), 0, None, -1)])
        (out,) = collect_outputs(kafka_bootstrap, outputs, {(0, 0)}, settle=0)
        end_to_end = metric_total(worker.metrics_port, "kp_end_to_end_latency_seconds_sum")
        fetch = metric_total(worker.metrics_port, "kp_stage_latency_seconds_sum")
    assert out.decision in ("accepted", "rejected")
    assert orjson.loads(out.value)["source"]["timestamp"] == -1, "kept as received"
    assert "fetch" not in orjson.loads(out.headers["kp-timing-ms"]), out.headers
    assert end_to_end == 0, "no end-to-end latency without a timestamp"
    assert fetch < 60, f"stage latencies sum to {fetch} s"


def test_metrics_answer_while_scoring_a_backlog_with_idle_connections_open(
    kafka_bootstrap: str, new_topic_name
) -> None:
    """200 idle connections cost the worker no thread each, and scrapes are answered promptly
    while the model works through a backlog."""
    env, _ = worker_topics(new_topic_name("busy"), partitions=1, KP_EMBED_CONCURRENCY="1")
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic], partitions=1)
    traces = [
        orjson.dumps(make_trace(objective=f"Backlog objective number {i} " + "detail " * 40))
        for i in range(500)
    ]
    worker = WorkerProcess(kafka_bootstrap, **env)
    with worker:
        port, pid = worker.metrics_port, worker.pid
        worker.wait_ready()
        produce(kafka_bootstrap, topic, [(None, t, 0, None) for t in traces])
        deadline = time.monotonic() + 60
        while metric_total(port, "kp_records_total") < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        before = len(os.listdir(f"/proc/{pid}/task"))
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
        try:
            time.sleep(0.5)
            during = len(os.listdir(f"/proc/{pid}/task"))
            scrapes = []
            for _ in range(5):
                started = time.monotonic()
                scored = metric_total(port, "kp_records_total")
                scrapes.append(time.monotonic() - started)
                time.sleep(0.2)
        finally:
            for sock in idle:
                sock.close()
        # the rest of the backlog is not this test's: a SIGTERM mid-backlog exits cleanly
        assert worker.stop() == 0, worker.tail()
    assert during <= before + 2, f"{before} threads before, {during} with 200 idle connections"
    assert scored < len(traces), "the scrapes came while the backlog was being scored"
    assert max(scrapes) < 1.0, scrapes
    print(f"\nthreads {before} -> {during}; scrapes took {[round(s, 3) for s in scrapes]} s")
