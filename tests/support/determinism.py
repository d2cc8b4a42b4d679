"""The determinism tests' shared input and references (SPEC "Stream decisions").

One input topic of 600 seeded traces (45 exact repeats) over three partitions. Their event
times come in blocks, dense (100 ms apart) and sparse (6 s apart), so that each bound of the
cache decides scores on its own: in a dense block the 50-vector capacity evicts vectors well
inside the 600 s TTL, in a sparse one the TTL expires vectors well inside the capacity. Without
the capacity bound 74 scores differ, without the TTL 32, without both 201 (``offline_scores``
with each bound lifted, 2026-11-30); so a rebuilt cache that evicted or expired differently
from the live one would show. (600 traces, not more: each way of scoring the topic runs the
model on every trace, and together they were the suite's largest CPU cost.) ``offline`` is
the offline scorer run per partition, the reference every way of scoring the topic must equal
exactly. The fixtures are module scoped, so each test file using them (one per xdist worker)
builds its own copy of the topic on its session broker: the seeded traces are the same
everywhere.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import io
import os
import random
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from worker.cli.score import LineRecords, score_lines
from worker.core.scorer import build_scorer
from worker.dev.process import WorkerProcess
from worker.settings import load_settings

from support.kafka_helpers import create_topics, produce
from support.outputs import Output, collect_outputs

TRACES = 600
REPEATS = 45
PARTITIONS = 3
CAPACITY = "50"
TTL_SECONDS = "600"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BLOCK = 200  # traces of one block of event times, dense and sparse in turn
DENSE_GAP_MS, SPARSE_GAP_MS = 100, 6000
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


def event_times_ms() -> list[int]:
    """Each trace's event time (its record's timestamp and its created_at)."""
    times, now = [], START_MS
    for index in range(TRACES):
        times.append(now)
        now += DENSE_GAP_MS if (index // BLOCK) % 2 == 0 else SPARSE_GAP_MS
    return times


def make_trace(rng: random.Random, event_time_ms: int) -> dict:
    verb, thing = rng.choice(VERBS), rng.choice(THINGS)
    steps = [{"step_id": 0, "type": "thought", "content": f"plan to {verb} {thing}"}]
    for step_id in range(1, rng.randint(1, 5)):
        kind = rng.choice(["tool_call", "observation", "error_recovery"])
        step = {"step_id": step_id, "type": kind, "content": f"{kind} {rng.randint(0, 30)}"}
        if kind == "tool_call":
            step["tool"] = {"name": rng.choice(TOOLS)}
        steps.append(step)
    created = datetime.fromtimestamp(event_time_ms / 1000, UTC)
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
        return self.worker_with({})

    def worker_with(self, env: dict[str, str]) -> WorkerProcess:
        """A worker of this run with some settings of its own."""
        self.last_worker = WorkerProcess(self.bootstrap, **{**self.env, **env}).start()
        return self.last_worker

    def published(self) -> int:
        """Approximate output count, to time interventions (not used for assertions)."""
        return asyncio.run(_count(self.bootstrap, list(self.outputs)))

    def wait_published(self, at_least: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.published() < at_least:
            assert time.monotonic() < deadline, (
                f"{self.name}: stuck at {self.published()} of {at_least} outputs; "
                f"the last worker's log:\n{self.last_worker.tail()}"
            )
            time.sleep(0.5)

    def collect(self, expected: set[tuple[int, int]]) -> list[Output]:
        return collect_outputs(self.bootstrap, self.outputs, expected, timeout=300)


async def _count(bootstrap: str, topics: list[str]) -> int:
    # The partitions come from the admin client: a consumer's topics() returns fresh metadata
    # without updating its own, so on Apache Kafka its partitions_for_topic stayed empty.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    partitions = [
        TopicPartition(d["topic"], p["partition"])
        for d in described
        if not d.get("error_code")
        for p in d.get("partitions", ())
    ]
    if not partitions:
        return 0
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
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
    times = event_times_ms()
    traces = [make_trace(rng, at) for at in times]
    for i in rng.sample(range(1, TRACES), REPEATS):  # exact repeats of earlier traces
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
            (f"agent-{i % 11}".encode(), line, i % PARTITIONS, None, at)
            for i, (line, at) in enumerate(zip(lines, times, strict=True))
        ],
    )
    by_partition: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for record, line in zip(produced, lines, strict=True):
        by_partition[record.partition].append((record.offset, line))
    expected = {(p.partition, p.offset) for p in produced}
    return input_topic, by_partition, expected


def offline_scores(
    by_partition: dict[int, list[tuple[int, bytes]]],
    cache_capacity: int = int(CAPACITY),
    cache_ttl_seconds: float | None = float(TTL_SECONDS),
) -> dict[tuple[int, int], float]:
    """The offline scorer run per partition: score per (partition, offset); a record that is a
    dead letter has none."""
    scorer = build_scorer(
        load_settings(cache_capacity=cache_capacity, cache_ttl_seconds=cache_ttl_seconds)
    )
    scores: dict[tuple[int, int], float] = {}
    for partition, records in by_partition.items():
        out = io.StringIO()
        score_lines(
            scorer, [line for _, line in records], out, LineRecords(f"offline-{partition}", None)
        )
        for (offset, _), line in zip(records, out.getvalue().splitlines(), strict=True):
            scored = orjson.loads(line)
            if "score" in scored:
                scores[(partition, offset)] = scored["score"]["score"]
    return scores


@pytest.fixture(scope="module")
def offline(scenario, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], float]:
    """``offline_scores`` of the scenario, computed once per test session: every file using it
    (on any xdist worker, whose temporary folders share a parent) reads the first one's."""
    _, by_partition, _ = scenario
    digest = hashlib.sha256()
    for partition, records in sorted(by_partition.items()):
        for offset, line in records:
            digest.update(b"%d:%d:%s\n" % (partition, offset, line))
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    path = shared / f"determinism-offline-{digest.hexdigest()[:16]}.json"
    with (shared / "determinism-offline.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one computes, the others wait and read
        if path.exists():
            rows = orjson.loads(path.read_bytes())
            return {(partition, offset): score for partition, offset, score in rows}
        scores = offline_scores(by_partition)
        path.write_bytes(orjson.dumps([[p, o, s] for (p, o), s in sorted(scores.items())]))
        return scores
