"""A real worker writes JSON lines only, on stdout and stderr alike: no Faust banner, no
terminal spinner, and an unknown ``KP_*`` variable is one JSON warning like any other log."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.workers import worker_topics

pytestmark = pytest.mark.broker


class TerminalWorker(WorkerProcess):
    """A worker whose stdout is a terminal (a pseudo-terminal read here); stderr goes to the
    log as usual. Faust draws its banner and spinner only where it finds a terminal or stdout."""

    def start(self) -> TerminalWorker:
        self.terminal = bytearray()
        master, child_end = os.openpty()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "worker"],
                env=self.env,
                stdout=child_end,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        os.close(child_end)
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()
        return self

    def _read(self, master: int) -> None:
        """Drain the terminal (a full one would block the worker) until the worker exits."""
        try:
            while chunk := os.read(master, 4096):
                self.terminal.extend(chunk)
        except OSError:  # EIO: the worker's end is closed
            pass
        finally:
            os.close(master)

    def stop(self, timeout: float = 30.0) -> int | None:
        code = super().stop(timeout)
        self._reader.join(10)
        return code


def json_object(line: str) -> dict[str, object] | None:
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return entry if isinstance(entry, dict) else None


def assert_json_lines(output: bytes, what: str) -> list[dict[str, object]]:
    """Every line a JSON object (a log collector parses each line on its own), parsed."""
    lines = output.decode(errors="replace").splitlines()
    bad = [line for line in lines if json_object(line) is None]
    assert bad == [], f"{what}: lines that are not JSON objects:\n" + "\n".join(bad[:20])
    return [orjson.loads(line) for line in lines]


def test_worker_output_is_json_lines_only(
    kafka_bootstrap: str, new_topic_name: Callable[[str], str]
) -> None:
    """stdout and stderr together (WorkerProcess's log), at the default log level."""
    env, _ = worker_topics(new_topic_name("json-out"), partitions=1)
    worker = WorkerProcess(kafka_bootstrap, **env, KP_ACCEPT_TRESHOLD="0.5")
    with worker:
        worker.wait_ready()
    output = worker.log_path.read_bytes()
    entries = assert_json_lines(output, "stdout+stderr")
    assert b"\xc6\x92a\xc2\xb5S" not in output  # the banner's "ƒaµS" title
    assert any(e["event"] == "partitions assigned" for e in entries)
    warnings = [e for e in entries if e.get("variable") == "KP_ACCEPT_TRESHOLD"]
    assert len(warnings) == 1, warnings
    assert warnings[0]["level"] == "warning"
    assert warnings[0]["did_you_mean"] == "KP_ACCEPT_THRESHOLD"


def wait_serving(port: int, timeout: float = 90.0) -> None:
    """Until the worker answers on its metrics port: past start-up, where Faust would draw."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing served on port {port} within {timeout} s")


def test_worker_draws_nothing_on_a_terminal(
    kafka_bootstrap: str, new_topic_name: Callable[[str], str]
) -> None:
    """At WARNING (``warning``: any case) Faust would draw a spinner on a terminal's stdout."""
    env, _ = worker_topics(new_topic_name("json-tty"), partitions=1)
    worker = TerminalWorker(kafka_bootstrap, **env, KP_LOG_LEVEL="warning")
    with worker:
        wait_serving(worker.metrics_port)
        time.sleep(2)  # the group join: more log records, each of which would turn the spinner
        assert worker.alive(), worker.tail()
    assert bytes(worker.terminal) == b"", bytes(worker.terminal)[:300]
    assert_json_lines(worker.log_path.read_bytes(), "stderr")
