"""At least once: an input offset is committed only after the broker acknowledged the
record's output. The whole protocol is here, in numbered steps.

1. **Publish.** A record's routed output goes to the broker (:meth:`Checkpoint.publish`). A
   failed publish raises before step 2: the record is never acknowledged.
2. **Acknowledge.** Once the broker acknowledged the output, the record's offset is handed to
   the consumer. A redelivered record (a rebalance handed it over again while its first
   delivery waits on the broker) is acknowledged only once every record of its partition
   still in flight here is published or dropped (:meth:`Checkpoint.acknowledge_redelivered`).
   A record dropped (its partition revoked), failed or abandoned is never acknowledged.
3. **Commit.** The consumer commits each partition up to its first unacknowledged offset;
   each commit passes :meth:`Checkpoint.committing` first, which refuses one that would take
   a partition's committed offset below its last commit that landed
   (:meth:`Checkpoint.committed`; :class:`CommitWentBackwards`), except for a
   partition whose log started over (:meth:`Checkpoint.log_restarted`): its new log's offsets
   are committed from its start, once what was in flight of the old log has settled.
4. **Drain on stop.** :meth:`Checkpoint.close` takes no more records and gives those in flight
   a bounded time (:func:`drain_seconds`) to be published and acknowledged, so that the
   consumer's last commit covers them; whatever is still in flight then is abandoned
   unacknowledged and delivered again to the partition's next owner.
5. **Confirm.** After the consumer's last commit, :func:`unconfirmed_commits` asks the broker
   whether the group's committed offsets cover every published record; where they do not (or
   it cannot tell), the worker exits 75 (``EXIT_DEADLINE``): the redelivery is expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from worker.core.records import RoutedRecord

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# Step 4: how long records already in flight at a stop may take to be published (at most this
# share of the shutdown deadline) before they are abandoned to the next worker.
DRAIN_SECONDS = 5.0
DRAIN_SHARE_OF_DEADLINE = 0.25
# Step 5: how long to ask the broker whether every published record's offset is committed.
CONFIRM_SECONDS = 3.0
CONFIRM_POLL_SECONDS = 0.1
Acknowledge = Callable[[], Awaitable[object]]


class RoutedPublisher(Protocol):
    async def publish(self, routed: Sequence[RoutedRecord]) -> None: ...


class CommitWentBackwards(RuntimeError):
    """A commit below the partition's last one: redelivery of records already committed."""


class Checkpoint:
    """Owns the at-least-once steps for the records of every owned partition."""

    def __init__(self, publisher: RoutedPublisher) -> None:
        self.publisher = publisher
        self.closed = False  # step 4 began: no more records are taken
        self._in_flight: dict[TopicPartition, set[asyncio.Future[object]]] = defaultdict(set)
        self._committed: dict[TopicPartition, int] = {}
        self._tasks: set[asyncio.Future[None]] = set()

    # -- in flight ---------------------------------------------------------------------------
    def entered(self, tp: TopicPartition, published: asyncio.Future[Any]) -> None:
        """A record of ``tp`` is in flight until ``published`` is done (published or not)."""
        self._in_flight[tp].add(published)

    def left(self, tp: TopicPartition, published: asyncio.Future[Any]) -> None:
        self._in_flight[tp].discard(published)

    def in_flight(self) -> int:
        return sum(len(records) for records in self._in_flight.values())

    @property
    def idle(self) -> bool:
        """Nothing of the pipeline is running (every record settled, every task ended)."""
        return not self._tasks

    def spawn(self, work: Awaitable[None]) -> asyncio.Future[None]:
        """Run ``work`` as part of the pipeline: step 4 waits for it, or cancels it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- steps 1 and 2 -----------------------------------------------------------------------
    async def publish(
        self, routed: Sequence[RoutedRecord], acknowledge: Acknowledge | None
    ) -> float:
        """Publish a record's output, then acknowledge its offset; returns the monotonic time
        the broker acknowledged the output. A failed publish raises, unacknowledged."""
        await self.publisher.publish(routed)
        acked = time.monotonic()
        if acknowledge is not None:
            await acknowledge()
        return acked

    def acknowledge_redelivered(self, tp: TopicPartition, acknowledge: Acknowledge) -> None:
        """A redelivered record's offset may be committed once the first delivery is published."""
        self.spawn(self._acknowledge_after_in_flight(tp, acknowledge))

    async def _acknowledge_after_in_flight(
        self, tp: TopicPartition, acknowledge: Acknowledge
    ) -> None:
        waiting = list(self._in_flight[tp])
        await asyncio.gather(*waiting, return_exceptions=True)
        await acknowledge()

    # -- step 3 ------------------------------------------------------------------------------
    def committing(self, offsets: Mapping[TopicPartition, int]) -> None:
        """The consumer is about to commit ``offsets``: none may go below the last commit."""
        for tp, offset in offsets.items():
            last = self._committed.get((tp[0], tp[1]))
            if last is not None and offset < last:
                raise CommitWentBackwards(
                    f"commit of offset {offset} for {tp[0]}[{tp[1]}] below its last commit "
                    f"{last}: records already committed would be delivered again"
                )

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """The broker took ``offsets``. Only these count: a commit the group refused (it was
        rebalancing) leaves the partition's offset where it was, and the records after it are
        delivered again and committed anew, below the refused offset."""
        self._committed.update({(tp[0], tp[1]): offset for tp, offset in offsets.items()})

    async def log_restarted(self, tp: TopicPartition) -> None:
        """tp's log started over (topic recreated, log truncated): once every record of the old
        log still in flight here is published or dropped, the commits of the new log may go
        below the old one's (the consumer's acknowledgements started afresh when it went back)."""
        await asyncio.gather(*list(self._in_flight[tp]), return_exceptions=True)
        self._committed.pop(tp, None)

    def assigned(self, partitions: Sequence[TopicPartition]) -> None:
        """Partitions no longer held start afresh: their next owner commits them."""
        held = set(partitions)
        self._committed = {tp: offset for tp, offset in self._committed.items() if tp in held}

    # -- step 4 ------------------------------------------------------------------------------
    async def drain(self) -> None:
        """Wait for every record in flight to be published and acknowledged (or dropped)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self, timeout: float) -> None:
        """Take no more records; let those in flight finish within ``timeout`` seconds (the
        rest is abandoned by :meth:`stop`)."""
        self.closed = True
        try:
            async with asyncio.timeout(timeout):
                await self.drain()
        except TimeoutError:
            log.warning(
                "records still in the pipeline at the stop; they will be redelivered",
                extra={"records": self.in_flight(), "waited_s": timeout},
            )

    async def stop(self) -> None:
        """Abandon what is in flight: none of it was acknowledged, so it is redelivered."""
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)


class Acknowledgements:
    """Step 3's offsets, per partition: up to its first delivered record not yet acknowledged.
    Offsets the consumer never delivers (transaction markers, compacted records) count with the
    delivered record after them; a record delivered before its partition was assigned again
    (or before its log started over) acknowledges nothing of the new delivery."""

    def __init__(self) -> None:
        self._waiting: dict[TopicPartition, dict[int, bool]] = {}  # offset -> acknowledged
        self._reached: dict[TopicPartition, int] = {}
        self._sent: dict[TopicPartition, int] = {}
        self._generation: dict[TopicPartition, int] = defaultdict(int)

    def delivered(self, tp: TopicPartition, offset: int) -> Acknowledge:
        """The consumer delivered ``offset`` of ``tp`` (in offset order): its acknowledgement."""
        self._waiting.setdefault(tp, {})[offset] = False
        generation = self._generation[tp]

        async def acknowledge() -> None:
            self._acknowledged(tp, generation, offset)

        return acknowledge

    def _acknowledged(self, tp: TopicPartition, generation: int, offset: int) -> None:
        waiting = self._waiting.get(tp)
        if self._generation[tp] != generation or not waiting or offset not in waiting:
            return
        waiting[offset] = True
        while waiting and waiting[first := next(iter(waiting))]:
            del waiting[first]
            self._reached[tp] = first + 1

    def restart(self, partitions: Sequence[TopicPartition]) -> None:
        """Assigned again, revoked, or its log started over: tracked afresh from the next
        delivery."""
        for tp in partitions:
            self._generation[tp] += 1
            for offsets in (self._waiting, self._reached, self._sent):
                offsets.pop(tp, None)

    def to_commit(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The offsets of ``partitions`` acknowledged since their last commit that landed."""
        return {
            tp: self._reached[tp]
            for tp in partitions
            if tp in self._reached and self._reached[tp] != self._sent.get(tp)
        }

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._sent.update(offsets)


def drain_seconds(shutdown_timeout_seconds: float) -> float:
    """Step 4's bound for a worker with this shutdown deadline (KP_SHUTDOWN_TIMEOUT_SECONDS)."""
    return min(DRAIN_SECONDS, shutdown_timeout_seconds * DRAIN_SHARE_OF_DEADLINE)


# -- step 5 ----------------------------------------------------------------------------------
async def unconfirmed_commits(
    finished: Mapping[TopicPartition, int],
    committed: Callable[[str, int], Awaitable[int | None]],
    timeout: float,
) -> list[TopicPartition]:
    """Partitions whose published records the group's committed offset does not cover yet,
    or could not be confirmed to cover within ``timeout`` seconds (broker unreachable).
    Asked again until then: an offset committed in a transaction is read back only once the
    broker has written the transaction's markers, a moment after its commit returned (a clean
    stop with exactly-once exited 75 in 2 of 3 chaos runs without this).

    ``finished`` maps each partition to the offset after its last published record.
    """

    async def check(tp: TopicPartition, position: int) -> bool:
        offset = await committed(*tp)
        return offset is not None and offset >= position

    left = sorted(finished)
    # Unreachable, timed out, not coordinator: what is unconfirmed then is uncommitted.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            while left:
                covered = await asyncio.gather(*(check(tp, finished[tp]) for tp in left))
                left = [tp for tp, ok in zip(left, covered, strict=True) if not ok]
                if left:
                    await asyncio.sleep(CONFIRM_POLL_SECONDS)
    return left
