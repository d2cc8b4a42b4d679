"""Offline scoring of a JSONL file: the same Scorer as the stream worker, lines for records.

Each line is one record. Without ``partition_by`` every line shares one cache (one
partition); with it, lines whose value at that dotted path (e.g. ``metadata.agent_id``) is
equal share a cache, as records with one key share a Kafka partition. Event time for the
optional TTL is ``metadata.created_at`` (a file has no record timestamps); the line's
0-based index is its offset. ``worker.core.records.LineRecords`` reads the lines, as it reads
the Python API's traces.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from worker.cli import main as cli
from worker.cli import progress
from worker.core.records import Decision, LineRecords, RoutedRecord
from worker.core.scorer import Scorer

CHUNK_LINES = 32


@dataclass
class OfflineSummary:
    counts: dict[str, int] = field(default_factory=lambda: {d.value: 0 for d in Decision})
    scores: list[float] = field(default_factory=list)

    def add(self, routed: RoutedRecord) -> None:
        self.counts[routed.decision.value] += 1
        if routed.breakdown is not None:
            self.scores.append(routed.breakdown.score)

    @property
    def lines(self) -> int:
        return sum(self.counts.values())

    @property
    def dead_letters(self) -> int:
        return self.counts[Decision.DEAD_LETTER.value]

    def describe(self) -> str:
        """The closing line on stderr. A file with no scored line (empty, or only errors) has
        no mean score: it says so rather than print ``nan``."""
        decisions = ", ".join(f"{k}={v}" for k, v in self.counts.items())
        scores = self.scores
        mean = f"mean score {sum(scores) / len(scores):.4f}" if scores else "no scored lines"
        return f"scored {self.lines} lines: {decisions}; {mean}"


def output_line(routed: RoutedRecord) -> bytes:
    if routed.error is not None:
        return orjson.dumps(
            {
                "line": routed.source.offset + 1,
                "error": {"kind": routed.error.kind, "reason": routed.error.reason},
            }
        )
    assert routed.value is not None
    return routed.value


def score_lines(
    scorer: Scorer,
    lines: Iterable[bytes],
    out: TextIO,
    records: LineRecords,
    on_progress: Any = None,
) -> OfflineSummary:
    """Score every line and write one JSON line per input line, in input order."""
    summary = OfflineSummary()
    numbered = enumerate(lines)
    while chunk := [(index, line.rstrip(b"\r\n")) for index, line in islice(numbered, CHUNK_LINES)]:
        batch = [records.record(index, line) for index, line in chunk]
        for routed in scorer.score_batch(batch).routed:
            out.write(output_line(routed).decode() + "\n")
            summary.add(routed)
        if on_progress is not None:
            on_progress(len(chunk), sum(len(line) + 1 for _, line in chunk))
    out.flush()
    return summary


@click.command(cls=cli.Command, help="score a JSONL file of traces to stdout")
@click.argument("file", default="-", cls=cli.Described, help="JSONL file, or - for stdin")
@click.option("--no-embedder", is_flag=True, help="novelty 0.5 (no model)")
@click.option(
    "--partition-by",
    metavar="PATH",
    help="dotted field (e.g. metadata.agent_id): lines with equal values share a cache",
)
@cli.what_if_options
@cli.quiet_option
@click.option(
    "--fail-on-error",
    is_flag=True,
    help=f"exit {cli.EXIT_DEAD_LETTERS} if any line could not be scored (every line is "
    "still written); without it such lines leave the exit code 0",
)
def score(
    file: str,
    no_embedder: bool,
    partition_by: str | None,
    profiles: Path | None,
    threshold: float | None,
    quiet: bool,
    fail_on_error: bool,
) -> int:
    from worker.core.scorer import build_scorer

    settings = cli.checked_settings(profiles, threshold)
    # JSON lines are never framed: KP_INPUT_FRAMING is the input topic's, not a file's.
    offline = settings.model_copy(update={"input_framing": "json"})
    scorer = build_scorer(offline, use_embedder=not no_embedder)
    if scorer.embedder is None and not no_embedder:
        cli.say(f"embedder unavailable ({scorer.embedder_reason}); novelty 0.5", "yellow")
    records = LineRecords(cli.name_of(file), partition_by)
    summary = progress.read_lines_with_progress(
        "scoring",
        file,
        quiet,
        lambda stream, advance: score_lines(scorer, stream, sys.stdout, records, advance),
    )
    cli.err_console.print(summary.describe())
    if partition_by is not None and summary.lines and not records.lines_with_field:
        cli.say(
            f"kp-scorer: --partition-by {partition_by}: no line has this field, so every "
            "line shared one novelty cache",
            "yellow",
        )
    return cli.EXIT_DEAD_LETTERS if fail_on_error and summary.dead_letters else 0
