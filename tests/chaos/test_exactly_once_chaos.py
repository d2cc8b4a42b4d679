"""Exactly once through chaos: workers in ``KP_PROCESSING_GUARANTEE=exactly_once`` on a
three-node Apache Kafka cluster, taken through two SIGKILLs of a worker (each restarted), a
worker joining and one leaving (SIGTERM), a worker SIGSTOPped past its session timeout and
SIGCONTed once its partitions moved (a zombie: it is fenced), and the SIGKILL and restart of the
broker leading an input partition. At the end a read_committed consumer of the three output
topics sees every input record (partition, offset) exactly once: none missing, none twice;
every score equals the offline scorer's on that partition's log (as ``support/determinism.py``
compares); the group's committed offsets are the input's end offsets; and a read_uncommitted
consumer sees more outputs than the read_committed one: the aborted transactions of the
killed and fenced workers, proof that the kills landed inside transactions.

Every topic has replication factor 3 and ``min.insync.replicas=2``; the output topics stamp
each record with the time its leader appended it (``LogAppendTime``). Inputs: a backlog before
the workers start (the first kill comes while it is scored), a steady feed, and a burst before
the second kill and the pause. The figure printed per step is how long after it every input
partition had a committed output appended after it (the slowest partition, and the slowest of
those the step touched): the outputs resuming, as a read_committed consumer sees them.

``python -m pytest -m slow -s tests/chaos/test_exactly_once_chaos.py`` (add ``-n0``: it starts
three JVMs and three workers; 100-170 s on 2 shared cores).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import orjson
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from worker.dev.process import WorkerProcess
from worker.settings import load_settings

from support.apache_kafka import ApacheKafka
from support.cluster_watch import (
    LIBRDKAFKA_LOG,
    Feeder,
    OutputTail,
    Seen,
    committed,
    coordinator,
    create_replicated_topics,
    end_offsets,
    leaders,
    under_replicated,
)
from support.determinism import offline_scores
from support.workers import worker_topics

pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("java") is None or shutil.which("mvn") is None,
        reason="a three-node Apache Kafka cluster needs Java 17+ and Maven (mvn)",
    ),
]

PARTITIONS = 6
REPLICAS = 3
MIN_IN_SYNC = "2"
BACKLOG = 500  # waiting before the workers start
BURST = 150  # more, just before the second kill and the pause
RATE_PER_SECOND = 4.0  # and a steady feed throughout: each partition gets one every 1.5 s
AT_LEAST = 1000  # input records in all
CACHE_CAPACITY = 100  # a partition taken over rebuilds its cache in seconds
SESSION_TIMEOUT = 6.0
COMMIT_INTERVAL = "1.5"  # long enough that a kill nearly always lands in an open transaction
FENCED = "fenced: another worker owns the partition now; its records here are dropped"
STOPPED_ON_FAILURE = "scoring or publishing failed; stopping"  # worker/core/failures.py
# Generous: 2 shared cores, three JVMs and three workers.
READY_TIMEOUT = 240.0
RESUME_TIMEOUT = 240.0
RESTORE_TIMEOUT = 240.0
DRAIN_TIMEOUT = 300.0
SETTLE_SECONDS = 5.0

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


class Chaos:
    """The cluster, the workers of one group and the read_committed tail of their outputs."""

    def __init__(self, cluster: ApacheKafka, env: dict[str, str], tail: OutputTail) -> None:
        self.cluster, self.env, self.tail = cluster, env, tail
        self.bootstrap = cluster.bootstrap_servers
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": LIBRDKAFKA_LOG})
        self.live: dict[str, WorkerProcess] = {}  # expected to be running (or paused)
        self.every: list[WorkerProcess] = []
        self.figures: list[str] = []

    def start(self, name: str) -> WorkerProcess:
        worker = WorkerProcess(self.bootstrap, **self.env).start()
        self.live[name] = worker
        self.every.append(worker)
        print(f"chaos: worker {name} logs to {worker.log_path}", flush=True)
        self.wait(f"worker {name} assigned", lambda: assigned(worker) is not None, READY_TIMEOUT)
        return worker

    def alive(self) -> None:
        """No worker exits by itself: not when fenced, nor on a failover."""
        for name, worker in self.live.items():
            assert worker.process is not None
            code = worker.process.poll()
            assert code is None, f"worker {name} exited ({code}):\n{worker.tail()}"

    def wait(self, what: str, condition: Callable[[], T | None], timeout: float) -> T:
        deadline = time.monotonic() + timeout
        while True:
            self.alive()
            try:
                found = condition()
            except KafkaException:  # a metadata request the dead node was to answer: again
                found = None
            if found:
                return found
            assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
            time.sleep(0.25)

    def resumed(self, step: str, at_ms: int, touched: set[int]) -> None:
        """Until each input partition has a committed output appended after ``at_ms``; prints
        when each had its first, in seconds after ``at_ms``."""
        first: dict[int, float] = {}

        def every_partition() -> bool:
            seen = {o.source[0] for o in self.tail.outputs() if o.appended_ms > at_ms}
            for partition in seen - set(first):
                first[partition] = (now_ms() - at_ms) / 1000
            return len(first) == PARTITIONS

        self.wait(f"{step}: outputs of every partition again", every_partition, RESUME_TIMEOUT)
        mine = max((first[p] for p in touched), default=0.0)
        line = (
            f"chaos: {step}: committed outputs of every input partition again after "
            f"{max(first.values()):.1f} s, of those it touched {sorted(touched)} after "
            f"{mine:.1f} s (each: {', '.join(f'{first[p]:.1f}' for p in sorted(first))})"
        )
        self.figures.append(line)
        print(line, flush=True)

    def kill_worker(self, name: str, step: str) -> None:
        """SIGKILL a worker in the middle of its transactions and start another in its place."""
        worker = self.live.pop(name)
        touched = assigned(worker) or set()
        at = now_ms()
        worker.kill()
        print(f"\nchaos: {step}: SIGKILL worker {name} (partitions {sorted(touched)})", flush=True)
        self.start(f"{name}'")
        self.resumed(step, at, touched)


def assigned(worker: WorkerProcess) -> set[int] | None:
    """The input partitions of the worker's last assignment (None before its first)."""
    found = assignments(worker)
    if not found:
        return None
    partitions = found[-1].get("partitions")
    return {int(p) for _, p in partitions} if isinstance(partitions, list) else set()


def input_log(
    bootstrap: str, topic: str, ends: dict[int, int]
) -> dict[int, list[tuple[int, bytes]]]:
    """Each input partition's records, (offset, value), up to ``ends``."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kp-input-log", "logger": LIBRDKAFKA_LOG}
    )
    logs: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end])
        deadline = time.monotonic() + 120
        while sum(map(len, logs.values())) < sum(ends.values()):
            assert time.monotonic() < deadline, "the input topic could not be read back"
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None and message.offset() < ends[message.partition()]:
                    logs[message.partition()].append((message.offset(), message.value()))
    finally:
        consumer.close()
    return logs


def missing(s: Chaos, expected: set[tuple[int, int]], uncommitted: OutputTail) -> str:
    """What became of the input records without a committed output: whether an output of
    theirs was written in a transaction that was aborted, and where the group committed."""
    seen = {o.source for o in s.tail.outputs()}
    aborted = {o.source: o for o in uncommitted.outputs()}
    offsets = committed(s.bootstrap, s.env["KP_GROUP_ID"]) or {}
    lines = []
    for partition, offset in sorted(expected - seen)[:10]:
        output = aborted.get((partition, offset))
        lines.append(
            f"  ({partition}, {offset}): "
            + (
                f"an aborted output: {where([output], [output.source]).strip()}"
                if output
                else "no output ever written"
            )
            + f"; committed offset {offsets.get((s.env['KP_INPUT_TOPIC'], partition))}"
        )
    return "what became of them:\n" + "\n".join(lines)


def where(outputs: list[Seen], sources: list[tuple[int, int]]) -> str:
    """Each copy of these input records' outputs: where, and when its leader appended it."""
    return "\n".join(
        f"  {source}: "
        + ", ".join(
            f"{o.topic.rsplit('.', 1)[-1]}[{o.partition}]@{o.offset} appended "
            f"{datetime.fromtimestamp(o.appended_ms / 1000, UTC):%H:%M:%S.%f}"
            for o in outputs
            if o.source == source
        )
        for source in sources
    )


def pause_past_session(s: Chaos, name: str, feeder: Feeder) -> bool:
    """SIGSTOP a worker in the middle of a burst until its partitions have committed outputs
    from the others, then SIGCONT it; whether it logged, within a minute, that it was fenced
    (it has nothing to be fenced from when it paused between two transactions)."""
    worker = s.live[name]
    touched = assigned(worker) or set()
    assert touched, f"worker {name} holds no partition to lose"
    feeder.send(BURST)
    time.sleep(2.0)
    step = f"pause of worker {name}"
    rejoins = len(assignments(worker))
    at = now_ms()
    worker.signal(signal.SIGSTOP)
    print(f"\nchaos: {step}: SIGSTOP (partitions {sorted(touched)})", flush=True)
    s.resumed(step, at, touched)  # taken over, fenced, scored and committed by the others
    worker.signal(signal.SIGCONT)
    cont = time.monotonic()
    s.wait(f"worker {name} back in the group", lambda: len(assignments(worker)) > rejoins, 120)
    while not (fenced := any(e.get("event") == FENCED for e in worker.events())):
        if time.monotonic() - cont > 60:
            break
        s.alive()
        time.sleep(0.25)
    print(
        f"chaos: {step}: SIGCONT after {(now_ms() - at) / 1000:.1f} s; fenced line "
        + (f"{time.monotonic() - cont:.1f} s later" if fenced else "not logged"),
        flush=True,
    )
    return fenced


def assignments(worker: WorkerProcess) -> list[dict[str, object]]:
    return [e for e in worker.events() if e.get("event") == "partitions assigned"]


def kill_input_leader(s: Chaos, input_topic: str, topics: list[str], group: str) -> None:
    """SIGKILL the broker leading input partition 0, then restart it once the workers
    published again; until every replica is back in sync."""
    lead = leaders(s.admin, topics)
    node = lead[(input_topic, 0)]
    led = {p for (t, p), n in lead.items() if t == input_topic and n == node}
    others = Counter(t.rsplit(".", 1)[-1] for (t, _), n in lead.items() if n == node)
    role = ", the group coordinator" if coordinator(s.bootstrap, group) == node else ""
    step = f"SIGKILL of broker node {node}"
    at = now_ms()
    s.cluster.kill(node)
    print(f"\nchaos: {step} (it led {dict(others)}{role})", flush=True)

    def elected() -> bool:
        now = leaders(s.admin, [input_topic])
        return all(now[(input_topic, p)] not in (node, -1) for p in led)

    s.wait("new leaders of the input partitions", elected, 120)
    s.resumed(step, at, led)
    s.cluster.start_node(node, timeout=RESTORE_TIMEOUT)
    s.wait("every replica in sync", lambda: not under_replicated(s.admin, topics, REPLICAS), 240)
    print(f"chaos: node {node} back, in sync {(now_ms() - at) / 1000:.1f} s after", flush=True)


@pytest.mark.timeout(2400)
def test_exactly_once_through_kills_rebalances_a_zombie_and_failover(new_topic_name) -> None:
    env, decisions = worker_topics(
        new_topic_name("eos-chaos"),
        PARTITIONS,
        KP_PROCESSING_GUARANTEE="exactly_once",
        KP_REPLICATION_FACTOR=str(REPLICAS),
        KP_SESSION_TIMEOUT_SECONDS=f"{SESSION_TIMEOUT:g}",
        KP_COMMIT_INTERVAL_SECONDS=COMMIT_INTERVAL,
        KP_CACHE_CAPACITY=str(CACHE_CAPACITY),
        KP_ACCEPT_THRESHOLD="0.4",  # every output topic is written to
    )
    input_topic, group, output_topics = env["KP_INPUT_TOPIC"], env["KP_GROUP_ID"], [*decisions]
    output_config = {
        "min.insync.replicas": MIN_IN_SYNC,
        "max.message.bytes": str(load_settings(environ={}).output_record_limit),
        "message.timestamp.type": "LogAppendTime",
    }
    topics = [input_topic, *output_topics, "__consumer_offsets", "__transaction_state"]
    started = time.monotonic()
    with ApacheKafka(nodes=3) as cluster:
        bootstrap = cluster.bootstrap_servers
        create_replicated_topics(
            AdminClient({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOG}),
            {
                input_topic: {"min.insync.replicas": MIN_IN_SYNC},
                **dict.fromkeys(output_topics, output_config),
            },
            PARTITIONS,
            REPLICAS,
        )
        feeder = Feeder(bootstrap, input_topic, PARTITIONS, RATE_PER_SECOND, group)
        tail = OutputTail(bootstrap, output_topics, PARTITIONS)
        uncommitted = OutputTail(bootstrap, output_topics, PARTITIONS, "read_uncommitted")
        s = Chaos(cluster, env, tail)
        codes: list[int | None] = []
        try:
            feeder.send(BACKLOG)
            tail.start()
            uncommitted.start()
            s.start("a")
            s.start("b")
            feeder.start()
            s.wait("outputs of the backlog", lambda: len(tail.outputs()) >= 60, RESUME_TIMEOUT)
            s.kill_worker("a", "first kill (in the backlog)")
            joined = now_ms()
            print("\nchaos: worker c joins", flush=True)
            s.start("c")
            s.resumed("worker c joining", joined, assigned(s.live["c"]) or set())
            feeder.send(BURST)
            time.sleep(2.0)
            s.kill_worker("b", "second kill (in a burst)")
            fenced = pause_past_session(s, "c", feeder)
            kill_input_leader(s, input_topic, topics, group)
            leaving = s.live.pop("a'")
            touched = assigned(leaving) or set()
            at = now_ms()
            print(f"\nchaos: worker a' leaves (SIGTERM; partitions {sorted(touched)})", flush=True)
            left = leaving.stop()
            s.resumed("worker a' leaving", at, touched)
            feeder.finish()
            ends = end_offsets(bootstrap, input_topic, PARTITIONS)
            expected = {(p, offset) for p, end in ends.items() for offset in range(end)}
            try:
                tail.wait_for(expected, DRAIN_TIMEOUT, s.alive)
            except AssertionError as lost:
                raise AssertionError(f"{lost}\n{missing(s, expected, uncommitted)}") from None
            time.sleep(SETTLE_SECONDS)  # duplicates committed after the last expected output
            wanted = {(input_topic, p): end for p, end in ends.items()}
            offsets = s.wait(
                "committed offsets at the input's ends",
                lambda: (
                    (c := committed(bootstrap, group) or {})
                    and all(c.get(tp) == end for tp, end in wanted.items())
                    and c
                ),
                60,
            )
            s.wait(
                "the read_uncommitted tail caught up",
                lambda: len(uncommitted.outputs()) >= len(tail.outputs()),
                60,
            )
            time.sleep(2.0)
            s.alive()
        finally:
            codes = [worker.stop() for worker in s.live.values()]
            tail.stop()
            uncommitted.stop()
            feeder.close()
        logs = input_log(bootstrap, input_topic, ends)
    outputs, every_output = tail.outputs(), uncommitted.outputs()

    copies = Counter(o.source for o in outputs)
    scores = {
        o.source: orjson.loads(o.value or b"")["score"]["score"]
        for o in outputs
        if decisions[o.topic] != "dead_letter"
    }
    dead = {o.source for o in outputs if decisions[o.topic] == "dead_letter"}
    offline = offline_scores(logs, cache_capacity=CACHE_CAPACITY, cache_ttl_seconds=None)
    differing = [(k, scores.get(k), v) for k, v in offline.items() if scores.get(k) != v]
    events = [e for worker in s.every for e in worker.events()]
    crashed = [
        e
        for e in events
        if "Crashed" in str(e.get("event")) or e.get("event") == STOPPED_ON_FAILURE
    ]
    print()
    for line in s.figures:
        print(line)
    print(
        f"chaos: {len(expected)} inputs; read_committed {len(outputs)} outputs "
        f"{dict(Counter(decisions[o.topic] for o in outputs))}, missing "
        f"{len(expected - set(copies))}, duplicates {sum(c - 1 for c in copies.values())}, "
        f"scores differing from offline {len(differing)}; read_uncommitted {len(every_output)} "
        f"(aborted extras {len(every_output) - len(outputs)}); zombie fenced {fenced}; "
        f"fenced lines {sum(e.get('event') == FENCED for e in events)}, assignments "
        f"{sum(e.get('event') == 'partitions assigned' for e in events)}; exit codes on SIGTERM "
        f"{left} (leaving), {codes} (at the end); {time.monotonic() - started:.0f} s in all",
        flush=True,
    )
    assert len(expected) >= AT_LEAST
    assert set(copies) == expected, f"missing: {sorted(expected - set(copies))[:10]}"
    twice = sorted(k for k, c in copies.items() if c > 1)
    assert not twice, f"read_committed saw {len(twice)} twice:\n{where(outputs, twice[:5])}"
    assert not differing, f"scores differ from offline scoring: {differing[:5]}"
    assert dead == expected - set(offline), "dead letters differ from offline scoring"
    assert {k: v for k, v in offsets.items() if k[0] == input_topic} == wanted
    assert len(every_output) > len(outputs), "no aborted transaction: the kills missed them"
    assert not crashed, crashed[:3]
    assert fenced, "the paused worker was not fenced"
    assert left == 0 and all(code == 0 for code in codes), (left, codes)
