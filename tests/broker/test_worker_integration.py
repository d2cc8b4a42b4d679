"""The stream worker on a real broker: routing, keys, headers, determinism, restarts."""

from __future__ import annotations

import io
import time
import uuid

import orjson
import pytest

from worker.cli.score import score_lines
from worker.core.records import LineRecords
from worker.core.scorer import build_scorer
from worker.dev.process import WorkerProcess
from worker.settings import load_settings

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs, first_by_source
from support.paths import EXAMPLES
from support.workers import worker_topics

pytestmark = pytest.mark.broker

MALFORMED = {
    b"not json at all": "invalid_json",
    b'{"@type": "ReasoningTrace"}': "schema",
    b"[1, 2]": "not_object",
    b'{"a": 1, "a": 2}': "duplicate_key",
}


@pytest.fixture(scope="module")
def offline_scorer():
    return build_scorer(load_settings())


def offline_scores(scorer, lines: list[bytes]) -> list[float | None]:
    """What `kp-scorer score` prints for these lines, as scores (None for error lines)."""
    scorer.caches.drop(("offline", 0))
    out = io.StringIO()
    score_lines(scorer, lines, out, LineRecords("offline", None))
    results = [orjson.loads(line) for line in out.getvalue().splitlines()]
    return [None if "error" in r else r["score"]["score"] for r in results]


def sample_lines(count: int) -> list[bytes]:
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    return [lines[i % len(lines)] for i in range(count)]


def unique_text(line: bytes, number: int) -> bytes:
    trace = orjson.loads(line)
    trace["task"]["objective"] += f" (run {number})"
    return orjson.dumps(trace)


def test_mixed_batch_is_routed_exactly_once_and_scores_match_offline(
    kafka_bootstrap: str, new_topic_name, offline_scorer
) -> None:
    env, outputs = worker_topics(new_topic_name("mix"), partitions=1)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    valid = sample_lines(24)
    valid.append(valid[2])  # an exact repeat: novelty must collapse
    lines: list[bytes | None] = list(valid)
    for position, bad in zip((3, 9, 15, 21), MALFORMED, strict=True):
        lines.insert(position, bad)
    lines.insert(12, None)  # a tombstone in the middle of a batch
    keys = [f"key-{i}".encode() for i in range(len(lines))]
    produced = produce(
        kafka_bootstrap,
        env["KP_INPUT_TOPIC"],
        [(k, v, 0, [("origin", b"test")]) for k, v in zip(keys, lines, strict=True)],
    )
    offsets = [p.offset for p in produced]

    with WorkerProcess(kafka_bootstrap, **env) as worker:
        found = collect_outputs(kafka_bootstrap, outputs, {(0, o) for o in offsets}, timeout=90)
        assert worker.process is not None and worker.process.poll() is None

    by_source = first_by_source(found)
    assert len(found) == len(lines), "a clean run publishes each record exactly once"
    expected_scores = offline_scores(offline_scorer, [line or b"" for line in lines])
    print(
        f"\n{len(lines)} inputs -> "
        + ", ".join(f"{d}={sum(1 for o in found if o.decision == d)}" for d in outputs.values())
    )
    for index, (offset, line) in enumerate(zip(offsets, lines, strict=True)):
        output = by_source[(0, offset)]
        assert output.key == keys[index]
        assert output.headers["origin"] == b"test"
        if line is None or line in MALFORMED:
            assert output.decision == "dead_letter"
            assert output.value == line
            kind = "empty" if line is None else MALFORMED[line]
            assert output.headers["kp-error-kind"] == kind.encode()
            assert output.headers["kp-error-reason"]
            assert output.headers["kp-source-topic"] == env["KP_INPUT_TOPIC"].encode()
            assert output.headers["kp-source-offset"] == str(offset).encode()
            assert output.headers["kp-scorer-version"]
            continue
        document = output.document
        score = document["score"]
        assert score["score"] == expected_scores[index], f"line {index}: differs from offline"
        assert document["trace"]["metadata"]["quality_score"] == score["score"]
        assert output.decision == ("accepted" if score["score"] >= 0.75 else "rejected")
        assert score["decision"] == output.decision
        assert output.headers["kp-decision"] == output.decision.encode()
        assert float(output.headers["kp-score"]) == score["score"]
        assert document["scorer"]["model"]
        assert document["source"] == {
            "topic": env["KP_INPUT_TOPIC"],
            "partition": 0,
            "offset": offset,
            "timestamp": document["source"]["timestamp"],
        }
    repeat = by_source[(0, offsets[-1])].document["score"]
    assert repeat["novelty_source"] == "embedding"
    assert repeat["dimensions"]["novelty"] < 0.01


def test_partitions_keep_separate_caches(kafka_bootstrap: str, new_topic_name) -> None:
    env, outputs = worker_topics(new_topic_name("iso"), partitions=2)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=2)
    trace = orjson.loads(sample_lines(1)[0])
    records = []
    for partition in (0, 1, 0):
        trace["id"] = f"kp:trace:{uuid.uuid4()}"
        records.append((None, orjson.dumps(trace), partition, None))
    produced = produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], records)
    with WorkerProcess(kafka_bootstrap, **env):
        found = first_by_source(
            collect_outputs(kafka_bootstrap, outputs, {(p.partition, p.offset) for p in produced})
        )
    first_p0, first_p1, second_p0 = (
        found[(p.partition, p.offset)].document["score"] for p in produced
    )
    assert first_p0["novelty_source"] == "empty_cache"
    assert first_p1["novelty_source"] == "empty_cache", "partition 1 must not see partition 0"
    assert first_p0["dimensions"]["novelty"] == first_p1["dimensions"]["novelty"] == 0.5
    assert second_p0["novelty_source"] == "embedding"
    assert second_p0["dimensions"]["novelty"] < 0.01


def test_sigterm_and_restart_lose_nothing_and_keep_scores(
    kafka_bootstrap: str, new_topic_name, offline_scorer
) -> None:
    env, outputs = worker_topics(new_topic_name("restart"), partitions=2)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=2)
    # Texts all distinct (a repeated text reuses its stored vector and costs nothing), and
    # enough of them that the stop lands mid-stream however fast the worker is.
    lines = [unique_text(line, i) for i, line in enumerate(sample_lines(150))]
    produced = produce(
        kafka_bootstrap,
        env["KP_INPUT_TOPIC"],
        [(None, line, i % 2, None) for i, line in enumerate(lines)],
    )
    expected = {(p.partition, p.offset) for p in produced}

    first = WorkerProcess(kafka_bootstrap, **env).start()
    try:
        deadline = time.monotonic() + 90
        first.wait_ready()
        partial = []
        while time.monotonic() < deadline and len(partial) < 15:
            time.sleep(0.5)
            partial = collect_outputs(kafka_bootstrap, outputs, set(), timeout=2, settle=0)
    finally:
        assert first.stop() == 0, first.tail()
    partial_count = len(partial)
    assert partial_count < len(lines), "stop happened mid-stream"

    with WorkerProcess(kafka_bootstrap, **env) as second:
        found = collect_outputs(kafka_bootstrap, outputs, expected, timeout=120)
        rebuilt = [e for e in second.events() if e.get("event") == "rebuilt novelty cache"]

    by_source: dict[tuple[int, int], list[float | None]] = {}
    for output in found:
        by_source.setdefault((output.source_partition, output.source_offset), []).append(
            output.score
        )
    duplicates = sum(len(v) - 1 for v in by_source.values())
    print(
        f"\nstopped after {partial_count} outputs; {duplicates} duplicates after restart; "
        f"rebuilt caches: {[(e['partition'], e['records']) for e in rebuilt]}"
    )
    assert set(by_source) == expected
    for scores in by_source.values():
        assert len(set(scores)) == 1, "a redelivered record must keep its score"
    assert rebuilt, "the restarted worker rebuilds the caches of partitions it takes over"
    for partition in (0, 1):
        ordered = sorted(p.offset for p in produced if p.partition == partition)
        partition_lines = [lines[i] for i, p in enumerate(produced) if p.partition == partition]
        expected_scores = offline_scores(offline_scorer, partition_lines)
        got = [by_source[(partition, offset)][0] for offset in ordered]
        assert got == expected_scores, f"partition {partition} differs from a continuous run"


def test_a_group_id_with_any_characters_runs(kafka_bootstrap: str, new_topic_name) -> None:
    """Kafka takes any string as a group id: a slash, braces and spaces included."""
    prefix = new_topic_name("group")
    env, outputs = worker_topics(
        prefix, partitions=1, KP_GROUP_ID=f"team/{{env}} {prefix}", KP_EMBED_CONCURRENCY="1"
    )
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready(timeout=60)
        produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], [(None, sample_lines(1)[0], 0, None)])
        (out,) = collect_outputs(kafka_bootstrap, outputs, {(0, 0)}, settle=0)
    assert out.decision in ("accepted", "rejected")
