"""`kp-scorer rescore`: what recorded outputs would score and decide under other settings.

Reads scored outputs (a JSONL file such as `kp-scorer score` writes, or ranges of the
accepted/rejected topics read by direct assignment: no group, no commits) and re-scores each
with :class:`worker.core.rescoring.Rescorer`, using the novelty recorded in it. No model is
loaded, so this runs at the speed of JSON decoding rather than of embedding (`replay`).

File mode writes one line per input line, in order: the re-scored output; a `score` error
line unchanged (the trace was never scored, and scoring it again writes that same line); or
``{"line": N, "unrescorable": {"reason", "detail", "scorer_version"}}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

import orjson
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from worker.cli import main as cli
from worker.cli import progress, ranges
from worker.core.output import ERROR_KIND_HEADER
from worker.core.records import Decision
from worker.core.rescoring import (
    NotRescored,
    Rescored,
    Rescorer,
    RescoreSummary,
    decoded,
    is_error_line,
    rescored_record,
)

if TYPE_CHECKING:
    from worker.settings import Settings

BLOCK_BYTES = 1 << 20  # input read (and output written) at a time: whole lines, ~1 MiB


def _output_line(
    summary: RescoreSummary, result: Rescored | NotRescored, where: str, at: dict[str, Any]
) -> bytes:
    """Count ``result`` and give its line: the re-scored output, or why not (located by ``at``)."""
    summary.add(result, where)
    if isinstance(result, Rescored):
        return result.value
    return orjson.dumps({**at, "unrescorable": result.to_json()})


def rescore_stream(
    rescorer: Rescorer,
    stream: IO[bytes],
    out: IO[bytes] | None,
    on_progress: Callable[[int, int], None] | None = None,
    block_bytes: int = BLOCK_BYTES,
    summary: RescoreSummary | None = None,
) -> RescoreSummary:
    """Re-score every line of ``stream``; write one line per input line, in order, to ``out``.

    Works a block of lines at a time (one read, one write each): per line there is only the
    JSON and the arithmetic. ``summary`` (a fresh one by default) counts the results.
    """
    summary = RescoreSummary() if summary is None else summary
    rescore = rescorer.rescore
    index = 0
    while lines := stream.readlines(block_bytes):
        parts: list[bytes] = []
        for raw in lines:
            index += 1
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            document = decoded(line)
            if is_error_line(document):
                error = document["error"]
                kind = error.get("kind") if type(error) is dict else None
                summary.add_dead_letter(kind if type(kind) is str else None)
                parts.append(line)
                continue
            result = document if type(document) is NotRescored else rescore(document)
            parts.append(_output_line(summary, result, f"line {index}", {"line": index}))
        if out is not None:
            parts.append(b"")
            out.write(b"\n".join(parts))
        if on_progress is not None:
            on_progress(len(lines), sum(map(len, lines)))
    if out is not None:
        out.flush()
    return summary


async def rescore_topics(
    settings: Settings,
    rescorer: Rescorer,
    scope: ranges.TopicRange,
    output_prefix: str | None,
    out: IO[bytes] | None,
    on_progress: Callable[[int, int | None], None],
    summary: RescoreSummary,
) -> None:
    """Re-score ranges of the output topics; optionally publish to ``PREFIX.*`` and/or write
    JSONL. Unrescorable records are counted and written to ``out``, never published; dead
    letters (records with a ``kp-error-kind`` header, as in the dead-letter topic) are
    counted by kind, and neither written nor published."""
    from worker.core.output import output_topics, prefixed_topics
    from worker.io.kafka import (
        COMMAND_GIVE_UP_SECONDS,
        PartitionLogReader,
        create_topics,
        stop_all,
    )
    from worker.io.publisher import Publisher

    reader = PartitionLogReader(settings, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
    publisher: Publisher | None = None
    try:
        await reader.start()
        plan, widest = await scope.plan(reader)
        if output_prefix is not None:
            topics = prefixed_topics(output_prefix)
            live = {*output_topics(settings).values(), settings.input_topic, *scope.topics}
            if live & set(topics.values()):
                raise ValueError(
                    f"--output-prefix {output_prefix!r} would write into a topic being read or "
                    "a live topic"
                )
            await create_topics(settings, list(topics.values()), widest)
            publisher = Publisher(settings, topics, give_up_after_seconds=COMMAND_GIVE_UP_SECONDS)
            await publisher.start()
        total = scope.total(plan)
        on_progress(0, total)
        from_ms, end_ms = ranges.epoch_ms(scope.from_time), ranges.epoch_ms(scope.to_time)
        for topic, partition, start in plan:
            async for chunk in reader.iter_range(
                topic, partition, start, scope.to_offset, end_ms, end_may_pass_the_log=True
            ):
                routed = []
                lines = []
                for record in chunk:
                    if from_ms is not None and record.timestamp_ms < from_ms:
                        continue  # before the range: a broker may seek by time only roughly
                    kind = next(
                        (v or b"" for k, v in record.headers if k == ERROR_KIND_HEADER), None
                    )
                    if kind is not None:  # a dead letter
                        summary.add_dead_letter(kind.decode("utf-8", "replace"))
                        continue
                    result = rescorer.rescore_value(record.value)
                    if isinstance(result, Rescored):
                        routed.append(rescored_record(record, result))
                    at = {"topic": topic, "partition": partition, "offset": record.offset}
                    where = f"{topic}[{partition}]@{record.offset}"
                    lines.append(_output_line(summary, result, where, {"record": at}))
                if publisher is not None and routed:
                    await publisher.publish(routed)
                if out is not None and lines:  # none: dead letters, or before the range
                    with _writing_output():
                        out.write(b"\n".join(lines) + b"\n")
                on_progress(len(chunk), total)
        if out is not None:
            with _writing_output():
                out.flush()
    finally:
        await stop_all(publisher, reader)


@contextlib.contextmanager
def _writing_output() -> Iterator[None]:
    """Around a write or flush of the --output file: its failure (a full disk) is the file's,
    where an OSError would be read as Kafka's, "Kafka unreachable"."""
    try:
        yield
    except OSError as exc:
        raise progress.OutputUnwritableError(
            f"cannot write the output: {exc.strerror or exc}"
        ) from exc


# --- summary --------------------------------------------------------------------------------

MAX_DOMAIN_ROWS = 25


def print_summary(console: Console, summary: RescoreSummary, source: str) -> None:
    """The human summary: counts, decisions before/after, flips per domain, score changes."""
    unrescorable = sum(summary.unrescorable.values())
    # Domains, paths and reasons are printed as written, never read as console markup: a
    # task_domain such as "[/]" would otherwise stop the command, or be restyled and vanish.
    console.print(
        f"rescored {summary.rescored} of {summary.records} records from {source}: "
        f"{summary.accepted_to_rejected} flipped accepted -> rejected, "
        f"{summary.rejected_to_accepted} flipped rejected -> accepted"
        + (f"; {summary.dead_letters} dead letters passed through" if summary.dead_letters else ""),
        markup=False,
    )
    counts = (Column(column, justify="right") for column in ("before", "after", "change"))
    decisions = Table("", *counts, title="decisions")
    for decision in (Decision.ACCEPTED, Decision.REJECTED):
        before, after = summary.before[decision.value], summary.after[decision.value]
        decisions.add_row(decision.value, str(before), str(after), f"{after - before:+d}")
    console.print(decisions)

    if summary.domains:
        tallies = ("records", "acc. before", "acc. after", "acc -> rej", "rej -> acc")
        counts = (Column(column, justify="right") for column in tallies)
        domains = Table(Column("domain", no_wrap=True), *counts, title="by domain (task_domain)")
        ranked = sorted(
            summary.domains.items(),
            key=lambda item: (
                -(item[1].accepted_to_rejected + item[1].rejected_to_accepted),
                -item[1].records,
                item[0],
            ),
        )
        for name, tally in ranked[:MAX_DOMAIN_ROWS]:
            domains.add_row(Text(name), *map(str, vars(tally).values()))  # the columns, in order
        if len(ranked) > MAX_DOMAIN_ROWS:
            domains.caption = f"{len(ranked) - MAX_DOMAIN_ROWS} more domains in --json"
        console.print(domains)

        rows = [(label, count) for label, _, _, count in summary.delta_histogram()]
        deltas = cli.bar_table("score change (rescore - recorded)", rows, "delta", "records")
        deltas.caption = f"{summary.identical} of {summary.rescored} scores identical"
        console.print(deltas)

    if unrescorable:
        records = Column("records", justify="right")
        table = Table(
            "reason", records, "first example", title=f"not rescored: {unrescorable} records"
        )
        for reason, count in sorted(summary.unrescorable.items()):
            example = next((e for e in summary.examples if e["reason"] == reason), None)
            text = f"{example['at']}: {example['detail']}" if example else ""
            table.add_row(reason, str(count), Text(text))
        console.print(table)
