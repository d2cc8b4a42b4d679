"""Step 3's offsets (``Acknowledgements`` in worker/stream/checkpoint.py): each partition is
committed up to its first delivered record not yet acknowledged, offsets never delivered hold
nothing back, an acknowledgement from before a restart counts for nothing, and what was
committed is not offered again."""

from __future__ import annotations

import asyncio

from worker.stream.checkpoint import Acknowledge, Acknowledgements

TP = ("raw", 0)
OTHER = ("raw", 1)


def acknowledge(*acks: Acknowledge) -> None:
    async def run() -> None:
        for ack in acks:
            await ack()

    asyncio.run(run())


def test_a_partition_is_committed_up_to_its_first_unacknowledged_record() -> None:
    acks = Acknowledgements()
    first, second, third = (acks.delivered(TP, offset) for offset in (0, 1, 2))
    assert acks.to_commit([TP]) == {}, "nothing acknowledged yet"
    acknowledge(third, second)
    assert acks.to_commit([TP]) == {}, "offset 0 still waits on the broker"
    acknowledge(first)
    assert acks.to_commit([TP]) == {TP: 3}


def test_offsets_never_delivered_do_not_hold_the_commit_back() -> None:
    """Offsets 1 and 4 are a transaction's markers (or records compacted away, or aborted):
    the consumer never delivers them, and they count with the delivered record after them."""
    acks = Acknowledgements()
    at_0, at_2, at_3, at_5 = (acks.delivered(TP, offset) for offset in (0, 2, 3, 5))
    acknowledge(at_0, at_3, at_5)
    assert acks.to_commit([TP]) == {TP: 1}
    acknowledge(at_2)
    assert acks.to_commit([TP]) == {TP: 6}


def test_acknowledgements_from_before_a_restart_are_ignored() -> None:
    """Revoked, assigned again or its log started over: a record delivered before acknowledges
    nothing of the new delivery, even at the same offset; other partitions keep theirs."""
    acks = Acknowledgements()
    old = [acks.delivered(TP, offset) for offset in (0, 1)]
    other = acks.delivered(OTHER, 7)
    acks.restart([TP])
    acknowledge(*old)
    assert acks.to_commit([TP]) == {}
    again, later = acks.delivered(TP, 1), acks.delivered(TP, 2)
    acknowledge(old[1])
    assert acks.to_commit([TP]) == {}, "the old delivery of the same offset is not this one"
    acknowledge(again, later, other)
    assert acks.to_commit([TP, OTHER]) == {TP: 3, OTHER: 8}, "offset 0 waits no more"


def test_what_was_committed_is_not_offered_again() -> None:
    acks = Acknowledgements()
    acknowledge(*(acks.delivered(TP, offset) for offset in (0, 1, 2)))
    acknowledge(acks.delivered(OTHER, 0))
    assert acks.to_commit([TP]) == {TP: 3}, "only the partitions asked for"
    # Not recorded as committed (the group refused it): offered again.
    assert acks.to_commit([TP, OTHER]) == {TP: 3, OTHER: 1}
    acks.committed({TP: 3})
    assert acks.to_commit([TP, OTHER]) == {OTHER: 1}
    acknowledge(acks.delivered(TP, 3))
    assert acks.to_commit([TP]) == {TP: 4}
