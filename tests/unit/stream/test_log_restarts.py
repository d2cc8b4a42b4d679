"""A partition's log that went back (topic recreated, log truncated) or lost records before
they were scored (retention, delete-records), against a fake log: noticed, said in one warning
line, counted, and a log that started over is scored from its new start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import orjson
import pytest
from prometheus_client import REGISTRY

from worker.core.cache import PartitionCaches
from worker.core.records import RoutedRecord, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import load_profiles
from worker.stream.checkpoint import CommitWentBackwards
from worker.stream.processor import StreamScorer

from support.embedders import HashEmbedder
from support.traces import make_trace

TOPIC = "raw"
TP = (TOPIC, 0)


class ChangingLog:
    """One partition's log: it may start over (``recreate``) or lose its first records."""

    def __init__(self, records: list[SourceRecord], committed: int | None = None) -> None:
        self.records = records
        self.committed_offset = committed
        self.first = 0
        self.ends_asked = 0

    def recreate(self, records: list[SourceRecord]) -> None:
        self.records, self.committed_offset, self.first = records, None, 0

    async def committed(self, topic: str, partition: int) -> int | None:
        return self.committed_offset

    async def first_offset(self, topic: str, partition: int) -> int:
        return self.first

    async def log_end(self, topic: str, partition: int, near: int) -> int:
        self.ends_asked += 1
        return 1 + max((r.offset for r in self.records), default=-1)

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        return [r for r in self.records if max(start, self.first) <= r.offset < end]


class Publisher:
    def __init__(self) -> None:
        self.published: list[RoutedRecord] = []

    async def publish(self, routed: Sequence[RoutedRecord]) -> None:
        self.published.extend(routed)


def log_of(count: int, name: str) -> list[SourceRecord]:
    return [
        SourceRecord(
            TOPIC,
            0,
            offset,
            1000 + offset,
            b"k",
            orjson.dumps(make_trace(id=f"kp:trace:{name}-{offset}")),
        )
        for offset in range(count)
    ]


def trace_ids(routed: Sequence[RoutedRecord]) -> list[str]:
    return [orjson.loads(r.source.value or b"")["id"][9:] for r in routed]


def pipeline(log: ChangingLog, publisher: Publisher) -> StreamScorer:
    scorer = Scorer(load_profiles(None), Thresholds(), PartitionCaches(), HashEmbedder())  # type: ignore[arg-type]
    return StreamScorer(scorer, log, publisher)


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def warnings(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.getMessage() == event]


WENT_BACK = (
    "input partition's log went back (topic recreated or log truncated); "
    "scoring it again from the new log"
)
LOST = "records deleted from the input log before they were scored"


def test_a_recreated_log_is_scored_from_its_new_start(caplog: pytest.LogCaptureFixture) -> None:
    """The consumer, kept on the partition, reads the new log from offset 0 while the worker
    expects offset 10: the new records are scored, not taken for redeliveries."""
    log, publisher = ChangingLog(log_of(10, "old"), committed=0), Publisher()
    restarts = counter("kp_log_restarts_total")

    async def scenario() -> StreamScorer:
        stream = pipeline(log, publisher)
        await stream.process(log.records)
        stream.checkpoint.committed({TP: 10})
        log.recreate(log_of(3, "new"))
        await stream.process(log.records)
        stream.checkpoint.committing({TP: 3})  # the new log's commit may go back
        stream.checkpoint.committed({TP: 3})
        with pytest.raises(CommitWentBackwards):
            stream.checkpoint.committing({TP: 2})  # and forwards only from there
        return stream

    with caplog.at_level(logging.WARNING):
        stream = asyncio.run(scenario())
    assert trace_ids(publisher.published)[10:] == ["new-0", "new-1", "new-2"]
    assert stream.scorer.cache_size(TP) == 3, "the cache holds the new log's traces only"
    (line,) = warnings(caplog, WENT_BACK)
    assert (line.topic, line.partition, line.expected, line.log_end) == (TOPIC, 0, 10, 3)  # type: ignore[attr-defined]
    assert counter("kp_log_restarts_total") - restarts == 1
    assert stream.observer.lag.finished_positions() == {TP: 3}


def test_a_partition_reassigned_on_a_recreated_log_starts_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Revoked while its topic was deleted, assigned again once it is back: the rebuild on
    assignment sees the log end below the offset the worker had reached."""
    log, publisher = ChangingLog(log_of(8, "old"), committed=0), Publisher()

    async def scenario() -> None:
        stream = pipeline(log, publisher)
        stream.assigned([TP])
        await stream.process(log.records)
        stream.assigned([])  # the topic is gone
        log.recreate(log_of(2, "new"))
        stream.assigned([TP])
        await stream.checkpoint.drain()  # the rebuild on assignment
        await stream.process(log.records)

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert trace_ids(publisher.published)[8:] == ["new-0", "new-1"]
    (line,) = warnings(caplog, WENT_BACK)
    assert (line.expected, line.log_end) == (8, 2)  # type: ignore[attr-defined]


def test_a_redelivery_is_no_restart_and_in_order_records_ask_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, publisher = ChangingLog(log_of(10, "log"), committed=0), Publisher()

    async def scenario() -> None:
        stream = pipeline(log, publisher)
        await stream.process(log.records[:6])
        await stream.process(log.records[6:])
        assert log.ends_asked == 0, "records in order cost no request"
        await stream.process(log.records[3:])  # as after a rebalance
        for record in log.records[3:]:  # and one at a time, as the consumer hands them over
            await stream.process([record])
        assert log.ends_asked == 1, "once for the whole run of redeliveries"

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert trace_ids(publisher.published) == [f"log-{i}" for i in range(10)]
    assert warnings(caplog, WENT_BACK) == []


def test_the_consumer_sent_back_to_the_log_start_is_believed() -> None:
    """The new log grew past the old offset before its end was asked: the consumer going back
    to the log's start (only ever past its end) tells the restart all the same."""
    log, publisher = ChangingLog(log_of(4, "old"), committed=0), Publisher()

    async def scenario() -> None:
        stream = pipeline(log, publisher)
        await stream.process(log.records)
        log.recreate(log_of(6, "new"))
        stream.partitions.consumer_sent_back(TP, 3)
        await stream.process(log.records)

    asyncio.run(scenario())
    assert trace_ids(publisher.published)[4:] == [f"new-{i}" for i in range(6)]


@pytest.mark.parametrize(
    ("first", "delivered", "lost"),
    [
        (8, 8, 3),  # records 5..7 deleted; the consumer jumps to the log's start
        (7, 9, 2),  # 5..6 deleted; 7..8 read from the log and scored
        (0, 8, 0),  # 5..7 hold no record (transaction markers, aborted records): none lost
    ],
)
def test_records_deleted_before_they_were_scored_are_counted_lost(
    caplog: pytest.LogCaptureFixture, first: int, delivered: int, lost: int
) -> None:
    records = log_of(12, "log")
    if first == 0:
        records = records[:5] + records[8:]
    log, publisher = ChangingLog(records, committed=5), Publisher()
    log.first = first
    before = counter("kp_records_lost_total")

    async def scenario() -> None:
        stream = pipeline(log, publisher)
        await stream.process([r for r in records if r.offset >= delivered])

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    scored = [r.source.offset for r in publisher.published]
    assert scored == [r.offset for r in records if r.offset >= max(5, first)]
    assert counter("kp_records_lost_total") - before == lost
    lines = warnings(caplog, LOST)
    if lost:
        (line,) = lines
        got = (line.topic, line.partition, line.start, line.end, line.records)  # type: ignore[attr-defined]
        assert got == (TOPIC, 0, 5, 5 + lost, lost)
    else:
        assert lines == []
