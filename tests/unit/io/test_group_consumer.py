"""The input topic's group consumer (worker/io/group_consumer.py), without Kafka: aiokafka's
consumer is a fake that answers each fetch from a queue and writes every call the worker makes
of it to one event list, and the pipeline is a stand-in that keeps each record's
acknowledgement for the test to run (as the StreamScorer runs it once the record's output is
published)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import ConsumerRecord

from worker.core.records import SourceRecord
from worker.io import group_consumer
from worker.io.group_consumer import GroupConsumer, group_consumer_config
from worker.settings import Settings, load_settings
from worker.stream.checkpoint import Acknowledge, Checkpoint, CommitWentBackwards
from worker.stream.observer import MetricsObserver
from worker.stream.permissions import Permissions

TOPIC = "kp.traces.raw"
GROUP = "kp-scorer"
Event = tuple[Any, ...]
Batch = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


def tp(partition: int) -> TopicPartition:
    return TopicPartition(TOPIC, partition)


def batch(partition: int, *offsets: int) -> Batch:
    return {
        tp(partition): [
            ConsumerRecord(TOPIC, partition, o, 1_700_000_000_000, 0, b"k", b"{}", None, 1, 2, ())
            for o in offsets
        ]
    }


class Client:
    """aiokafka's group consumer as the worker uses it; commits and seeks are events."""

    def __init__(self, events: list[Event], **config: Any) -> None:
        self.events = events
        self.config = config
        self.answers: asyncio.Queue[Batch | BaseException] = asyncio.Queue()
        self.asked = 0  # fetches asked for
        self.assigned: set[TopicPartition] = set()
        self.committed_offsets: dict[TopicPartition, int] = {}
        self.offsets_readable = asyncio.Event()
        self.offsets_readable.set()
        self.refusal: KafkaError | None = None  # what the next commit raises

    async def start(self) -> None:
        self.events.append(("start",))

    def subscribe(self, topics: list[str], listener: object) -> None:
        self.events.append(("subscribe", topics, listener))

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Batch:
        self.asked += 1
        try:
            answer = await self.answers.get()
        except asyncio.CancelledError:
            self.events.append(("fetch cancelled",))
            raise
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def highwater(self, partition: TopicPartition) -> int:
        return 100

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.events.append(("commit", {p.partition: o for p, o in offsets.items()}))
        refusal, self.refusal = self.refusal, None
        if refusal is not None:
            raise refusal

    async def committed(self, partition: TopicPartition) -> int | None:
        self.events.append(("committed", partition.partition))
        await self.offsets_readable.wait()
        return self.committed_offsets.get(partition)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.events.append(("seek", partition.partition, offset))

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self.events.append(("seek to beginning", *(p.partition for p in partitions)))

    def pause(self, *partitions: TopicPartition) -> None:
        self.events.append(("pause", *(p.partition for p in partitions)))

    def resume(self, *partitions: TopicPartition) -> None:
        self.events.append(("resume", *(p.partition for p in partitions)))

    async def stop(self) -> None:
        self.events.append(("stop",))


class Pipeline:
    """The StreamScorer's side of the consumer: records submitted, acknowledgements kept."""

    def __init__(self) -> None:
        self.checkpoint = Checkpoint(publisher=SimpleNamespace())  # type: ignore[arg-type]
        self.sent_back: list[tuple[tuple[str, int], int]] = []
        self.forgotten: list[tuple[str, int]] = []
        self.partitions = SimpleNamespace(
            hold_fetching=None,
            consumer_sent_back=lambda tp, read: self.sent_back.append((tp, read)),
            forget=self.forgotten.extend,
        )
        self.failed: list[BaseException] = []
        self.failures = SimpleNamespace(consumer_failed=self.failed.append)
        self.submitted: list[tuple[int, int]] = []
        self.acks: dict[tuple[int, int], Acknowledge] = {}
        self.assignments: list[list[tuple[str, int]]] = []

    async def submit(
        self,
        records: Sequence[SourceRecord],
        received_at: Sequence[float],
        acknowledgements: Sequence[Acknowledge],
    ) -> None:
        for record, ack in zip(records, acknowledgements, strict=True):
            self.submitted.append((record.partition, record.offset))
            self.acks[record.partition, record.offset] = ack

    async def published(self, partition: int, *offsets: int) -> None:
        """The records' outputs were published: their acknowledgements run."""
        for offset in offsets:
            await self.acks[partition, offset]()

    def assigned(self, partitions: Sequence[tuple[str, int]]) -> None:
        self.assignments.append(list(partitions))
        self.checkpoint.assigned(partitions)


class Transactions:
    """TransactionalPublisher's side of exactly-once; fences, commits and releases are events."""

    def __init__(self, events: list[Event], owned: Iterable[int] = ()) -> None:
        self.events = events
        self.owned = {(TOPIC, p) for p in owned}
        self.offsets: dict[tuple[str, int], int] = {}  # what the next commit commits
        self.failure: KafkaError | None = None  # what the next commit raises

    def owns(self, partition: tuple[str, int]) -> bool:
        return partition in self.owned

    async def fence(self, partitions: Iterable[tuple[str, int]]) -> None:
        wanted = sorted(partitions)
        self.events.append(("fence", [p for _, p in wanted]))
        self.owned = set(wanted)

    async def commit(self) -> dict[tuple[str, int], int]:
        self.events.append(("transactions commit",))
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure
        return dict(self.offsets)

    async def release(self, partitions: Sequence[tuple[str, int]]) -> None:
        self.events.append(("release", [p for _, p in partitions]))
        self.owned -= set(partitions)


class Worker:
    """A started GroupConsumer with its fakes."""

    def __init__(
        self, settings: Settings, monkeypatch: pytest.MonkeyPatch, transactions: bool = False
    ) -> None:
        self.events: list[Event] = []
        self.clients: list[Client] = []
        self.pipeline = Pipeline()
        self.observer = MetricsObserver()
        self.crashes: list[BaseException] = []
        self.transactions = Transactions(self.events) if transactions else None

        def built(**config: Any) -> Client:
            self.clients.append(Client(self.events, **config))
            return self.clients[-1]

        monkeypatch.setattr(group_consumer, "AIOKafkaConsumer", built)
        self.group = GroupConsumer(
            settings,
            self.pipeline,  # type: ignore[arg-type]
            self.observer,
            self.crashes.append,
            self.transactions,  # type: ignore[arg-type]
        )

    @property
    def client(self) -> Client:
        return self.clients[-1]

    async def assigned(self, *partitions: int) -> None:
        self.client.assigned = {tp(p) for p in partitions}
        await self.group.on_partitions_assigned(self.client.assigned)

    async def fetched(self, answer: Batch | BaseException) -> None:
        """The fetch answers ``answer``; returns once the consumer has taken all of it."""
        asked = self.client.asked
        await self.client.answers.put(answer)
        for _ in range(1000):
            if self.client.asked > asked:
                return
            await asyncio.sleep(0)
        raise AssertionError("the consumer did not ask for records again")

    def commits(self) -> list[dict[int, int]]:
        return [event[1] for event in self.events if event[0] == "commit"]


def run(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    scenario: Callable[[Worker], Awaitable[None]],
    transactions: bool = False,
) -> Worker:
    async def started() -> Worker:
        worker = Worker(settings, monkeypatch, transactions)
        await worker.group.start()
        try:
            await scenario(worker)
        finally:
            await worker.group.stop()
        return worker

    return asyncio.run(started())


@pytest.fixture
def settings(isolated_settings: None, monkeypatch: pytest.MonkeyPatch) -> Settings:
    # A refused or failed fetch is asked again at once; no periodic commit during a test.
    monkeypatch.setattr(group_consumer, "REFUSED_PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(group_consumer, "RETRY_SECONDS", 0.0)
    return load_settings(commit_interval_seconds=3600.0)


# -- the client -------------------------------------------------------------------------------
def test_the_consumer_reads_committed_records_as_the_settings_say(
    isolated_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_committed (a producer's aborted records are never scored), the fetch wait and size
    from the settings, offsets committed by the worker alone, the assignor faust gave workers
    of earlier versions, the group's timeouts, and new partitions seen within 10 s."""
    settings = load_settings(
        fetch_max_wait_ms=7,
        fetch_buffer_records=123,
        session_timeout_seconds=30.0,
        heartbeat_interval_seconds=3.0,
    )
    config = group_consumer_config(settings)
    assert config["isolation_level"] == "read_committed"
    assert (config["fetch_max_wait_ms"], config["max_poll_records"]) == (7, 123)
    bound = settings.fetch_max_bytes
    assert (config["fetch_max_bytes"], config["max_partition_fetch_bytes"]) == (bound, bound)
    assert config["enable_auto_commit"] is False
    assert config["auto_offset_reset"] == "earliest"
    assert config["partition_assignment_strategy"] == (RoundRobinPartitionAssignor,)
    assert (config["group_id"], config["session_timeout_ms"]) == (GROUP, 30_000)
    assert config["heartbeat_interval_ms"] == 3_000
    assert config["request_timeout_ms"] >= 30_000  # type: ignore[operator]
    assert config["metadata_max_age_ms"] <= 10_000  # type: ignore[operator]

    async def built() -> Worker:
        await AIOKafkaConsumer(**config).stop()  # aiokafka takes every key
        worker = Worker(settings, monkeypatch)
        await worker.group.start()
        await worker.group.stop()
        return worker

    worker = asyncio.run(built())
    assert worker.client.config == config
    assert worker.events[:2] == [("start",), ("subscribe", [TOPIC], worker.group)]


# -- records and commits ----------------------------------------------------------------------
def test_a_record_is_committed_only_once_its_output_is_published(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        await worker.fetched(batch(0, 0, 1, 2))
        assert worker.pipeline.submitted == [(0, 0), (0, 1), (0, 2)]
        assert await worker.group.commit()
        assert worker.commits() == [], "nothing published, nothing committed"
        await worker.pipeline.published(0, 1)
        await worker.group.commit()
        assert worker.commits() == [], "offset 0 still waits on the broker"
        await worker.pipeline.published(0, 0)
        await worker.group.commit()
        await worker.group.commit()  # nothing new: no second commit of the same offset
        assert worker.commits() == [{0: 2}]

    run(settings, monkeypatch, scenario)


def test_a_commit_that_would_go_backwards_never_reaches_the_broker(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        await worker.fetched(batch(0, 3, 4))
        await worker.pipeline.published(0, 3, 4)
        assert await worker.group.commit()
        # Kept across a rebalance, delivered again from offset 3 (as if 5 had not landed).
        await worker.assigned(0)
        await worker.fetched(batch(0, 3))
        await worker.pipeline.published(0, 3)
        assert not await worker.group.commit()
        assert worker.commits() == [{0: 5}]
        await worker.assigned(0)  # (the stop's commit would refuse it again)

    worker = run(settings, monkeypatch, scenario)
    (crash,) = worker.crashes
    assert isinstance(crash, CommitWentBackwards)
    assert "offset 4 for kp.traces.raw[0] below its last commit 5" in str(crash)


def test_a_commit_the_group_refused_has_not_landed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused while the group rebalanced: the records after the last commit that landed are
    delivered again, and their commit, below the refused one, is no commit going backwards."""

    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        await worker.fetched(batch(0, 4))
        await worker.pipeline.published(0, 4)
        assert await worker.group.commit()
        await worker.fetched(batch(0, 5, 6, 7, 8))
        await worker.pipeline.published(0, 5, 6, 7, 8)
        worker.client.refusal = CommitFailedError("the group rebalanced")
        assert not await worker.group.commit()
        await worker.assigned(0)  # kept: delivered again from the commit that landed
        await worker.fetched(batch(0, 5, 6))
        await worker.pipeline.published(0, 5, 6)
        assert await worker.group.commit()
        # Refused by a broker gone a moment: the same offset is committed at the next chance.
        await worker.fetched(batch(0, 7))
        await worker.pipeline.published(0, 7)
        worker.client.refusal = KafkaConnectionError()
        assert not await worker.group.commit()
        assert await worker.group.commit()
        assert worker.commits() == [{0: 5}, {0: 9}, {0: 7}, {0: 8}, {0: 8}]

    run(settings, monkeypatch, scenario)


def test_revoked_partitions_are_committed_before_they_go(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their next owner starts after the records this worker published (at least once)."""

    async def scenario(worker: Worker) -> None:
        await worker.assigned(0, 1)
        await worker.fetched(batch(0, 0, 1, 2))
        await worker.fetched(batch(1, 0))
        await worker.pipeline.published(0, 0, 1)
        await worker.pipeline.published(1, 0)
        await worker.group.on_partitions_revoked({tp(0)})
        assert worker.commits() == [{0: 2}], "only the revoked partition"
        await worker.pipeline.published(0, 2)  # too late: the partition is gone
        await worker.group.commit()
        assert worker.commits() == [{0: 2}, {1: 1}]

    run(settings, monkeypatch, scenario)


def test_a_record_below_the_last_one_read_tells_the_worker_its_log_started_over(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client goes back like this only to the log's start, when its position passed the
    log's end (topic recreated, log truncated): the new log's records are the worker's too,
    and only their acknowledgements count."""

    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        await worker.fetched(batch(0, 9, 10))
        await worker.fetched(batch(0, 0))
        assert worker.pipeline.sent_back == [((TOPIC, 0), 10)]
        # The StreamScorer, admitting offset 0, lets the new log's commits go back.
        await worker.pipeline.checkpoint.log_restarted((TOPIC, 0))
        await worker.pipeline.published(0, 9, 10)  # the old log's, published late
        await worker.fetched(batch(0, 1))
        await worker.pipeline.published(0, 1)
        await worker.group.commit()
        assert worker.commits() == [], "offset 0 of the new log still waits on the broker"
        await worker.pipeline.published(0, 0)
        await worker.group.commit()
        assert worker.commits() == [{0: 2}]
        assert worker.pipeline.sent_back == [((TOPIC, 0), 10)], "told once"
        assert worker.pipeline.submitted == [(0, o) for o in (9, 10, 0, 1)]

    run(settings, monkeypatch, scenario)


def test_a_partition_held_for_its_rebuild_is_not_fetched(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        hold = worker.pipeline.partitions.hold_fetching
        await worker.assigned(0)
        hold((TOPIC, 0), True)
        hold((TOPIC, 1), True)  # not assigned: paused once it is
        hold((TOPIC, 0), False)
        await worker.assigned(0, 1)
        assert [e for e in worker.events if e[0] in ("pause", "resume")] == [
            ("pause", 0),
            ("resume", 0),
            ("pause", 1),
        ]

    run(settings, monkeypatch, scenario)


# -- refusals ---------------------------------------------------------------------------------
def test_a_permission_refused_to_the_consumer_is_reported_and_asked_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]

    async def scenario(worker: Worker) -> None:
        worker.observer.permissions = permissions = Permissions(clock=lambda: now[0])
        await worker.fetched(GroupAuthorizationFailedError(GROUP))
        await worker.fetched(TopicAuthorizationFailedError({TOPIC}))
        assert permissions.readiness() == (
            f"not authorized: Read on group '{GROUP}'; Read on topic '{TOPIC}'"
        )
        await worker.assigned(0)  # the group's Read is lifted by an assignment
        await worker.fetched({})  # a fetch that works lifts the topic's once none came a while
        assert permissions.readiness() == f"not authorized: Read on topic '{TOPIC}'"
        now[0] += 10
        await worker.fetched({})
        assert permissions.readiness() == "ok"
        await worker.fetched(KafkaConnectionError())
        await worker.fetched(batch(0, 0))
        assert worker.pipeline.submitted == [(0, 0)]

    worker = run(settings, monkeypatch, scenario)
    assert worker.crashes == []
    assert [type(exc) for exc in worker.pipeline.failed] == [KafkaConnectionError]


# -- exactly-once -----------------------------------------------------------------------------
def test_exactly_once_fences_the_previous_owners_before_reading_committed_offsets(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        worker.client.committed_offsets = {tp(0): 7}
        await worker.assigned(1, 0)
        assert worker.pipeline.assignments == [[(TOPIC, 0), (TOPIC, 1)]]

    worker = run(settings, monkeypatch, scenario, transactions=True)
    assert [
        e for e in worker.events if e[0] in ("fence", "committed", "seek", "seek to beginning")
    ] == [
        ("fence", [0, 1]),
        ("committed", 0),
        ("seek", 0, 7),
        ("committed", 1),
        ("seek to beginning", 1),  # no committed offset: from the log's start
    ]


def test_exactly_once_takes_no_records_of_a_partition_not_owned_or_still_being_sought(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        worker.client.offsets_readable.clear()
        assignment = asyncio.ensure_future(worker.assigned(0))  # kept, sought again
        while worker.events.count(("committed", 0)) < 2:  # fenced, its offset being read
            await asyncio.sleep(0)
        await worker.fetched(batch(0, 5))  # fetched before the seek: delivered again
        worker.client.offsets_readable.set()
        await assignment
        await worker.fetched(batch(1, 0))  # fenced by another worker
        await worker.fetched(batch(0, 3))
        assert worker.pipeline.submitted == [(0, 3)]

    run(settings, monkeypatch, scenario, transactions=True)


def test_exactly_once_commits_offsets_only_in_the_partitions_transactions(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        await worker.fetched(batch(0, 0, 1))
        await worker.pipeline.published(0, 0, 1)
        assert worker.transactions is not None
        worker.transactions.offsets = {(TOPIC, 0): 2}
        assert await worker.group.commit()
        await worker.group.on_partitions_revoked({tp(0)})

    worker = run(settings, monkeypatch, scenario, transactions=True)
    assert worker.commits() == [], "no plain commit beside the transactions"
    assert worker.events.count(("transactions commit",)) == 3  # commit, revocation, stop
    # A later commit of the same offset would go backwards otherwise: the checkpoint knows it.
    with pytest.raises(CommitWentBackwards):
        worker.pipeline.checkpoint.committing({(TOPIC, 0): 1})


def test_exactly_once_revoked_partitions_are_committed_in_their_transactions_and_released(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        await worker.assigned(0, 1)
        await worker.fetched(batch(0, 0))
        await worker.pipeline.published(0, 0)
        worker.events.clear()
        await worker.group.on_partitions_revoked({tp(1), tp(0)})
        assert worker.events == [("transactions commit",), ("release", [0, 1])]
        assert worker.pipeline.forgotten == [(TOPIC, 0), (TOPIC, 1)]

    run(settings, monkeypatch, scenario, transactions=True)


# -- the stop ---------------------------------------------------------------------------------
def test_a_stop_commits_last_after_fetching_ended_and_before_the_client_stops(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(worker: Worker) -> None:
        await worker.assigned(0)
        await worker.fetched(batch(0, 0, 1))
        await worker.pipeline.published(0, 0, 1)
        worker.events.clear()
        await asyncio.wait_for(worker.group.stop(), 5)
        others = asyncio.all_tasks() - {asyncio.current_task()}
        assert all(task.done() for task in others), "the fetch and the periodic commit ended"

    worker = run(settings, monkeypatch, scenario)
    assert worker.events[:3] == [("fetch cancelled",), ("commit", {0: 2}), ("stop",)]


def test_exactly_once_a_transaction_that_failed_to_commit_stops_the_worker(
    isolated_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its transaction aborted, the records in it were acknowledged here all the same: the next
    transaction's offset would commit past them, so only a restart from the committed offsets
    scores them again."""

    async def scenario(worker: Worker) -> None:
        assert worker.transactions is not None
        worker.transactions.failure = KafkaConnectionError()
        for _ in range(1000):
            if worker.crashes:
                break
            await asyncio.sleep(0.001)

    settings = load_settings(commit_interval_seconds=0.001)
    worker = run(settings, monkeypatch, scenario, transactions=True)
    assert [type(exc) for exc in worker.crashes] == [KafkaConnectionError]
    assert worker.events.count(("transactions commit",)) == 2  # the failed one, the stop's
