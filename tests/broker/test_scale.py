"""Horizontal scale: two workers share a 4-partition topic; one is SIGKILLed; nothing is lost.

Each input partition is owned by exactly one worker of the group. When a worker dies, the
group rebalances and the survivor takes over its partitions, rebuilds their novelty caches
from the log and scores whatever the dead worker had not committed (at-least-once: a few
duplicates are allowed and counted, a missing record is not).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import orjson
import pytest

from worker.core.trace import parse_trace
from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.outputs import Output, collect_outputs
from support.paths import EXAMPLES
from support.workers import metric_total

pytestmark = pytest.mark.broker

PARTITIONS = 4
PER_ROUND = 400
# A worker shares the 2 cores with the other worker and the broker: one embedding thread
# each keeps them from oversubscribing the machine.
WORKER_ENV = {"KP_EMBED_CONCURRENCY": "1", "KP_INPUT_PARTITIONS": str(PARTITIONS)}


def short_examples() -> list[bytes]:
    """The half of the example traces with the shortest embedding text.

    This test is about partition ownership and conservation, not embedding speed: embedding
    cost grows with text length, and the short half keeps 800 traces plus cache rebuilds
    within ~90 s on two shared cores (the whole file costs ~5x more CPU per trace).
    """
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    by_length = sorted(lines, key=lambda line: len(parse_trace(line).embedding_text()))
    return by_length[: len(lines) // 2]


def fresh_traces(count: int, round_: str) -> list[tuple[str, bytes]]:
    """``count`` example traces, repeated, each with a unique id: (id, JSON bytes)."""
    lines = short_examples()
    out = []
    for index in range(count):
        trace = orjson.loads(lines[index % len(lines)])
        trace["id"] = f"kp:trace:scale-{round_}-{index}-{uuid.uuid4().hex[:8]}"
        out.append((trace["id"], orjson.dumps(trace)))
    return out


def produce_round(bootstrap: str, topic: str, traces: list[tuple[str, bytes]]):
    # 32 agent keys: the default partitioner hashes them over all partitions.
    records = [
        (f"agent-{i % 32}".encode(), value, None, None) for i, (_, value) in enumerate(traces)
    ]
    produced = produce(bootstrap, topic, records)
    assert {p.partition for p in produced} == set(range(PARTITIONS)), "keys must spread"
    return produced


def assignments(worker: WorkerProcess, topic: str) -> list[set[int]]:
    """Every "partitions assigned" the worker logged, as sets of partitions of ``topic``."""
    return [
        {partition for name, partition in event["partitions"] if name == topic}  # type: ignore[union-attr]
        for event in worker.events()
        if event.get("event") == "partitions assigned"
    ]


def current(worker: WorkerProcess, topic: str) -> set[int] | None:
    seen = assignments(worker, topic)
    return seen[-1] if seen else None


def wait_until(condition, timeout: float, what: str, workers: list[WorkerProcess]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for worker in workers:
            if worker.process is not None and worker.process.poll() is not None:
                raise AssertionError(f"worker exited while waiting for {what}:\n{worker.tail()}")
        time.sleep(0.2)
    tails = "\n---\n".join(w.tail(15) for w in workers)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n{tails}")


def records_scored(worker: WorkerProcess) -> float:
    """kp_records_total summed over its labels, scraped from the worker's /metrics."""
    try:
        return metric_total(worker.metrics_port, "kp_records_total", timeout=2)
    except OSError:
        return 0.0


def trace_id(output: Output) -> str | None:
    if output.decision == "dead_letter":
        return orjson.loads(output.value or b"null").get("id")  # type: ignore[no-any-return]
    return output.document["trace"]["id"]  # type: ignore[no-any-return]


def test_two_workers_split_partitions_and_survivor_takes_over_after_sigkill(
    kafka_bootstrap: str, new_topic_name
) -> None:
    began = time.monotonic()
    prefix = new_topic_name("scale")
    topic = f"{prefix}.raw"
    env = {
        **WORKER_ENV,
        "KP_INPUT_TOPIC": topic,
        "KP_ACCEPTED_TOPIC": f"{prefix}.accepted",
        "KP_REJECTED_TOPIC": f"{prefix}.rejected",
        "KP_DEAD_LETTER_TOPIC": f"{prefix}.dead-letter",
        "KP_GROUP_ID": f"{prefix}-group",
    }
    outputs = {
        env["KP_ACCEPTED_TOPIC"]: "accepted",
        env["KP_REJECTED_TOPIC"]: "rejected",
        env["KP_DEAD_LETTER_TOPIC"]: "dead_letter",
    }
    create_topics(kafka_bootstrap, [topic], partitions=PARTITIONS)
    workers = [WorkerProcess(kafka_bootstrap, **env).start() for _ in range(2)]
    try:
        # 1. The group splits the partitions: both non-empty, disjoint, covering all.
        def split() -> bool:
            a, b = (current(w, topic) for w in workers)
            return bool(a and b and not a & b and a | b == set(range(PARTITIONS)))

        wait_until(split, 60, "both workers to hold disjoint partitions", workers)
        split_at = time.monotonic() - began
        first, second = (current(w, topic) for w in workers)
        print(
            f"\nsplit after {split_at:.1f} s: worker 0 {sorted(first)}, worker 1 {sorted(second)}"
        )

        # 2. Produce the first round; SIGKILL worker 1 while it is scoring its share.
        round_one = fresh_traces(PER_ROUND, "one")
        produced = produce_round(kafka_bootstrap, topic, round_one)
        victim, survivor = workers[1], workers[0]
        wait_until(lambda: records_scored(victim) >= 20, 60, "worker 1 to score records", workers)
        scored_by_victim = records_scored(victim)
        victim.kill()
        print(f"SIGKILLed worker 1 after it scored {scored_by_victim:.0f} records")
        assert scored_by_victim < PER_ROUND, "the kill must happen mid-stream"

        # 3. Produce the second round; the survivor takes over every partition.
        round_two = fresh_traces(PER_ROUND, "two")
        produced += produce_round(kafka_bootstrap, topic, round_two)
        wait_until(
            lambda: current(survivor, topic) == set(range(PARTITIONS)),
            60,
            "the survivor to own all partitions",
            [survivor],
        )
        print(f"survivor owns all partitions after {time.monotonic() - began:.1f} s")

        # 4. Every input record has an output (0 lost); duplicates are counted.
        expected = {(p.partition, p.offset) for p in produced}
        found = collect_outputs(kafka_bootstrap, outputs, expected, timeout=90, settle=1.0)
        assert survivor.process is not None and survivor.process.poll() is None, survivor.tail()
    finally:
        for worker in workers:
            worker.stop(timeout=10)

    ids = {trace for trace, _ in round_one + round_two}
    output_ids = Counter(trace_id(o) for o in found)
    missing = ids - set(output_ids)
    by_source: dict[tuple[int, int], list[Output]] = {}
    for output in found:
        by_source.setdefault((output.source_partition, output.source_offset), []).append(output)
    duplicates = {source: outs for source, outs in by_source.items() if len(outs) > 1}
    rebuilt = [e for e in survivor.events() if e.get("event") == "rebuilt novelty cache"]
    gaps = [e for e in survivor.events() if e.get("event", "").startswith("consumer skipped")]
    decisions = Counter(o.decision for o in found)
    print(
        f"{len(ids)} inputs -> {len(found)} outputs {dict(decisions)}; "
        f"missing {len(missing)}; duplicated sources {len(duplicates)} "
        f"(extra outputs {sum(len(v) - 1 for v in duplicates.values())}); "
        f"rebuilt caches {[(e['partition'], e['records']) for e in rebuilt]}; "
        f"gap fills {[(e['partition'], e['start'], e['end']) for e in gaps]}; "
        f"total {time.monotonic() - began:.1f} s"
    )
    for source, outs in sorted(duplicates.items()):
        print(f"  duplicate {source}: {[(o.decision, o.score) for o in outs]}")

    assert not missing, f"{len(missing)} input records have no output, e.g. {sorted(missing)[:5]}"
    assert set(by_source) == expected
    assert set(output_ids) == ids, "outputs carry only the produced ids"
    assert decisions["dead_letter"] == 0, "every produced trace is valid"
    for outs in duplicates.values():
        assert len({o.score for o in outs}) == 1, "a re-scored record keeps its score"
