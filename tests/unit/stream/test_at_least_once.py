"""At-least-once, without a broker: an input offset is acknowledged (and so may be committed)
only after the broker acknowledged its output, whatever the publisher does.

A real ``StreamScorer`` runs against a fake log and a publisher that acknowledges each output
after a chosen delay, or fails it. Every step is written to one event list in the order it
happened; an offset is "committed" as the consumer would commit it, up to the first offset
not yet acknowledged in its partition. A guarantee broken anywhere in the pipeline shows as an
``acknowledged`` or ``committed`` event before the ``published`` event of the same record.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from types import SimpleNamespace

import orjson
import pytest

from worker.core.cache import PartitionCaches
from worker.core.failures import FailurePolicy
from worker.core.records import RoutedRecord, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.stream.processor import Acknowledge, StreamScorer

from support.traces import make_trace

TOPIC = "raw"
Offset = tuple[int, int]  # (partition, offset)


class Ledger:
    """Publishes, acknowledgements and commits in the order they happened."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Offset]] = []
        self._acked: dict[int, set[int]] = defaultdict(set)
        self._committed: dict[int, int] = defaultdict(int)

    def acknowledgement(self, record: SourceRecord) -> Acknowledge:
        async def acknowledge() -> None:
            self.events.append(("acknowledged", (record.partition, record.offset)))
            self._commit(record.partition, record.offset)

        return acknowledge

    def _commit(self, partition: int, offset: int) -> None:
        """The consumer commits each partition up to its first unacknowledged offset."""
        self._acked[partition].add(offset)
        position = self._committed[partition]
        while position in self._acked[partition]:
            self.events.append(("committed", (partition, position)))
            position += 1
        self._committed[partition] = position

    def of(self, kind: str) -> list[Offset]:
        return [offset for event, offset in self.events if event == kind]

    def assert_nothing_acknowledged_before_published(self) -> None:
        published: set[Offset] = set()
        for event, offset in self.events:
            if event == "published":
                published.add(offset)
            elif offset not in published:
                raise AssertionError(
                    f"offset {offset} {event} before the broker acknowledged its output; "
                    f"events so far: {self.events[: self.events.index((event, offset)) + 1]}"
                )


class Publisher:
    """Acknowledges each output after ``delay(offset)`` seconds, or fails it."""

    def __init__(
        self,
        ledger: Ledger,
        delay: Callable[[Offset], float] = lambda _: 0.0,
        failing: Iterable[Offset] = (),
    ) -> None:
        self.ledger = ledger
        self.delay = delay
        self.failing = set(failing)

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        offsets = [(r.source.partition, r.source.offset) for r in routed]
        await asyncio.sleep(max(self.delay(offset) for offset in offsets))
        if self.failing.intersection(offsets):
            raise ConnectionError("the broker refused the output")
        self.ledger.events += [("published", offset) for offset in offsets]


class FakeLog:
    def __init__(self, records: list[SourceRecord]) -> None:
        self.records = records

    async def committed(self, topic: str, partition: int) -> int | None:
        return 0

    async def first_offset(self, topic: str, partition: int) -> int:
        return 0

    async def log_end(self, topic: str, partition: int, near: int) -> int:
        return 1 + max((r.offset for r in self.records if r.partition == partition), default=-1)

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        return [r for r in self.records if r.partition == partition and start <= r.offset < end]


def records(count: int, partitions: int = 2) -> list[SourceRecord]:
    """``count`` records per partition; offset 2 of each is not JSON (a dead letter)."""
    out = []
    for partition in range(partitions):
        for offset in range(count):
            value = orjson.dumps(make_trace(objective=f"task {partition}-{offset}"))
            if offset == 2:
                value = b"not json"
            out.append(SourceRecord(TOPIC, partition, offset, 1000 + offset, b"k", value))
    return out


def stream(inputs: list[SourceRecord], publisher: Publisher, **options: object) -> StreamScorer:
    scorer = Scorer(load_profiles(None), Thresholds(), PartitionCaches(), None)
    return StreamScorer(scorer, FakeLog(inputs), publisher, **options)  # type: ignore[arg-type]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=20))


@pytest.mark.parametrize("in_flight", [1, 4, 16])
def test_no_offset_is_acknowledged_or_committed_before_its_output_is_published(
    in_flight: int,
) -> None:
    """Slow publishes, later offsets acknowledged by the broker before earlier ones."""
    inputs = records(6)
    ledger = Ledger()
    publisher = Publisher(ledger, delay=lambda offset: 0.01 * (6 - offset[1]))

    async def scenario() -> None:
        pipeline = stream(inputs, publisher, max_in_flight_records=in_flight)
        pending = await pipeline.submit(
            inputs, acknowledgements=[ledger.acknowledgement(r) for r in inputs]
        )
        await asyncio.gather(*pending)
        await pipeline.checkpoint.drain()

    run(scenario())
    ledger.assert_nothing_acknowledged_before_published()
    everything = sorted((r.partition, r.offset) for r in inputs)
    assert sorted(ledger.of("acknowledged")) == everything
    assert sorted(ledger.of("committed")) == everything


def test_an_output_the_broker_refuses_is_never_acknowledged() -> None:
    inputs = records(6, partitions=1)
    ledger = Ledger()
    publisher = Publisher(ledger, delay=lambda offset: 0.01, failing=[(0, 3)])
    failures: list[BaseException] = []

    async def scenario() -> None:
        pipeline = stream(inputs, publisher, failures=FailurePolicy(stop=failures.append))
        pending = await pipeline.submit(
            inputs, acknowledgements=[ledger.acknowledgement(r) for r in inputs]
        )
        await asyncio.gather(*pending, return_exceptions=True)
        await pipeline.checkpoint.drain()

    run(scenario())
    ledger.assert_nothing_acknowledged_before_published()
    assert (0, 3) not in ledger.of("acknowledged")
    assert max(ledger.of("committed"), default=(0, -1)) < (0, 3), "no commit past the failure"
    assert failures and isinstance(failures[0], ConnectionError), "the worker stops on it"


def test_a_redelivered_offset_waits_for_its_first_delivery_to_be_published() -> None:
    """A rebalance hands the same records over again while the first delivery still waits
    for the broker: acknowledging the second copy must not commit the first's offset."""
    inputs = records(4, partitions=1)
    ledger = Ledger()
    publisher = Publisher(ledger, delay=lambda offset: 0.2)

    async def scenario() -> None:
        pipeline = stream(inputs, publisher)
        first = await pipeline.submit(inputs)  # acknowledged by nobody: the consumer moved on
        await asyncio.sleep(0.05)  # the first delivery is with the broker now
        again = await pipeline.submit(
            inputs, acknowledgements=[ledger.acknowledgement(r) for r in inputs]
        )
        assert again == [], "redelivered records are not scored twice"
        await asyncio.gather(*first)
        await pipeline.checkpoint.drain()

    run(scenario())
    ledger.assert_nothing_acknowledged_before_published()
    assert sorted(ledger.of("acknowledged")) == [(0, offset) for offset in range(4)]


def test_a_stop_acknowledges_nothing_the_broker_did_not_take() -> None:
    """SIGTERM with outputs still waiting for the broker: the stop gives up on them without
    acknowledging any, nor the records waiting for a place in the pipeline when it came, nor
    records handed over after it."""
    inputs = records(9, partitions=1)
    first, waiting, later = inputs[:3], inputs[3:6], inputs[6:]
    ledger = Ledger()
    publisher = Publisher(ledger, delay=lambda offset: 0.05 if offset[1] == 0 else 60.0)

    async def scenario() -> None:
        pipeline = stream(inputs, publisher, max_in_flight_records=3)
        pending = await pipeline.submit(
            first, acknowledgements=[ledger.acknowledgement(r) for r in first]
        )
        queued = asyncio.ensure_future(  # the pipeline is full: these wait for a place
            pipeline.submit(waiting, acknowledgements=[ledger.acknowledgement(r) for r in waiting])
        )
        while ("published", (0, 0)) not in ledger.events:  # 1 and 2 wait on the broker
            await asyncio.sleep(0.01)
        await pipeline.close(timeout=0.2)
        late = await pipeline.submit(
            later, acknowledgements=[ledger.acknowledgement(r) for r in later]
        )
        await asyncio.gather(*pending, *await queued, *late, return_exceptions=True)

    run(scenario())
    ledger.assert_nothing_acknowledged_before_published()
    assert ledger.of("published") == [(0, 0)]
    assert ledger.of("acknowledged") == [(0, 0)]


def test_a_stop_that_cannot_confirm_its_commits_exits_75(monkeypatch: pytest.MonkeyPatch) -> None:
    """Published records whose offsets may not be committed will be redelivered: the worker
    says so with EX_TEMPFAIL, not with a clean exit."""
    import faust

    from worker.io.app import ScorerWorker
    from worker.io.shutdown import EXIT_DEADLINE

    monkeypatch.setattr(faust.Worker, "stop_and_shutdown", lambda self: None)
    worker = object.__new__(ScorerWorker)
    worker.app = SimpleNamespace(left_uncommitted=[(TOPIC, 0)])
    with pytest.raises(SystemExit) as stopped:
        worker.stop_and_shutdown()
    assert stopped.value.code == EXIT_DEADLINE == 75
    worker.app = SimpleNamespace(left_uncommitted=[])
    worker.stop_and_shutdown()  # everything confirmed: a clean stop


class Decisions(FailurePolicy):
    """The failure policy, recording which kind of failure it was asked to decide."""

    def __init__(self) -> None:
        super().__init__(stop=lambda exc: None)
        self.asked: list[tuple[str, int, str]] = []

    def publish_failed(self, record: SourceRecord, exc: BaseException) -> None:
        self.asked.append(("publish", record.offset, type(exc).__name__))

    def processing_failed(self, record: SourceRecord, exc: BaseException) -> None:
        self.asked.append(("processing", record.offset, type(exc).__name__))


def test_each_kind_of_failure_goes_to_its_own_decision() -> None:
    """A refused output is a publish failure; a record whose vector cannot be computed is a
    processing failure; neither is acknowledged."""
    inputs = records(4, partitions=1)
    ledger = Ledger()

    class BrokenEmbedder:
        model_id = "broken"
        dimensions = 4

        def submit(self, texts: Sequence[str], timing: object = None) -> object:
            raise MemoryError("the model ran out of memory")

    async def scenario(scorer: Scorer, failing: list[Offset]) -> list[tuple[str, int, str]]:
        decisions = Decisions()
        pipeline = StreamScorer(
            scorer,
            FakeLog(inputs),  # type: ignore[arg-type]
            Publisher(ledger, failing=failing),  # type: ignore[arg-type]
            failures=decisions,
        )
        pending = await pipeline.submit(
            inputs[:2], acknowledgements=[ledger.acknowledgement(r) for r in inputs[:2]]
        )
        await asyncio.gather(*pending, return_exceptions=True)
        await pipeline.checkpoint.drain()
        return decisions.asked

    plain = Scorer(load_profiles(None), Thresholds(), PartitionCaches(), None)
    assert run(scenario(plain, [(0, 1)])) == [("publish", 1, "ConnectionError")]
    broken = Scorer(load_profiles(None), Thresholds(), PartitionCaches(), BrokenEmbedder())  # type: ignore[arg-type]
    assert run(scenario(broken, [])) == [
        ("processing", 0, "MemoryError"),
        ("processing", 1, "MemoryError"),
    ]
    assert (0, 1) not in ledger.of("acknowledged")
