"""Leader failover on a three-node Apache Kafka cluster: a worker scoring a backlog while the
leader of an input partition, then the leader of an output partition, then the group's
coordinator is SIGKILLed (each restarted, and back in every in-sync replica set, before the
next kill) loses nothing, publishes no duplicate that differs, and never exits.

Every topic has replication factor 3 and ``min.insync.replicas=2``, and the worker publishes
with acks=all (always: ``worker/io/publisher.py``), so one node down leaves every partition
writable once a new leader is elected. The test creates the topics itself; the output topics
stamp each record with the time the leader appended it (``LogAppendTime``), which is what
the recovery figures are read from. Inputs keep arriving: a backlog before the worker starts
(the first kill comes while it is scored), a steady feed, and a burst just before the second
and third kills (each once the worker has caught up).

The figures printed per kill are read from the output records: the end of the longest pause in
their arrival after the kill, in seconds after it. First for all of them (the worker publishing
again), then for the affected ones: the input partitions the node led (first kill), the output
partitions it led (second), and for each input partition; the third kill also prints when the
group's committed offsets moved again. A dead node holds up every acks=all write in which it is
an in-sync follower, not only the partitions it led, until the controller fences it
(``broker.session.timeout.ms``, 9 s) and it leaves the in-sync replica sets, so the whole worker
pauses. While the worker has a backlog, its partitions also take turns (a partition whose
fetched records wait for the pipeline is not fetched again until they are taken), so one
partition's figure can include its wait for its turn.

``python -m pytest -m slow -s tests/chaos/test_failover_kafka.py`` (2-3.5 minutes on 2 shared
cores); bench/RESULTS.md ("Leader failover") has the figures.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
from confluent_kafka import KafkaException
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
from support.workers import worker_topics

pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("java") is None or shutil.which("mvn") is None,
        reason="a three-node Apache Kafka cluster needs Java 17+ and Maven (mvn)",
    ),
]

PARTITIONS = 4
REPLICAS = 3
MIN_IN_SYNC = "2"
BACKLOG = 300  # waiting before the worker starts
BURST = 120  # more, just before each kill
RATE_PER_SECOND = 8.0  # and a steady feed throughout
# Outputs of the affected partitions written after their new leaders are known: the worker
# scores them again.
RECOVERED_OUTPUTS = 5
# Generous: 2 shared cores, three JVMs and other tests beside this one.
ELECTION_TIMEOUT = 120.0
RECOVERY_TIMEOUT = 180.0
RESTORE_TIMEOUT = 240.0
DRAIN_TIMEOUT = 600.0
SETTLE_SECONDS = 3.0
STOPPED_ON_FAILURE = "scoring or publishing failed; stopping"  # worker/core/failures.py

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Kill:
    what: str
    node: int
    at_ms: int
    affected: Callable[[Seen], bool]
    scope: str
    restart_ms: int = 0  # the node started again
    serving_ms: int = 0  # listed by Metadata again
    end_ms: int = 0  # every partition fully in sync again
    commits_again_ms: int | None = None


class Scenario:
    """The cluster, the worker and the clients watching them, and the steps of a kill."""

    def __init__(
        self, cluster: ApacheKafka, worker: WorkerProcess, tail: OutputTail, topics: list[str]
    ) -> None:
        self.cluster, self.worker, self.tail, self.topics = cluster, worker, tail, topics
        self.bootstrap = cluster.bootstrap_servers
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": LIBRDKAFKA_LOG})
        self.kills: list[Kill] = []

    def alive(self) -> None:
        """The worker never exits: not on a failed publish, commit or fetch."""
        assert self.worker.process is not None
        code = self.worker.process.poll()
        assert code is None, f"the worker exited ({code}) during failover:\n{self.worker.tail()}"

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
            time.sleep(0.5)

    def outputs_since(self, after_ms: int, affected: Callable[[Seen], bool], count: int) -> None:
        self.wait(
            f"{count} outputs of the affected partitions after {after_ms}",
            lambda: (
                sum(1 for o in self.tail.outputs() if o.appended_ms > after_ms and affected(o))
                >= count
            ),
            RECOVERY_TIMEOUT,
        )

    def kill(self, what: str, node: int, affected: Callable[[Seen], bool], scope: str) -> Kill:
        lead = leaders(self.admin, self.topics)
        led = Counter(t.rsplit(".", 1)[-1] for (t, _), n in lead.items() if n == node)
        scope += f"; it led {', '.join(f'{count} {topic}' for topic, count in led.items())}"
        kill = Kill(what, node, now_ms(), affected, scope)
        self.cluster.kill(node)
        self.kills.append(kill)
        print(f"\nfailover: kill {len(self.kills)}: {what}, node {node} ({scope})", flush=True)
        return kill

    def new_leaders(self, partitions: set[tuple[str, int]], dead: int) -> int:
        """Until each of ``partitions`` has a leader other than ``dead``; that moment."""

        def elected() -> bool:
            lead = leaders(self.admin, {t for t, _ in partitions})
            return all(lead[tp] not in (dead, -1) for tp in partitions)

        self.wait("new leaders elected", elected, ELECTION_TIMEOUT)
        return now_ms()

    def restore(self, kill: Kill) -> None:
        """Restart the node on its data; wait until every partition has all its replicas."""
        kill.restart_ms = now_ms()
        self.cluster.start_node(kill.node, timeout=RESTORE_TIMEOUT)
        kill.serving_ms = now_ms()
        self.wait(
            "every replica back in sync",
            lambda: not under_replicated(self.admin, self.topics, REPLICAS),
            RESTORE_TIMEOUT,
        )
        kill.end_ms = now_ms()
        print(f"failover: node {kill.node} back, all replicas in sync", flush=True)


def caught_up(feeder: Feeder, tail: OutputTail) -> bool:
    """Every input record acknowledged so far has an output."""
    return len({o.source for o in tail.outputs()}) >= feeder.acknowledged


def kill_input_leader(s: Scenario, input_topic: str, group: str) -> None:
    """The leader of the first input partition not led by the group's coordinator (so that
    this kill is not also the third's), or of partition 0 when the coordinator leads all."""
    lead = leaders(s.admin, [input_topic])
    busy = coordinator(s.bootstrap, group)
    partition = min((p for (_, p), n in lead.items() if n != busy), default=0)
    node = lead[(input_topic, partition)]
    mine = {p for (_, p), n in lead.items() if n == node}
    affected = lambda o: o.source[0] in mine  # noqa: E731
    what = f"leader of input partition {partition}"
    scope = f"input partitions {sorted(mine)}" + (", the coordinator" if node == busy else "")
    kill = s.kill(what, node, affected, scope)
    elected = s.new_leaders({(input_topic, p) for p in mine}, node)
    s.outputs_since(elected, affected, RECOVERED_OUTPUTS)
    s.restore(kill)


def kill_output_leader(s: Scenario, output_topics: list[str], group: str) -> None:
    """The leader of the busiest output partition not led by the group's coordinator (or of
    the busiest one when the coordinator leads all)."""
    lead = leaders(s.admin, output_topics)
    busy = coordinator(s.bootstrap, group)
    written = Counter((o.topic, o.partition) for o in s.tail.outputs())
    ranked = sorted(written, key=lambda tp: (lead[tp] == busy, -written[tp]))
    busiest = ranked[0]
    node = lead[busiest]
    mine = {tp for tp, n in lead.items() if n == node}
    affected = lambda o: (o.topic, o.partition) in mine  # noqa: E731
    scope = f"{len(mine)} output partitions" + (", the coordinator" if node == busy else "")
    kill = s.kill(f"leader of output partition {busiest[0]}[{busiest[1]}]", node, affected, scope)
    elected = s.new_leaders(mine, node)
    s.outputs_since(elected, affected, RECOVERED_OUTPUTS)
    s.restore(kill)


def kill_coordinator(s: Scenario, group: str) -> None:
    node = s.wait("the group's coordinator", lambda: coordinator(s.bootstrap, group), 60)
    before = s.wait("the group's committed offsets", lambda: committed(s.bootstrap, group), 60)
    kill = s.kill("group coordinator", node, lambda _: True, "every partition")
    s.wait(
        "a new coordinator",
        lambda: (c := coordinator(s.bootstrap, group)) is not None and c != node,
        ELECTION_TIMEOUT,
    )

    def moved() -> bool:
        offsets = committed(s.bootstrap, group) or {}
        return any(offset > before.get(tp, -1) for tp, offset in offsets.items())

    s.wait("the group's commits after the kill", moved, RECOVERY_TIMEOUT)
    kill.commits_again_ms = now_ms()
    s.outputs_since(kill.commits_again_ms, kill.affected, RECOVERED_OUTPUTS)
    s.restore(kill)


def longest_pause(
    kill: Kill, outputs: list[Seen], affected: Callable[[Seen], bool]
) -> tuple[float, float]:
    """The longest pause in the affected outputs' arrival between the kill and the node's
    return (the kill itself starts the first pause): its start and end, in seconds after the
    kill. Its end is when the worker scored them again."""
    times = sorted(
        o.appended_ms for o in outputs if kill.at_ms < o.appended_ms <= kill.end_ms and affected(o)
    )
    assert times, f"kill of node {kill.node} ({kill.what}): no output until the node was back"
    points = [kill.at_ms, *times]
    _, start, end = max((b - a, a, b) for a, b in itertools.pairwise(points))
    return (start - kill.at_ms) / 1000, (end - kill.at_ms) / 1000


def from_partition(partition: int) -> Callable[[Seen], bool]:
    return lambda output: output.source[0] == partition


def figures(kills: list[Kill], outputs: list[Seen]) -> list[str]:
    lines = []
    partitions = sorted({o.source[0] for o in outputs})
    for number, kill in enumerate(kills, 1):
        paused, again = longest_pause(kill, outputs, lambda _: True)
        affected = longest_pause(kill, outputs, kill.affected)[1]
        each = [longest_pause(kill, outputs, from_partition(p))[1] for p in partitions]
        line = (
            f"failover: kill {number}, {kill.what} (node {kill.node}; {kill.scope}): the worker "
            f"published again {again:.1f} s after the kill (nothing from {paused:.1f} s); the "
            f"affected partitions again after {affected:.1f} s, each input partition after "
            f"{', '.join(f'{t:.1f}' for t in each)} s; node restarted at "
            f"{(kill.restart_ms - kill.at_ms) / 1000:.1f} s, serving at "
            f"{(kill.serving_ms - kill.at_ms) / 1000:.1f} s, all in sync at "
            f"{(kill.end_ms - kill.at_ms) / 1000:.1f} s"
        )
        if kill.commits_again_ms is not None:
            line += f"; commits again after {(kill.commits_again_ms - kill.at_ms) / 1000:.1f} s"
        lines.append(line)
    summary = ", ".join(f"{longest_pause(k, outputs, lambda _: True)[1]:.1f}" for k in kills)
    lines.append(f"failover: the worker published again {summary} s after kills 1-{len(kills)}")
    return lines


@dataclass
class Accounting:
    """Per input record (partition, offset): lost, unknown, duplicated and differing outputs."""

    lost: list[tuple[int, int]]
    unknown: list[tuple[int, int]]
    duplicates: int
    differing: dict[tuple[int, int], list[tuple[str, bytes | None, bytes | None]]]
    topics: Counter[str]


def accounting(expected: set[tuple[int, int]], outputs: list[Seen]) -> Accounting:
    by_source: dict[tuple[int, int], list[Seen]] = defaultdict(list)
    for output in outputs:
        by_source[output.source].append(output)
    differing = {
        source: sorted({(o.topic, o.key, o.value) for o in copies}, key=repr)[:2]
        for source, copies in by_source.items()
        if len({o.content for o in copies}) > 1
    }
    return Accounting(
        lost=sorted(expected - set(by_source)),
        unknown=sorted(set(by_source) - expected),
        duplicates=sum(len(copies) - 1 for copies in by_source.values()),
        differing=differing,
        topics=Counter(o.topic for o in outputs),
    )


@pytest.mark.timeout(1800)
def test_leader_failover_loses_nothing_and_the_worker_rides_it_out(new_topic_name) -> None:
    env, decisions = worker_topics(
        new_topic_name("failover"),
        PARTITIONS,
        KP_REPLICATION_FACTOR=str(REPLICAS),
        KP_CACHE_CAPACITY="200",  # a rebalance's cache rebuild takes seconds, not a minute
        # About a third of these traces score over 0.4 (a fortieth over the default 0.75):
        # every output topic is written to.
        KP_ACCEPT_THRESHOLD="0.4",
    )
    input_topic, group, output_topics = env["KP_INPUT_TOPIC"], env["KP_GROUP_ID"], [*decisions]
    # The output topics as the worker would create them, with the arrival times added.
    output_config = {
        "min.insync.replicas": MIN_IN_SYNC,
        "max.message.bytes": str(load_settings(environ={}).output_record_limit),
        "message.timestamp.type": "LogAppendTime",
    }
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
        worker = WorkerProcess(bootstrap, **env)
        s = Scenario(cluster, worker, tail, [input_topic, *output_topics, "__consumer_offsets"])
        try:
            feeder.send(BACKLOG)
            tail.start()
            worker.start().wait_ready(timeout=180)
            feeder.start()
            s.wait("outputs", lambda: len(tail.outputs()) >= 50, RECOVERY_TIMEOUT)
            kill_input_leader(s, input_topic, group)  # while the backlog is being scored
            for kill in (
                lambda: kill_output_leader(s, output_topics, group),
                lambda: kill_coordinator(s, group),
            ):
                s.wait("the worker caught up", lambda: caught_up(feeder, tail), DRAIN_TIMEOUT)
                feeder.send(BURST)
                time.sleep(1.0)
                kill()
            feeder.finish()
            ends = end_offsets(bootstrap, input_topic, PARTITIONS)
            expected = {(p, offset) for p, end in ends.items() for offset in range(end)}
            tail.wait_for(expected, DRAIN_TIMEOUT, s.alive)
            time.sleep(SETTLE_SECONDS)  # duplicates written after the last expected output
            s.alive()
        finally:
            code = worker.stop()
            tail.stop()
            feeder.close()
        outputs = tail.outputs()

    result = accounting(expected, outputs)
    events = worker.events()
    crashed = [
        e
        for e in events
        if "Crashed" in str(e.get("event")) or e.get("event") == STOPPED_ON_FAILURE
    ]
    print()
    for line in figures(s.kills, outputs):
        print(line)
    print(
        f"failover: {len(expected)} inputs, {len(outputs)} outputs {dict(result.topics)}, "
        f"duplicates {result.duplicates}, differing {len(result.differing)}, "
        f"lost {len(result.lost)}; assignments "
        f"{sum(e.get('event') == 'partitions assigned' for e in events)}, publish retries "
        f"{sum(e.get('event') == 'publish failed, retrying' for e in events)}; "
        f"exit code on SIGTERM {code}"
    )
    assert not crashed, crashed[:3]
    assert not result.lost, f"input records without an output: {result.lost[:10]}"
    assert not result.unknown, f"outputs of no input record: {result.unknown[:10]}"
    assert not result.differing, f"copies that differ: {list(result.differing.items())[:2]}"
