"""A trace's score is a pure function of its partition's log (SPEC "Stream decisions").

One input topic, five ways of scoring it, every per-record score compared for exact float
equality: (a) one continuous worker, (b) a worker SIGKILLed and restarted twice mid-stream,
(c) a second worker joining and leaving mid-stream, (d) `kp-scorer replay`, and (e) the
offline scorer run per partition. A small cache capacity and an event-time TTL make both
eviction and expiry matter, so a rebuilt cache that differed from the live one would show.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka_helpers import create_topics, produce
from outputs import Output, collect_outputs
from worker_process import WorkerProcess

from worker.cli.score import LineRecords, score_lines
from worker.core.scorer import build_scorer
from worker.settings import load_settings

pytestmark = pytest.mark.broker

TRACES = 2000
PARTITIONS = 3
CAPACITY = "200"
TTL_SECONDS = "600"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
VERBS = ["review", "debug", "summarise", "reconcile", "triage", "profile", "document"]
THINGS = [
    "the login handler",
    "invoice batch 7",
    "ticket backlog",
    "the SQL migration",
    "payment retries",
    "the cache layer",
    "drug interaction list",
    "quarterly report",
]
TOOLS = ["grep", "pytest", "sql_query", "http_get", "ledger_api", "ticket_search"]


def make_trace(rng: random.Random, index: int) -> dict:
    verb, thing = rng.choice(VERBS), rng.choice(THINGS)
    steps = [{"step_id": 0, "type": "thought", "content": f"plan to {verb} {thing}"}]
    for step_id in range(1, rng.randint(1, 5)):
        kind = rng.choice(["tool_call", "observation", "error_recovery"])
        step = {"step_id": step_id, "type": kind, "content": f"{kind} {rng.randint(0, 30)}"}
        if kind == "tool_call":
            step["tool"] = {"name": rng.choice(TOOLS)}
        steps.append(step)
    created = datetime.fromtimestamp((START_MS + index * 1000) / 1000, UTC)
    return {
        "@context": "https://knowledgepulse.dev/schema/v1",
        "@type": "ReasoningTrace",
        "id": f"kp:trace:{uuid.UUID(int=rng.getrandbits(128))}",
        "metadata": {
            "created_at": created.isoformat(timespec="milliseconds"),
            "task_domain": rng.choice(["code", "finance", "support", "medical"]),
            "success": rng.random() < 0.8,
            "quality_score": 0,
            "visibility": "org",
            "privacy_level": "aggregated",
        },
        "task": {"objective": f"{verb} {thing}"},
        "steps": steps,
        "outcome": {"result_summary": "done", "confidence": round(rng.random(), 2)},
    }


class Run:
    def __init__(self, bootstrap: str, input_topic: str, name: str) -> None:
        self.bootstrap = bootstrap
        self.name = name
        self.env = {
            "KP_INPUT_TOPIC": input_topic,
            "KP_ACCEPTED_TOPIC": f"{input_topic}.{name}.accepted",
            "KP_REJECTED_TOPIC": f"{input_topic}.{name}.rejected",
            "KP_DEAD_LETTER_TOPIC": f"{input_topic}.{name}.dead-letter",
            "KP_GROUP_ID": f"{input_topic}-{name}",
            "KP_CACHE_CAPACITY": CAPACITY,
            "KP_CACHE_TTL_SECONDS": TTL_SECONDS,
            "KP_METRICS_PORT": "0",
        }
        self.outputs = {
            self.env["KP_ACCEPTED_TOPIC"]: "accepted",
            self.env["KP_REJECTED_TOPIC"]: "rejected",
            self.env["KP_DEAD_LETTER_TOPIC"]: "dead_letter",
        }

    def worker(self) -> WorkerProcess:
        return WorkerProcess(self.bootstrap, **self.env).start()

    def published(self) -> int:
        """Approximate output count, to time interventions (not used for assertions)."""
        return asyncio.run(_count(self.bootstrap, list(self.outputs)))

    def wait_published(self, at_least: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.published() < at_least:
            assert time.monotonic() < deadline, f"{self.name}: stuck below {at_least} outputs"
            time.sleep(0.5)

    def collect(self, expected: set[tuple[int, int]]) -> list[Output]:
        return collect_outputs(self.bootstrap, self.outputs, expected, timeout=300)


async def _count(bootstrap: str, topics: list[str]) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        partitions = [
            TopicPartition(t, p) for t in topics for p in cluster.partitions_for_topic(t) or ()
        ]
        if not partitions:
            return 0
        return sum((await consumer.end_offsets(partitions)).values())
    finally:
        await consumer.stop()


def scores_of(outputs: list[Output]) -> dict[tuple[int, int], float]:
    """Score per source record; every redelivered copy must carry the same score."""
    seen: dict[tuple[int, int], set[float]] = defaultdict(set)
    for output in outputs:
        assert output.score is not None
        seen[(output.source_partition, output.source_offset)].add(output.score)
    unstable = {k: v for k, v in seen.items() if len(v) > 1}
    assert not unstable, f"redelivered records changed score: {list(unstable.items())[:5]}"
    return {k: next(iter(v)) for k, v in seen.items()}


@pytest.fixture(scope="module")
def scenario(kafka_bootstrap: str):
    input_topic = f"det-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, [input_topic], partitions=PARTITIONS)
    rng = random.Random(20261123)
    traces = [make_trace(rng, i) for i in range(TRACES)]
    for i in rng.sample(range(1, TRACES), 150):  # exact repeats of earlier traces
        repeat = dict(traces[rng.randrange(0, i)])
        repeat["id"] = f"kp:trace:{uuid.UUID(int=rng.getrandbits(128))}"
        repeat["metadata"] = {
            **repeat["metadata"],
            "created_at": traces[i]["metadata"]["created_at"],
        }
        traces[i] = repeat
    lines = [orjson.dumps(t) for t in traces]
    produced = produce(
        kafka_bootstrap,
        input_topic,
        [
            (f"agent-{i % 11}".encode(), line, i % PARTITIONS, None, START_MS + i * 1000)
            for i, line in enumerate(lines)
        ],
    )
    by_partition: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for record, line in zip(produced, lines, strict=True):
        by_partition[record.partition].append((record.offset, line))
    expected = {(p.partition, p.offset) for p in produced}
    return input_topic, by_partition, expected


@pytest.fixture(scope="module")
def offline(scenario):
    _, by_partition, _ = scenario
    scorer = build_scorer(
        load_settings(cache_capacity=int(CAPACITY), cache_ttl_seconds=float(TTL_SECONDS))
    )
    scores: dict[tuple[int, int], float] = {}
    for partition, records in by_partition.items():
        out = io.StringIO()
        score_lines(
            scorer, [line for _, line in records], out, LineRecords(f"offline-{partition}", None)
        )
        for (offset, _), line in zip(records, out.getvalue().splitlines(), strict=True):
            scores[(partition, offset)] = orjson.loads(line)["score"]["score"]
    return scores


@pytest.fixture(scope="module")
def continuous(kafka_bootstrap: str, scenario):
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "a")
    worker = run.worker()
    try:
        return scores_of(run.collect(expected))
    finally:
        worker.stop()


def test_continuous_run_equals_offline_scorer(continuous, offline) -> None:
    assert len(continuous) == TRACES
    mismatched = [k for k in offline if continuous[k] != offline[k]]
    novelty_spread = len(set(continuous.values()))
    print(f"\n{TRACES} traces, {novelty_spread} distinct scores; mismatches: {len(mismatched)}")
    assert not mismatched, [(k, continuous[k], offline[k]) for k in mismatched[:5]]


def test_sigkill_and_restart_twice(kafka_bootstrap: str, scenario, continuous) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "b")
    worker = run.worker()
    rebuilt = 0
    for fraction in (0.3, 0.6):
        run.wait_published(int(TRACES * fraction))
        worker.kill()
        rebuilt += sum(1 for e in worker.events() if e.get("event") == "rebuilt novelty cache")
        worker = run.worker()
    try:
        outputs = run.collect(expected)
    finally:
        rebuilt += sum(1 for e in worker.events() if e.get("event") == "rebuilt novelty cache")
        worker.stop()
    scores = scores_of(outputs)
    print(f"\nkilled twice: {len(outputs) - TRACES} duplicates, {rebuilt} cache rebuilds")
    assert rebuilt >= PARTITIONS, "restarted workers must rebuild the caches they take over"
    assert scores == continuous


def test_second_worker_joins_and_leaves(kafka_bootstrap: str, scenario, continuous) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "c")
    first = run.worker()
    second = None
    try:
        run.wait_published(int(TRACES * 0.25))
        second = run.worker()
        second.wait_ready()
        run.wait_published(int(TRACES * 0.6))
        second.stop()
        outputs = run.collect(expected)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    got_partitions = [
        e.get("partitions") for e in second.events() if e.get("event") == "partitions assigned"
    ]
    print(f"\nsecond worker held {got_partitions}; {len(outputs) - TRACES} duplicates")
    assert any(got_partitions), "the second worker must have owned partitions"
    assert scores_of(outputs) == continuous


def test_replay_reproduces_the_live_scores(kafka_bootstrap: str, scenario, continuous) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "d")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        **run.env,
        # compare with the continuous run's outputs
        "KP_ACCEPTED_TOPIC": f"{input_topic}.a.accepted",
        "KP_REJECTED_TOPIC": f"{input_topic}.a.rejected",
        "KP_DEAD_LETTER_TOPIC": f"{input_topic}.a.dead-letter",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "replay",
            "--topic",
            input_topic,
            "--output-prefix",
            f"{input_topic}.d",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"compared with the live outputs: {TRACES} records, 0 flipped" in result.stderr
    assert scores_of(run.collect(expected)) == continuous
