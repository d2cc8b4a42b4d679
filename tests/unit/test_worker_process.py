"""``WorkerProcess.wait_ready``, which the demo, the broker tests and the benches wait on: a
worker is ready once it holds partitions, not at a group join that assigned it none."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from worker.dev.process import WorkerProcess


def assigned(log: Path, partitions: list[list[object]]) -> None:
    line = {"event": "partitions assigned", "partitions": partitions}
    with log.open("ab") as out:
        out.write(orjson.dumps(line) + b"\n")


def test_ready_means_holding_partitions(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"not json\n")
    worker = WorkerProcess("127.0.0.1:9", log_path=log)  # never started: its log is written here
    assigned(log, [])
    with pytest.raises(TimeoutError, match="partitions assigned"):
        worker.wait_ready(timeout=0.3)
    assigned(log, [["kp.traces.raw", 0]])
    assert worker.wait_ready(timeout=0.3) is worker
