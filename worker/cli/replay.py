"""`kp-scorer replay`: re-score a range of a topic into other topics, leaving the live worker be.

The range is read by direct assignment (the live group is never joined, nothing is committed),
scored by the same StreamScorer as the live worker, whose first batch per partition rebuilds
the novelty cache from the records before the range start. A replay of the same log with the
same configuration therefore reproduces the live scores exactly; with a changed configuration
the summary shows what would change.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson

from worker.cli import main as cli
from worker.cli import progress, ranges
from worker.core.output import output_topics, prefixed_topics
from worker.core.records import Decision, RoutedRecord
from worker.core.rescoring import DELTA_BINS, delta_bin, delta_rows
from worker.core.scorer import Scorer
from worker.io.kafka import COMMAND_GIVE_UP_SECONDS, PartitionLogReader, create_topics, stop_all
from worker.io.publisher import Publisher
from worker.settings import Settings
from worker.stream.processor import StreamScorer

CHUNK_RECORDS = 64


@dataclass
class ReplaySummary:
    decisions: Counter[str] = field(default_factory=Counter)
    compared: int = 0
    accept_to_reject: int = 0
    reject_to_accept: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * (len(DELTA_BINS) - 1))
    original_found: bool = False

    def delta_histogram(self) -> list[tuple[str, int]]:
        return [(label, count) for label, _, _, count in delta_rows(self.histogram)]


async def original_decisions(
    settings: Settings, reader: PartitionLogReader, topic: str
) -> dict[tuple[int, int], tuple[str, float]]:
    """(partition, offset) -> (decision, score) from the live accepted/rejected topics."""
    found: dict[tuple[int, int], tuple[str, float]] = {}
    for decision, output in output_topics(settings).items():
        if decision is Decision.DEAD_LETTER:
            continue
        for partition in await reader.partitions(output):
            async for chunk in reader.iter_range(output, partition, 0):
                for record in chunk:
                    try:
                        value = orjson.loads(record.value or b"{}")
                        source = value.get("source", {})
                        if source.get("topic") == topic:
                            key = (source["partition"], source["offset"])
                            found.setdefault(key, (decision.value, float(value["score"]["score"])))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        # Not an output this version reads (another producer's record, an
                        # older shape): nothing to compare with, not a reason to stop the replay.
                        continue
    return found


async def _replay(
    settings: Settings,
    scorer: Scorer,
    scope: ranges.TopicRange,
    output_prefix: str,
    on_progress: Callable[[int, int | None], None],
) -> ReplaySummary:
    (topic,) = scope.topics
    topics = prefixed_topics(output_prefix)
    iterate = PartitionLogReader(settings, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
    lookup = PartitionLogReader(settings, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
    publisher = Publisher(settings, topics, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
    summary = ReplaySummary()
    try:
        await iterate.start()
        await lookup.start()
        plan, widest = await scope.plan(iterate)
        await create_topics(settings, list(topics.values()), len(scope.partitions or ()) or widest)
        original = await original_decisions(settings, iterate, topic)
        summary.original_found = bool(original)
        await publisher.start()
        stream = StreamScorer(scorer, lookup, publisher)
        total = scope.total(plan)
        on_progress(0, total)
        end_ms = ranges.epoch_ms(scope.to_time)
        for _, partition, start in plan:
            async for chunk in iterate.iter_range(
                topic, partition, start, scope.to_offset, end_ms, end_may_pass_the_log=True
            ):
                for offset in range(0, len(chunk), CHUNK_RECORDS):
                    routed = await stream.process(chunk[offset : offset + CHUNK_RECORDS])
                    _tally(summary, routed, original)
                    on_progress(len(routed), total)
    finally:
        await stop_all(publisher, lookup, iterate)
    return summary


def _tally(
    summary: ReplaySummary,
    routed: Sequence[RoutedRecord],
    original: dict[tuple[int, int], tuple[str, float]],
) -> None:
    for record in routed:
        summary.decisions[record.decision.value] += 1
        before = original.get((record.source.partition, record.source.offset))
        if before is None or record.breakdown is None:
            continue
        summary.compared += 1
        old_decision, old_score = before
        summary.histogram[delta_bin(record.breakdown.score - old_score)] += 1
        if old_decision == "accepted" and record.decision is Decision.REJECTED:
            summary.accept_to_reject += 1
        elif old_decision == "rejected" and record.decision is Decision.ACCEPTED:
            summary.reject_to_accept += 1


@click.command(
    cls=cli.Command,
    help="re-score a range of a topic into PREFIX.accepted/.rejected/.dead-letter",
)
@click.option("--topic", required=True, help="topic to re-score")
@ranges.range_options("record")
@click.option(
    "--output-prefix",
    type=cli.topic_prefix,
    metavar="PREFIX",
    required=True,
    help="writes PREFIX.accepted etc.",
)
@cli.what_if_options
def replay(
    topic: str,
    output_prefix: str,
    profiles: Path | None,
    threshold: float | None,
    **bounds: Any,
) -> int:
    from worker.core.scorer import build_scorer

    settings = cli.checked_settings(profiles, threshold, quieter=True)
    live = {*output_topics(settings).values(), settings.input_topic, topic}
    if live & set(prefixed_topics(output_prefix).values()):
        cli.fail(
            f"--output-prefix {output_prefix!r} would write into a topic being read or a live topic"
        )
    scorer = build_scorer(settings)
    scope = ranges.TopicRange(topics=[topic], **bounds)
    summary = progress.with_record_progress(
        "replaying",
        settings,
        lambda advance: asyncio.run(_replay(settings, scorer, scope, output_prefix, advance)),
        quiet=not cli.err_console.is_terminal,  # as rescore: no bar written into a log file
    )
    decisions = ", ".join(f"{k}={v}" for k, v in sorted(summary.decisions.items()))
    err = cli.err_console
    err.print(f"replayed {summary.decisions.total()} records into {output_prefix}.*: {decisions}")
    if not summary.original_found:
        err.print("no earlier decisions found in the live output topics to compare")
        return 0
    err.print(
        f"compared with the live outputs: {summary.compared} records, "
        f"{summary.accept_to_reject} flipped accepted -> rejected, "
        f"{summary.reject_to_accept} flipped rejected -> accepted"
    )
    rows = summary.delta_histogram()
    err.print(cli.bar_table("score change (replay - live)", rows, "delta", "records"))
    return 0
