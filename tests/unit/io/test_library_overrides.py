"""Each private faust and aiokafka member the worker overrides still exists in the shape the
override expects (worker/io/library_overrides.py, worker/io/unreadable.py): a library upgrade
that renames or reshapes one fails here, not silently in production."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from types import SimpleNamespace

import aiokafka
import faust.transport.consumer as faust_consumer
import mode.threads
import pytest
from aiokafka.consumer import fetcher, group_coordinator
from aiokafka.errors import GroupAuthorizationFailedError, KafkaError
from aiokafka.record import default_records
from aiokafka.record._crecords import default_records as compiled_default_records
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from worker.io import library_overrides, unreadable
from worker.stream.checkpoint import Checkpoint, CommitWentBackwards
from worker.stream.permissions import Permissions


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def source(member: object) -> str:
    return inspect.getsource(member)  # type: ignore[arg-type]


def test_the_group_consumer_is_still_built_by_create_worker_consumer() -> None:
    built = faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer
    assert parameters(built) == ["self", "transport"]
    overridden = library_overrides.ScorerConsumerThread._create_worker_consumer
    assert parameters(overridden) == parameters(built)


def test_the_fetch_settings_are_still_read_from_the_consumer_when_it_starts() -> None:
    async def build() -> aiokafka.AIOKafkaConsumer:
        return aiokafka.AIOKafkaConsumer(
            fetch_max_wait_ms=7, fetch_max_bytes=12_345, isolation_level="read_committed"
        )

    consumer = asyncio.run(build())
    assert (consumer._fetch_max_wait_ms, consumer._fetch_max_bytes) == (7, 12_345)
    assert consumer._isolation_level == "read_committed"
    start = source(aiokafka.AIOKafkaConsumer.start)
    for member in ("_fetch_max_wait_ms", "_fetch_max_bytes", "_isolation_level"):
        assert f"self.{member}" in start


def test_pausing_a_partition_still_finds_the_client_and_the_thread_loop() -> None:
    assert "self._consumer" in source(faust_aiokafka.AIOKafkaConsumerThread)
    assert "self.thread_loop" in source(mode.threads.ServiceThread.__init__)
    assert parameters(faust_aiokafka.Consumer._new_consumer_thread) == ["self"]
    for hook in ("on_buffer_full", "on_buffer_drop"):
        assert parameters(getattr(faust_consumer.Consumer, hook)) == ["self", "tp"]
    assert "_buffered_partitions" in source(faust_consumer.Consumer.on_buffer_full)


def test_every_commit_still_goes_through_commit() -> None:
    assert parameters(faust_aiokafka.Consumer._commit) == ["self", "offsets"]
    assert "self._commit(" in source(faust_consumer.Consumer._commit_offsets)
    assert library_overrides.ScorerTransport.Consumer is library_overrides.ScorerConsumer


def test_the_assignment_still_reads_committed_offsets_through_perform_seek() -> None:
    """Where exactly-once fences each partition's previous owner
    (``ScorerConsumer.perform_seek``)."""
    assert parameters(faust_consumer.Consumer.perform_seek) == ["self"]
    assert "self.seek_to_committed()" in source(faust_consumer.Consumer.perform_seek)
    recovery = inspect.getsource(importlib.import_module("faust.tables.recovery"))
    assert "consumer.perform_seek()" in recovery


def test_exactly_once_fences_the_previous_owners_before_reading_committed_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[object] = []

    async def perform_seek(self: object) -> None:
        calls.append("committed offsets read")

    class Transactions:
        async def fence(self, partitions: object) -> None:
            calls.append(("fenced", sorted(partitions)))  # type: ignore[call-overload]

    monkeypatch.setattr(faust_consumer.Consumer, "perform_seek", perform_seek)
    consumer = object.__new__(library_overrides.ScorerConsumer)
    consumer.app = SimpleNamespace(transactions=Transactions())
    monkeypatch.setattr(
        library_overrides.ScorerConsumer, "assignment", lambda self: {TP("raw", 1), TP("raw", 0)}
    )
    asyncio.run(consumer.perform_seek())
    assert calls == [("fenced", [("raw", 0), ("raw", 1)]), "committed offsets read"]

    calls.clear()
    consumer.app = SimpleNamespace(transactions=None)  # at least once: nothing to fence
    asyncio.run(consumer.perform_seek())
    assert calls == ["committed offsets read"]


def test_exactly_once_commits_offsets_only_in_the_partitions_transactions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain: list[object] = []

    async def commit(self: object, offsets: object) -> bool:
        plain.append(offsets)
        return True

    class Transactions:
        committed = 0

        async def commit(self) -> dict[tuple[str, int], int]:
            self.committed += 1
            return {("raw", 0): 5}

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit", commit)
    consumer = object.__new__(library_overrides.ScorerConsumer)
    transactions = Transactions()
    consumer.app = SimpleNamespace(stream_scorer=None, transactions=transactions)
    assert asyncio.run(consumer._commit({TP("raw", 0): 5}))
    assert (transactions.committed, plain) == (1, []), "no plain commit beside the transaction"


def test_every_message_is_still_built_by_to_message_from_the_clients_record() -> None:
    """``ScorerConsumer._to_message`` keeps the record's integer timestamp on each message
    (tests/unit/io/test_record_timestamps.py runs it on every int64)."""
    assert parameters(faust_aiokafka.Consumer._to_message) == ["self", "tp", "record"]
    assert "to_message(tp, record)" in source(faust_consumer.Consumer.getmany)


def test_batches_are_still_read_through_partition_records_and_the_codec_functions() -> None:
    assert parameters(fetcher.PartitionRecords.__init__)[:3] == ["self", "tp", "records"]
    assert "PartitionRecords(" in source(fetcher)
    for module in (default_records, compiled_default_records):
        for name in ("gzip_decode", "lz4_decode", "zstd_decode"):
            assert callable(getattr(module, name)), f"{module.__name__}.{name}"
    assert unreadable.TolerantPartitionRecords.__mro__[1].__name__ == "PartitionRecords"


def test_a_commit_that_would_go_backwards_never_reaches_the_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[TP, int]] = []
    group_refuses = False

    async def commit(self: object, offsets: dict[TP, int]) -> bool:
        sent.append(dict(offsets))
        return not group_refuses  # faust's answer to a commit the rebalancing group refused

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit", commit)
    checkpoint = Checkpoint(publisher=SimpleNamespace())  # type: ignore[arg-type]
    consumer = object.__new__(library_overrides.ScorerConsumer)
    consumer.app = SimpleNamespace(
        stream_scorer=SimpleNamespace(checkpoint=checkpoint), transactions=None
    )
    partition = TP("raw", 0)

    assert asyncio.run(consumer._commit({partition: 5}))
    assert asyncio.run(consumer._commit({partition: 5}))  # the same again: not backwards
    with pytest.raises(CommitWentBackwards, match=r"offset 3 for raw\[0\] below its last commit 5"):
        asyncio.run(consumer._commit({partition: 3}))
    assert sent == [{partition: 5}, {partition: 5}]

    checkpoint.assigned([])  # revoked: its next ownership starts from the group's offset
    assert asyncio.run(consumer._commit({partition: 3}))
    assert sent[-1] == {partition: 3}

    # A commit the group refused while it rebalanced did not land: the partition, kept, is
    # delivered again from offset 3 and its next commit may be below the refused one.
    group_refuses = True
    assert not asyncio.run(consumer._commit({partition: 9}))
    group_refuses = False
    assert asyncio.run(consumer._commit({partition: 6}))
    assert sent[-1] == {partition: 6}


def test_a_permission_refused_to_the_consumer_still_reaches_the_worker() -> None:
    """``ScorerConsumerThread._fetch_records`` and ``_take_refusal`` (with Apache Kafka and
    its ACLs: tests/broker/test_security_kafka.py)."""
    fetch = faust_aiokafka.AIOKafkaConsumerThread._fetch_records
    assert parameters(library_overrides.ScorerConsumerThread._fetch_records) == parameters(fetch)
    assert "self._fetch_records," in source(faust_aiokafka.AIOKafkaConsumerThread.getmany)
    assert "fetcher.fetched_records(" in source(fetch)
    assert "check_errors" not in source(fetch), "faust takes the coordinator's errors now"
    coordinator = source(group_coordinator.GroupCoordinator)
    for member in ("self._pending_exception = exc", "self._coordination_task = ", "check_errors"):
        assert member in coordinator

    taken: list[str] = []
    permissions = Permissions()
    thread = object.__new__(library_overrides.ScorerConsumerThread)
    thread.app = SimpleNamespace(observer=SimpleNamespace(permissions=permissions))

    def check_errors() -> None:
        taken.append("taken")
        raise GroupAuthorizationFailedError("the-group")

    running = SimpleNamespace(done=lambda: False)
    thread._consumer = SimpleNamespace(  # type: ignore[assignment]
        _coordinator=SimpleNamespace(
            _pending_exception=GroupAuthorizationFailedError("the-group"),
            _coordination_task=running,
            check_errors=check_errors,
        )
    )
    thread._take_refusal()
    assert taken == ["taken"]
    assert permissions.readiness() == "not authorized: Read on group 'the-group'"
    thread._consumer._coordinator._pending_exception = KafkaError("not ours")  # type: ignore[union-attr]
    thread._take_refusal()  # left for faust as before
    assert taken == ["taken"]


def test_a_log_that_started_over_still_finds_fausts_offset_bookkeeping() -> None:
    """``ScorerConsumer.getmany`` and ``forget_offsets`` (their behaviour:
    tests/unit/io/test_log_restart_consumer.py)."""
    drain = source(faust_consumer.Consumer._drain_messages)
    assert "getmany = self.getmany" in drain
    assert "get_read_offset = self._read_offset.__getitem__" in drain
    assert "offset >= r_offset" in drain, "faust still drops records below the last one read"
    built = source(faust_consumer.Consumer.__init__)
    for member in ("_gap", "_acked", "_acked_index", "_read_offset", "_committed_offset"):
        assert f"self.{member} = defaultdict(" in built
    assert parameters(faust_consumer.Consumer.getmany) == ["self", "timeout"]


def test_faust_still_drops_fetched_records_and_seeks_only_committed_partitions_back() -> None:
    """``ScorerConsumerThread.seek_to_committed`` (its behaviour: the next test)."""
    assert "perform_seek()" in source(faust_consumer.Consumer.getmany)
    assert "seek_to_committed()" in source(faust_consumer.Consumer.perform_seek)
    assert "if offset and offset > 0:" in source(aiokafka.AIOKafkaConsumer.seek_to_committed)
    thread = faust_aiokafka.AIOKafkaConsumerThread
    assert parameters(thread.seek_to_committed) == ["self"]
    assert parameters(thread.seek_to_beginning) == ["self", "partitions"]


def test_a_partition_without_a_committed_offset_goes_back_to_its_log_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    committed = {TP("raw", 0): 5, TP("raw", 1): None, TP("raw", 2): 0}
    sought: list[tuple[TP, ...]] = []

    async def seek_to_committed(self: object) -> dict[TP, int | None]:
        return committed

    async def seek_to_beginning(self: object, *partitions: TP) -> None:
        sought.append(partitions)

    thread_class = faust_aiokafka.AIOKafkaConsumerThread
    monkeypatch.setattr(thread_class, "seek_to_committed", seek_to_committed)
    monkeypatch.setattr(thread_class, "seek_to_beginning", seek_to_beginning)
    thread = object.__new__(library_overrides.ScorerConsumerThread)
    assert asyncio.run(thread.seek_to_committed()) == committed
    assert sought == [(TP("raw", 1), TP("raw", 2))]


def test_the_last_commit_at_a_stop_follows_a_commit_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """faust's last commit, finding a periodic one under way, waited for it and committed
    nothing: what was acknowledged meanwhile stayed uncommitted (a clean stop exited 75)."""
    commits: list[str] = []

    async def force_commit(self: object, *args: object, **kwargs: object) -> bool:
        commits.append("last")
        return True

    monkeypatch.setattr(library_overrides.ScorerConsumer, "force_commit", force_commit)

    async def scenario() -> None:
        consumer = object.__new__(library_overrides.ScorerConsumer)
        consumer.app = SimpleNamespace(
            client_only=False, conf=SimpleNamespace(stream_wait_empty=False)
        )
        consumer.transport = SimpleNamespace(_topic_waiters={})
        consumer._loop = asyncio.get_running_loop()
        under_way: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        consumer._commit_fut = under_way

        async def periodic_commit_ends() -> None:
            await asyncio.sleep(0.01)
            commits.append("periodic")
            consumer._commit_fut = None
            under_way.set_result(None)

        ending = asyncio.ensure_future(periodic_commit_ends())
        await consumer.on_stop()
        await ending

    asyncio.run(scenario())
    assert commits == ["periodic", "last"]


def test_revoked_partitions_are_committed_before_they_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """faust gave revoked partitions up with their acknowledgements uncommitted (their next
    owner scored those records again); exactly-once commits them in the app's own handler."""
    steps: list[str] = []

    async def commit(self: object, topics: set[TP] | None = None, **kwargs: object) -> bool:
        steps.append(f"commit {sorted(topics or ())}")
        return True

    async def revoked(self: object, partitions: set[TP]) -> None:
        steps.append("faust's revocation")

    monkeypatch.setattr(library_overrides.ScorerConsumer, "commit", commit)
    monkeypatch.setattr(faust_aiokafka.Consumer, "on_partitions_revoked", revoked)
    consumer = object.__new__(library_overrides.ScorerConsumer)
    consumer._commit_fut = None
    partition = TP("raw", 1)

    consumer.app = SimpleNamespace(transactions=None)
    asyncio.run(consumer.on_partitions_revoked({partition}))
    assert steps == [f"commit {[partition]}", "faust's revocation"]

    steps.clear()
    consumer.app = SimpleNamespace(transactions=object())
    asyncio.run(consumer.on_partitions_revoked({partition}))
    assert steps == ["faust's revocation"]
