"""`kp-scorer rescore --from-topics` on a live worker's real outputs (embedded broker)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from worker import __version__
from worker.core.score_report import AcceptanceCurve
from worker.dev.process import WorkerProcess

from support.kafka_helpers import ConsumedRecord, consume_all, create_topics, produce
from support.outputs import collect_outputs
from support.paths import EXAMPLES
from support.workers import worker_topics

pytestmark = pytest.mark.broker

TRACES = 40
MALFORMED = [b"not json", b'{"@type": "ReasoningTrace"}']


def from_topics(command: str, bootstrap: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run `kp-scorer COMMAND --from-topics ... --json` as a process; its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", command, "--from-topics", "--json", *args],
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, **env},
        capture_output=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return orjson.loads(done.stdout)  # type: ignore[no-any-return]


def rescore(bootstrap: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    """`kp-scorer rescore --from-topics ... --json`: its summary."""
    return from_topics("rescore", bootstrap, env, *args)


@pytest.fixture(scope="module")
def live(kafka_bootstrap: str) -> tuple[dict[str, str], dict[str, list[ConsumedRecord]]]:
    """A worker's accepted and rejected outputs for 40 traces (repeats included) on 2
    partitions, read back as records: the recorded outputs to re-score."""
    env, outputs = worker_topics(f"rescore-{uuid.uuid4().hex[:8]}", partitions=2)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=2)
    examples = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    lines = [examples[i % 30] for i in range(TRACES)] + MALFORMED
    produced = produce(
        kafka_bootstrap,
        env["KP_INPUT_TOPIC"],
        [(f"k{i}".encode(), line, i % 2, [("origin", b"test")]) for i, line in enumerate(lines)],
    )
    with WorkerProcess(kafka_bootstrap, **env):
        found = collect_outputs(
            kafka_bootstrap, outputs, {(p.partition, p.offset) for p in produced}, timeout=120
        )
    counts = {d: sum(1 for o in found if o.decision == d) for d in outputs.values()}
    assert counts["dead_letter"] == len(MALFORMED)
    assert counts["accepted"] + counts["rejected"] == TRACES
    records = {
        decision: consume_all(
            kafka_bootstrap, env[f"KP_{decision.upper()}_TOPIC"], counts[decision]
        )
        for decision in ("accepted", "rejected")
    }
    return env, records


def by_source(records: list[ConsumedRecord]) -> dict[tuple[int, int], ConsumedRecord]:
    out = {}
    for record in records:
        source = orjson.loads(record.value or b"")["source"]
        out[(source["partition"], source["offset"])] = record
    return out


def test_unchanged_settings_reproduce_every_live_output(kafka_bootstrap: str, live) -> None:
    env, recorded = live
    novelty = {
        orjson.loads(r.value or b"")["score"]["novelty_source"]
        for records in recorded.values()
        for r in records
    }
    assert novelty == {"embedding", "empty_cache"}
    prefix = f"{env['KP_INPUT_TOPIC']}.what-if"
    summary = rescore(kafka_bootstrap, env, "--output-prefix", prefix)
    assert summary["records"] == summary["rescored"] == TRACES
    assert summary["unrescorable"] == {}
    assert summary["score_delta"]["identical"] == TRACES
    assert summary["flips"] == {"accepted_to_rejected": 0, "rejected_to_accepted": 0}

    for decision, records in recorded.items():
        republished = by_source(consume_all(kafka_bootstrap, f"{prefix}.{decision}", len(records)))
        assert len(republished) == len(records)
        for where, live_record in by_source(records).items():
            again = republished[where]
            document = orjson.loads(again.value or b"")
            assert document["scorer"].pop("rescore_of") == __version__
            assert orjson.dumps(document) == live_record.value, f"{where} differs"
            assert again.key == live_record.key
            for header in ("origin", "kp-decision", "kp-score", "kp-scorer-version"):
                assert again.header(header) == live_record.header(header), header
            assert again.header("kp-rescore-of") == __version__.encode()


def test_new_threshold_over_a_range_counts_the_flips(
    kafka_bootstrap: str, live, tmp_path: Path
) -> None:
    env, recorded = live
    in_range = [
        (decision, r)
        for decision, records in recorded.items()
        for r in records
        if r.partition == 0 and r.offset >= 1
    ]
    assert in_range
    output = tmp_path / "rescored.jsonl"
    summary = rescore(
        kafka_bootstrap,
        env,
        "--threshold",
        "0.5",
        "--partitions",
        "0",
        "--from-offset",
        "1",
        "--output",
        str(output),
    )
    scores = [(d, orjson.loads(r.value or b"")["score"]["score"]) for d, r in in_range]
    assert summary["records"] == summary["rescored"] == len(in_range)
    assert summary["decisions"]["before"]["accepted"] == sum(d == "accepted" for d, _ in scores)
    assert summary["flips"] == {
        "accepted_to_rejected": sum(d == "accepted" and s < 0.5 for d, s in scores),
        "rejected_to_accepted": sum(d == "rejected" and s >= 0.5 for d, s in scores),
    }
    written = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    assert len(written) == len(in_range)
    assert all(w["score"]["threshold"] == 0.5 for w in written)
    assert sorted(w["score"]["score"] for w in written) == sorted(s for _, s in scores)


def test_time_range_selects_by_when_outputs_were_published(kafka_bootstrap: str, live) -> None:
    env, recorded = live
    assert rescore(kafka_bootstrap, env, "--from-time", "2999-01-01T00:00:00")["records"] == 0
    assert rescore(kafka_bootstrap, env, "--to-time", "2000-01-01T00:00:00")["records"] == 0
    everything = rescore(kafka_bootstrap, env, "--from-time", "2000-01-01T00:00:00")
    assert everything["records"] == sum(len(records) for records in recorded.values())


def report(bootstrap: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    """`kp-scorer report --from-topics ... --json`: its numbers."""
    return from_topics("report", bootstrap, env, *args)


def test_report_reads_the_three_output_topics_and_agrees_with_rescore(
    kafka_bootstrap: str, live
) -> None:
    env, _ = live
    numbers = report(kafka_bootstrap, env)
    assert numbers["source"] == ", ".join(
        env[f"KP_{name}_TOPIC"] for name in ("ACCEPTED", "REJECTED", "DEAD_LETTER")
    )
    assert numbers["records"] == TRACES + len(MALFORMED)
    assert numbers["scored"] == TRACES
    assert numbers["dead_letters"] == {
        "total": len(MALFORMED),
        "by_kind": {"invalid_json": 1, "schema": 1},
    }
    steps = numbers["acceptance"]["steps"]
    curve = AcceptanceCurve(numbers["scored"], steps["threshold"], steps["accepted"])
    for threshold in (0.3, 0.5, 0.75):
        rescored = rescore(kafka_bootstrap, env, "--threshold", str(threshold))
        assert curve.accepted_at(threshold) == rescored["decisions"]["after"]["accepted"]


def test_rescore_counts_dead_letters_read_from_the_dead_letter_topic(
    kafka_bootstrap: str, live
) -> None:
    """A dead letter is never scored: counted as one, not as an output it cannot re-score."""
    env, recorded = live
    topics = ["--topic", env["KP_ACCEPTED_TOPIC"], "--topic", env["KP_DEAD_LETTER_TOPIC"]]
    summary = rescore(kafka_bootstrap, env, *topics)
    assert summary["dead_letters"] == len(MALFORMED)
    assert summary["unrescorable"] == {}
    assert summary["rescored"] == len(recorded["accepted"])


def over_a_range(
    bootstrap: str, command: str, argv: list[str], *rescore_flags: str
) -> subprocess.CompletedProcess[str]:
    """``replay`` or ``rescore --from-topics`` (with ``rescore_flags``) over ``argv``."""
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", command, *argv]
        + (["--from-topics", *rescore_flags] if command == "rescore" else []),
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("command", ["replay", "rescore"])
def test_a_partition_the_topic_lacks_is_a_bad_range(
    kafka_bootstrap: str, new_topic_name, command: str
) -> None:
    """`replay` and `rescore` plan a range alike: --partitions naming one the topic lacks ends
    at once with that error and exit 2, before any output topic is made."""
    topic = new_topic_name("range")
    create_topics(kafka_bootstrap, [topic], partitions=2)
    prefix = new_topic_name("range-out")
    argv = ["--topic", topic, "--partitions", "1,5", "--output-prefix", prefix]
    done = over_a_range(kafka_bootstrap, command, argv)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip().splitlines()[-1] == f"kp-scorer: topic {topic!r} has no partitions [5]"
    )


@pytest.mark.parametrize("command", ["replay", "rescore"])
def test_a_range_ending_past_the_log_stops_at_its_end(
    kafka_bootstrap: str, new_topic_name, command: str
) -> None:
    """--to-offset past the last record (and so past every record of an empty partition)
    ends the range where the partition ends, as no --to-offset does. It used to wait 30 s for
    records that do not exist, then blame Kafka with exit 1."""
    topic = new_topic_name("past-end")
    create_topics(kafka_bootstrap, [topic], partitions=2)
    examples = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    produce(kafka_bootstrap, topic, [(b"k", line, 0, []) for line in examples[:3]])
    argv = ["--topic", topic, "--to-offset", "1000", "--output-prefix", new_topic_name("out")]
    done = over_a_range(kafka_bootstrap, command, argv, "--json")
    assert done.returncode == 0, done.stderr
    if command == "rescore":  # raw traces: read, and not re-scored
        assert orjson.loads(done.stdout)["records"] == 3
    else:
        assert "replayed 3 records into" in done.stderr


def test_replay_compares_with_the_live_outputs_it_can_read(
    kafka_bootstrap: str, new_topic_name
) -> None:
    """The live output topics are only compared with: a record there that is no output (not
    JSON, an array, a source of the wrong type, no score) is passed over. It used to end the
    replay with exit 2 and the JSON parser's message, as if the range were wrong."""
    topic = new_topic_name("compare")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    examples = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    produce(kafka_bootstrap, topic, [(b"k", examples[0], 0, [])])
    live = {name: new_topic_name(f"live-{name}") for name in ("accepted", "rejected")}
    create_topics(kafka_bootstrap, list(live.values()), partitions=1)
    readable = {"source": {"topic": topic, "partition": 0, "offset": 0}, "score": {"score": 1.0}}
    odd = [
        b"not json",
        b"[1, 2]",
        orjson.dumps({"source": "elsewhere"}),
        orjson.dumps({"source": {"topic": topic, "partition": [0], "offset": 0}}),
        orjson.dumps({"source": {"topic": topic, "partition": 0, "offset": 0}}),
    ]
    produce(
        kafka_bootstrap,
        live["accepted"],
        [(b"k", v, 0, []) for v in [*odd, orjson.dumps(readable)]],
    )
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "KP_ACCEPTED_TOPIC": live["accepted"],
        "KP_REJECTED_TOPIC": live["rejected"],
    }
    argv = ["replay", "--topic", topic, "--output-prefix", new_topic_name("out")]
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert "compared with the live outputs: 1 records" in done.stderr


def test_rescore_writes_no_line_for_dead_letters(
    kafka_bootstrap: str, new_topic_name, tmp_path: Path
) -> None:
    """Dead letters read from a topic are counted, and have no line in --output: a chunk of
    them alone wrote an empty line, which a later `rescore` of the file reads as not JSON."""
    topic = new_topic_name("dead")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    header = [("kp-error-kind", b"invalid_json")]
    produce(kafka_bootstrap, topic, [(b"k", b"not json", 0, header)] * 3)
    output = tmp_path / "rescored.jsonl"
    summary = rescore(kafka_bootstrap, {}, "--topic", topic, "--output", str(output))
    assert summary["dead_letters"] == 3
    assert output.read_bytes() == b""


@pytest.mark.parametrize("command", ["replay", "rescore"])
def test_a_topic_that_does_not_exist_is_a_bad_range_and_is_not_made(
    kafka_bootstrap: str, new_topic_name, command: str
) -> None:
    """A misspelt --topic is said to be missing (exit 2). Asking the broker for it by name
    made it (brokers create topics on first use by default), and the command read it as an
    empty topic: exit 0, 0 records, and a stray topic left on the cluster."""
    topic = new_topic_name("misspelt")
    argv = ["--topic", topic, "--output-prefix", new_topic_name("out")]
    done = over_a_range(kafka_bootstrap, command, argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"kp-scorer: topic {topic!r} does not exist or has no partitions"
    )
    assert topic not in list_topics(kafka_bootstrap)


def list_topics(bootstrap: str) -> list[str]:
    async def listed() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await admin.list_topics()
        finally:
            await admin.close()

    return asyncio.run(listed())


def test_an_output_file_that_cannot_be_written_is_not_blamed_on_kafka(
    kafka_bootstrap: str, new_topic_name
) -> None:
    """`rescore --from-topics --output FILE` on a full disk says so (exit 1): it used to say
    "Kafka unreachable at ...: OSError: [Errno 28] No space left on device"."""
    topic = new_topic_name("full")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    examples = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    produce(kafka_bootstrap, topic, [(b"k", line, 0, []) for line in examples[:3]])
    argv = ["--from-topics", "--topic", topic, "--output", "/dev/full", "--quiet"]
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "rescore", *argv],
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == "kp-scorer: cannot write the output: No space left on device", done.stderr
