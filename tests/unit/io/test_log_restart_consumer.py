"""The scorer's faust consumer where a partition's log changes. On a log that started over, a
record below the last one read reaches the worker (faust dropped it without a word), and once
the worker says so, faust acknowledges and commits the new log's offsets (it took none below
its last commit)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from intervaltree import IntervalTree

from worker.io.library_overrides import ScorerConsumer

PARTITION = TP("raw", 0)


def consumer(sent_back: list[tuple[tuple[str, int], int]]) -> ScorerConsumer:
    built = object.__new__(ScorerConsumer)
    partitions = SimpleNamespace(consumer_sent_back=lambda tp, read: sent_back.append((tp, read)))
    built.app = SimpleNamespace(
        stream_scorer=SimpleNamespace(partitions=partitions),
        topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
    )
    built._read_offset = defaultdict(lambda: None)
    built._committed_offset = defaultdict(lambda: None)
    built._acked = defaultdict(list)
    built._acked_index = defaultdict(set)
    built._gap = defaultdict(IntervalTree)
    built._unacked_messages = set()
    built._n_acked = 0
    built._waiting_for_ack = None
    return built


@dataclass(eq=False)  # faust keeps its unacknowledged messages in a set
class Message:
    offset: int
    tp: TP = PARTITION
    topic: str = "raw"
    acked: bool = False


def message(offset: int) -> Any:
    return Message(offset)


def test_a_record_below_the_last_read_reaches_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fetched(self: object, timeout: float) -> AsyncIterator[tuple[TP, Any]]:
        for offset in (9, 10, 0, 1):  # the client went back to the log's start after 10
            yield PARTITION, message(offset)
            self._read_offset[PARTITION] = offset  # type: ignore[attr-defined]  # as faust does

    monkeypatch.setattr(faust_aiokafka.Consumer, "getmany", fetched)
    sent_back: list[tuple[tuple[str, int], int]] = []
    scorer_consumer = consumer(sent_back)
    scorer_consumer._read_offset[PARTITION] = 9  # faust's seek to the committed offset
    scorer_consumer._committed_offset[PARTITION] = 9

    async def drain() -> list[int]:
        return [m.offset async for _, m in scorer_consumer.getmany(1.0)]

    assert asyncio.run(drain()) == [9, 10, 0, 1]
    assert sent_back == [(("raw", 0), 10)], "the worker is told, once"
    assert scorer_consumer._committed_offset[PARTITION] is None, "the old log's commit is gone"


def test_forgotten_offsets_let_the_new_log_be_acknowledged_and_committed() -> None:
    scorer_consumer = consumer([])
    scorer_consumer._committed_offset[PARTITION] = 10
    scorer_consumer._acked[PARTITION] = [12]  # the old log's, not yet committed
    scorer_consumer._acked_index[PARTITION] = {12}
    assert not scorer_consumer.ack(message(0)), "faust takes no offset below its last commit"

    scorer_consumer.forget_offsets(("raw", 0))
    assert all(scorer_consumer.ack(message(offset)) for offset in (0, 1, 2))
    assert scorer_consumer._new_offset(PARTITION) == 3
    assert scorer_consumer._should_commit(PARTITION, 3)
