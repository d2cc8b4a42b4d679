"""/healthz, /readyz and lag on a real worker whose consume loop stops.

The worker is the real one; a start-up hook (a ``sitecustomize`` module on its path) makes
the consume loop hang for good on the record keyed ``hang``, as a deadlock would. The event
loop keeps running, so only the consume-loop check can notice.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.paths import EXAMPLES
from support.workers import worker_topics

pytestmark = pytest.mark.broker

STALL_SECONDS = 4.0
T = TypeVar("T")

HANG_ON_KEY = """
import asyncio

from worker.stream import processor

_submit = processor.StreamScorer.submit


async def submit(self, delivered, *args, **kwargs):
    if any(record.key == b"hang" for record in delivered):
        await asyncio.Event().wait()  # never set
    return await _submit(self, delivered, *args, **kwargs)


processor.StreamScorer.submit = submit
"""


def _get(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, orjson.loads(body) if path != "/metrics" else body.decode()


def _lag(port: int) -> tuple[float, float]:
    _, text = _get(port, "/metrics")
    assert isinstance(text, str)

    def value(name: str) -> float:
        found = re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
        return max((float(v) for v in found), default=-1.0)

    return value("kp_consumer_lag_records"), value("kp_consumer_lag_seconds")


def _wait(condition: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_stopped_consume_loop_fails_healthz_and_its_lag_grows(
    kafka_bootstrap: str, new_topic_name, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(HANG_ON_KEY)
    env, outputs = worker_topics(
        new_topic_name("health"),
        partitions=1,
        KP_HEALTH_STALL_SECONDS=str(STALL_SECONDS),
        KP_SHUTDOWN_TIMEOUT_SECONDS="5",
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    )
    topic = env["KP_INPUT_TOPIC"]
    create_topics(kafka_bootstrap, [topic], partitions=1)
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()][:3]
    worker = WorkerProcess(kafka_bootstrap, **env)
    with worker:
        port = worker.metrics_port
        worker.wait_ready()
        assert _wait(lambda: _get(port, "/readyz")[0] == 200, 30, "ready")
        produce(kafka_bootstrap, topic, [(None, line, 0, None) for line in lines])
        collect_outputs(kafka_bootstrap, outputs, {(0, i) for i in range(3)}, settle=0)
        assert _wait(lambda: _lag(port) == (0.0, 0.0), 15, "lag 0 once caught up")
        assert _get(port, "/healthz")[0] == 200

        # One record per batch: the embedded broker reports a partition's end as its last
        # batch's first offset + 1.
        for key, line in [(b"hang", lines[0]), *((None, line) for line in lines)]:
            produce(kafka_bootstrap, topic, [(key, line, 0, None)])
        _, first_seconds = _wait(
            lambda: (lag := _lag(port))[0] == 4 and lag, 15, "the probe to see 4 records behind"
        )
        _, verdict = _wait(
            lambda: (answer := _get(port, "/healthz"))[0] == 503 and answer,
            STALL_SECONDS + 15,
            "/healthz to fail",
        )
        assert isinstance(verdict, dict) and verdict["status"] == "failing"
        assert "records waiting" in verdict["checks"]["consume_loop"], verdict
        assert verdict["checks"]["event_loop"] == "ok", "the event loop itself still runs"
        time.sleep(2.5)
        later_records, later_seconds = _lag(port)
        assert later_records == 4
        assert later_seconds >= first_seconds + 2, "lag seconds keep growing while stuck"
        assert _get(port, "/readyz")[0] == 200, "readiness is not liveness"
        started = time.monotonic()
        code = worker.stop(timeout=20)
        assert time.monotonic() - started < 5 + 6, "a hung worker still stops by its deadline"
    print(f"\n/healthz failing: {verdict}; lag {later_records:.0f} records, {later_seconds:.1f} s")
    assert code == 0, "what it published was committed, so the stop is clean"
