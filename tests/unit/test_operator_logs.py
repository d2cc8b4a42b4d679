"""Logs an operator can use.

- Every JSON line's ``ts`` is UTC with milliseconds (``2026-11-27T02:21:56.123Z``).
- An error's class is named once, though aiokafka's errors already put it in ``str()``.
- faust's life-cycle narration ("[^--Fetcher]: Stopping...") is demoted to DEBUG: a clean stop
  is a few lines, warnings and errors and our own lines stay.
- The commands a person runs write plain lines, never a library's JSON log line, and Ctrl-C
  leaves no "Unclosed" client behind.
"""

from __future__ import annotations

import io
import logging
import logging.config
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from worker.dev.process import free_loopback_port
from worker.logs import error_line, logging_config
from worker.stream.connectivity import BrokerHealth

from support.paths import REPO


def capture(level: str, human: bool = False) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    config = logging_config(level, human=human)
    config["handlers"]["stderr"]["stream"] = stream
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    logging.config.dictConfig(config)
    try:
        yield stream
    finally:
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
        logging.getLogger("worker").setLevel(logging.NOTSET)


@pytest.fixture
def info_log() -> Iterator[io.StringIO]:
    yield from capture("INFO")


@pytest.fixture
def debug_log() -> Iterator[io.StringIO]:
    yield from capture("DEBUG")


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


# --- timestamps -----------------------------------------------------------------------------


def test_timestamps_are_utc_with_milliseconds(info_log: io.StringIO) -> None:
    before = datetime.now(UTC)
    logging.getLogger("worker.test").info("scorer ready")
    after = datetime.now(UTC)
    (entry,) = lines(info_log)
    ts = str(entry["ts"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ts), ts
    moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= moment <= after


def test_timestamps_do_not_depend_on_the_machine_zone(
    info_log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30: neither the hour nor the minute is UTC's
    time.tzset()
    try:
        record = logging.LogRecord("worker.test", logging.INFO, __file__, 1, "x", None, None)
        record.created = 1_795_746_116.123  # 2026-11-27T02:21:56.123Z
        text = logging.getLogger().handlers[0].format(record)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert orjson.loads(text)["ts"] == "2026-11-27T02:21:56.123Z"


# --- error class names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (KafkaConnectionError("Unable to bootstrap from [('h', 1)]"), "KafkaConnectionError: "),
        (KafkaTimeoutError(), "KafkaTimeoutError"),
        (ConnectionRefusedError(111, "Connect call failed"), "ConnectionRefusedError: "),
        (TimeoutError(), "TimeoutError"),
    ],
)
def test_an_error_is_named_once(error: BaseException, line: str) -> None:
    text = error_line(error)
    name = type(error).__name__
    assert text.startswith(line)
    assert text.count(name) == 1, text


def test_broker_health_names_a_kafka_error_once() -> None:
    health = BrokerHealth()
    health.unreachable(KafkaConnectionError("Unable to bootstrap from [('h', 1)]"))
    assert health.last_error == "KafkaConnectionError: Unable to bootstrap from [('h', 1)]"


def test_the_worker_start_up_retry_names_the_error_once() -> None:
    """The line an operator sees first on a wrong KAFKA_BOOTSTRAP_SERVERS."""
    source = (REPO / "worker" / "io" / "app.py").read_text()
    assert '"error": error_line(exc)' in source
    assert "{type(exc).__name__}: {exc}" not in source


# --- faust's life-cycle narration -----------------------------------------------------------

CHATTER = [
    ("faust.worker", "[^ScorerWorker]: Stopping..."),
    ("faust.transport.consumer", "[^---Fetcher]: Stopping..."),
    ("faust.agents.agent", "[^---Agent: worker.io.app.create_app[.]score]: Stopping..."),
    ("mode.supervisors", "[^----OneForOneSupervisor: (1@0x7f04)]: Stopping..."),
    # mode logs our app's and consumer's services under their module's logger, ours
    ("worker.io.app", "[^-ScorerApp]: Flush producer buffer..."),
    ("worker.io.app", "[^--ScorerConsumer]: Consumer shutting down for user cancel."),
]


def test_a_stop_narrated_by_faust_is_not_in_the_info_log(info_log: io.StringIO) -> None:
    logging.getLogger("worker.io.shutdown").info("shutting down")
    for name, message in CHATTER:
        logging.getLogger(name).info(message)
    logging.getLogger("faust.transport.consumer").warning("[^---Fetcher]: slow fetch")
    logging.getLogger("mode.services").error("[^--Consumer]: crashed")
    logging.getLogger("aiokafka.consumer.group_coordinator").info("(Re-)joining group kp-scorer")
    logging.getLogger("worker.io.app").info("stopped; every published record is committed")
    events = [(e["level"], e["event"]) for e in lines(info_log)]
    assert events == [
        ("info", "shutting down"),
        ("warning", "[^---Fetcher]: slow fetch"),
        ("error", "[^--Consumer]: crashed"),
        ("info", "(Re-)joining group kp-scorer"),
        ("info", "stopped; every published record is committed"),
    ]


def test_at_debug_our_services_narration_is_written_at_debug(debug_log: io.StringIO) -> None:
    for name, message in CHATTER:
        logging.getLogger(name).info(message)
    events = [(e["level"], e["logger"]) for e in lines(debug_log)]
    # Only the lines logged under our own loggers: libraries stay at INFO and up.
    assert events == [("debug", "worker.io.app"), ("debug", "worker.io.app")]


# --- commands a person runs -----------------------------------------------------------------


def command_env(bootstrap: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("KP_")}
    return {**env, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize(
    "args",
    [["replay", "--topic", "t", "--output-prefix", "p"], ["rescore", "--from-topics"]],
    ids=["replay", "rescore"],
)
def test_an_unreachable_broker_is_said_in_plain_lines(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=command_env(f"127.0.0.1:{free_loopback_port()}"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 1, done.stderr
    stderr = [line for line in done.stderr.splitlines() if line.strip()]
    assert not [line for line in stderr if line.lstrip().startswith("{")], done.stderr
    # The clients' own errors name their library; the verdict is the one "kp-scorer:" line.
    assert all(re.match(r"(aiokafka|kp-scorer) (warning|error): ", line) for line in stderr[:-1])
    assert stderr[-1].startswith("kp-scorer: Kafka unreachable at 127.0.0.1:")
    assert "KafkaConnectionError: KafkaConnectionError" not in done.stderr


class SilentBroker:
    """A port that accepts connections and never answers: a broker that hangs."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self.connected = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._held.append(conn)
            self.connected.set()

    def close(self) -> None:
        self._server.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_broker() -> Iterator[SilentBroker]:
    broker = SilentBroker()
    yield broker
    broker.close()


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "--topic", "t", "--output-prefix", "p"],
        ["rescore", "--from-topics", "--quiet"],
        ["rescore", "--from-topics", "--output-prefix", "what-if", "--quiet"],
    ],
    ids=["replay", "rescore", "rescore-publishing"],
)
def test_ctrl_c_leaves_no_unclosed_client_and_exits_130(
    args: list[str], silent_broker: SilentBroker
) -> None:
    """Ctrl-C while the command waits on the broker: exit 130 and one line, every Kafka
    client closed (an unclosed one is an error-level "Unclosed AIOKafka..." line at exit)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        env=command_env(f"127.0.0.1:{silent_broker.port}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        # Ctrl-C as from a shell: a runner started in the background ignores SIGINT, and a
        # command would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert silent_broker.connected.wait(60), "the command never dialled the broker"
        time.sleep(0.5)  # inside the client's start, waiting for an answer
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Unclosed" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted" in stderr.strip().splitlines()[-1], stderr


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--traces", "no-such-file.jsonl"],
        ["score", "no-such-file.jsonl", "--no-embedder", "--quiet"],
        ["rescore", "no-such-file.jsonl", "--quiet"],
    ],
    ids=["demo", "score", "rescore"],
)
def test_a_library_warning_during_a_human_command_is_a_plain_line(
    args: list[str],
    isolated_settings: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from worker.cli.main import main

    assert main(args) == 2
    capsys.readouterr()
    logging.getLogger("aiokafka.conn").warning("Unable connect to %r", "broker:9092")
    err = capsys.readouterr().err
    assert err == "aiokafka warning: Unable connect to 'broker:9092'\n"
    logging.getLogger("worker.io.publisher").warning(
        "publish failed, retrying", extra={"failed": 3}
    )
    assert capsys.readouterr().err == "kp-scorer warning: publish failed, retrying (failed=3)\n"


def test_a_collapsed_line_says_its_count_once_in_plain_lines() -> None:
    from worker.logs import HumanFormatter

    record = logging.makeLogRecord(
        {
            "name": "aiokafka.cluster",
            "levelno": logging.ERROR,
            "levelname": "ERROR",
            "msg": "Unable to update metadata (repeated 198 times in the last 10 s)",
            "repeated": 198,
        }
    )
    assert HumanFormatter().format(record) == (
        "aiokafka error: Unable to update metadata (repeated 198 times in the last 10 s)"
    )
