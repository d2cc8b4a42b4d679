"""The README's producer snippet, run as it is written against a real broker and worker: the
trace reaches the accepted or rejected topic, scored as ``kp-scorer score`` scores the same
record."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from worker.cli.main import main
from worker.dev.process import WorkerProcess

from support.kafka_helpers import consume_all
from support.outputs import collect_outputs
from support.paths import REPO
from support.workers import worker_topics

pytestmark = pytest.mark.broker


def producer_snippet() -> str:
    section = (REPO / "README.md").read_text().split("\n## Publish a trace\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_readme_producer_publishes_a_trace_the_worker_scores(
    kafka_bootstrap: str,
    new_topic_name: Callable[[str], str],
    isolated_settings: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    env, outputs = worker_topics(new_topic_name("readme"), partitions=1)
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        produced = subprocess.run(
            [sys.executable, "-c", producer_snippet()],
            env={
                **worker.env,
                "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                "KP_INPUT_TOPIC": env["KP_INPUT_TOPIC"],
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert produced.returncode == 0, produced.stderr
        (output,) = collect_outputs(kafka_bootstrap, outputs, {(0, 0)})
    assert output.decision in ("accepted", "rejected"), output
    assert output.key == b"agent-42"

    # The record as it is in the input topic, scored offline.
    (record,) = consume_all(kafka_bootstrap, env["KP_INPUT_TOPIC"], 1)
    assert record.value is not None
    trace_file = tmp_path / "trace.jsonl"
    trace_file.write_bytes(record.value + b"\n")
    assert main(["score", "--quiet", str(trace_file)]) == 0
    offline = orjson.loads(capsys.readouterr().out)
    live = output.document
    assert live["trace"]["id"] == "kp:trace:readme-0001"
    assert live["trace"] == offline["trace"]
    assert live["score"] == offline["score"]
    assert live["score"]["decision"] == output.decision
