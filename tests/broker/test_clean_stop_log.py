"""A clean stop of a real worker, as an operator reads it: a few lines of ours, not faust's
narration of every service it stops, each stamped in UTC with milliseconds; a start that
failed does not end on the clean stop's line; and the signals faust's worker kept for
debugging write no plain text and no record."""

from __future__ import annotations

import re
import signal
import time
import uuid
from pathlib import Path

from worker.dev.process import WorkerProcess

from support.kafka_helpers import consume_all, create_topics, produce
from support.traces import trace_bytes
from support.workers import worker_topics

# Our own lines of a clean stop: "shutting down" and "stopped; ...". Room for two of the Kafka
# client's (leaving the group; on Apache Kafka it may find the group's coordinator again to
# leave it), not for faust's ~20 "[^--Service]: Stopping..." lines.
MOST_STOP_LINES = 4


def test_a_clean_stop_is_a_few_lines_of_ours(kafka_bootstrap: str) -> None:
    env, _ = worker_topics(f"stop-{uuid.uuid4().hex[:8]}", partitions=2)
    worker = WorkerProcess(kafka_bootstrap, **env).start()
    try:
        worker.wait_ready(timeout=120)
        ready_lines = len(worker.log_text().splitlines())
        worker.signal(signal.SIGTERM)
        assert worker.process is not None
        code = worker.process.wait(60)
    finally:
        worker.stop()
    lines = worker.log_text().splitlines()
    stop = worker.events()[ready_lines:]
    assert code == 0, worker.tail()
    assert len(lines) - ready_lines == len(stop), "every line is JSON"
    events = [e["event"] for e in stop]
    assert "shutting down" in events
    assert events[-1] == "stopped; every published record is committed"
    assert len(stop) <= MOST_STOP_LINES, events
    assert not [
        e for e in worker.events() if str(e["event"]).endswith(("Starting...", "Stopping..."))
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(e["ts"])) for e in stop)


def test_a_failed_start_does_not_log_a_clean_stop(kafka_bootstrap: str) -> None:
    """A model the worker is told it needs cannot be loaded: the start fails and the process
    exits 1, and its last line must not say ``stopped; every published record is committed``
    with ``exit_code`` 0 (it did, after the error)."""
    env, _ = worker_topics(f"failed-start-{uuid.uuid4().hex[:8]}", partitions=1)
    not_a_model = Path(__file__).resolve().parents[2] / "NOTICE"
    worker = WorkerProcess(
        kafka_bootstrap, KP_EMBEDDER_REQUIRED="true", KP_MODEL_PATH=str(not_a_model), **env
    ).start()
    try:
        assert worker.process is not None
        code = worker.process.wait(120)
    finally:
        worker.stop()
    events = worker.events()
    assert code == 1, worker.tail()
    assert any("cannot be loaded" in str(e["event"]) for e in events), worker.tail()
    clean = [e for e in events if e["event"] == "stopped; every published record is committed"]
    assert not clean, worker.tail()


def test_sigusr1_and_sigusr2_write_no_record_and_no_plain_text(kafka_bootstrap: str) -> None:
    """faust's worker answered SIGUSR1 (which log rotation tools send) with every thread's
    and task's local variables in plain text on stderr, records' values and keys among them,
    and SIGUSR2 with a debugger on the event loop. Both are now one warning line each, and
    the worker scores on."""
    marker = f"MARKER{uuid.uuid4().hex}"
    env, outputs = worker_topics(f"usr-{uuid.uuid4().hex[:8]}", partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    records = [
        (marker, trace_bytes(objective=f"{marker} {i} " + "word " * 120), 0, None)
        for i in range(300)
    ]
    with WorkerProcess(kafka_bootstrap, KP_EMBED_CONCURRENCY="1", **env) as worker:
        worker.wait_ready(timeout=120)
        produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], records)
        deadline = time.monotonic() + 60
        while not any(consume_all(kafka_bootstrap, t, 0, extra_wait=0.2) for t in outputs):
            assert time.monotonic() < deadline, worker.tail()
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1):
            worker.signal(signum)  # while records are in flight
            time.sleep(0.5)
        time.sleep(1)
        lines = worker.log_text().splitlines()
        leaked = [line for line in lines if marker in line]
        assert not leaked, f"{len(leaked)} lines with a record's contents: {leaked[0][:300]}"
        assert len(worker.events()) == len(lines), [x for x in lines if not x.startswith("{")][:5]
        assert worker.alive(), worker.tail()
        assert worker.process is not None
        worker.signal(signal.SIGTERM)
        code = worker.process.wait(60)
    assert code == 0, worker.tail()
    ignored = [e["signal"] for e in worker.events() if e["event"] == "signal ignored"]
    assert ignored == ["SIGUSR1", "SIGUSR2", "SIGUSR1"], ignored
