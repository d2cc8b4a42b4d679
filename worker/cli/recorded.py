"""``kp-scorer rescore`` and ``kp-scorer report``: what recorded outputs (a file that `score`
wrote, or ranges of the output topics) become under other profiles and thresholds, from
their recorded novelty (no model)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console

from worker.cli import main as cli
from worker.cli import progress, ranges
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.core.rescoring import Rescorer, RescoreSummary


@dataclass
class Recorded:
    """What a command reads: FILE (or stdin), or ranges of topics (``--from-topics``)."""

    file: str | None
    from_topics: bool
    topics: tuple[str, ...]
    scope: dict[str, Any]  # the range flags
    output_prefix: str | None = None

    def start(
        self, what_if: dict[str, Any], logs: str, need_file: bool = False
    ) -> tuple[Settings, Rescorer]:
        """The settings and rescorer of a run; the command ends (exit 2) when FILE and
        --from-topics, or the flags of a topic range without --from-topics, are given together
        (or, ``need_file``, neither: stdin is no default)."""
        from worker.core.rescoring import Rescorer

        given = {"topic": self.topics, **self.scope, "output_prefix": self.output_prefix}
        used = [f"--{name.replace('_', '-')}" for name, v in given.items() if v not in (None, ())]
        if self.from_topics and self.file is not None:
            cli.fail("give a FILE or --from-topics, not both")
        if used and not self.from_topics:
            cli.fail(f"{', '.join(used)} need --from-topics")
        if need_file and self.file is None and not self.from_topics:
            cli.fail("give a FILE of scored outputs or --from-topics")
        settings = cli.checked_settings(what_if["profiles"], what_if["threshold"], logs, True)
        return settings, Rescorer.of(settings, domain_thresholds=dict(what_if["domain_threshold"]))

    def read(
        self,
        settings: Settings,
        rescorer: Rescorer,
        out: IO[bytes] | None,
        quiet: bool,
        summary: RescoreSummary,
        default_topics: Sequence[str] | None = None,
    ) -> str:
        """Into ``summary``, in file mode: the JSONL of scored outputs (or stdin), the same
        lines re-scored to ``out``; in topic mode: ranges of the topics (default: the
        accepted/rejected topics, or ``default_topics``), read without a group. Gives the name
        of what was read."""
        from worker.cli.rescore import rescore_stream, rescore_topics

        quiet = quiet or not cli.err_console.is_terminal
        if not self.from_topics:
            progress.read_lines_with_progress(
                "rescoring",
                self.file,
                quiet,
                lambda stream, advance: rescore_stream(
                    rescorer, stream, out, advance, summary=summary
                ),
            )
            return cli.name_of(self.file)
        topics = self.topics or default_topics or (settings.accepted_topic, settings.rejected_topic)
        scope = ranges.TopicRange(topics=list(topics), **self.scope)
        prefix = self.output_prefix
        progress.with_record_progress(
            "rescoring",
            settings,
            lambda advance: asyncio.run(
                rescore_topics(settings, rescorer, scope, prefix, out, advance, summary)
            ),
            quiet=quiet,
        )
        return ", ".join(topics)


def refuse_writing_over(file: str | None, output: str | None) -> None:
    """End the command (exit 2) when ``output`` is the FILE it reads: opening it for writing
    would empty it before a line is read, and the recorded outputs would be lost."""
    if file in (None, "-") or output in (None, "-"):
        return
    with contextlib.suppress(OSError):  # either missing: not the same file
        if Path(file).samefile(output):
            cli.fail(f"--output {output} is the FILE being read; write to another path")


def _closed_after(stream: IO[bytes]) -> Callable[..., bool]:
    """An exit callback that closes the output as its context would (stdout stays open).
    After a failure (a full disk, said already) closing fails again, flushing what is left:
    that is no second error."""

    def close(failure: type[BaseException] | None, *_: Any) -> bool:
        try:
            stream.__exit__(None, None, None)
        except OSError:
            if failure is None:
                raise
        return False

    return close


def recorded_outputs(topics: str, default_topics: str) -> Callable[[cli.F], cli.F]:
    """What `rescore` and `report` read, handed to the command as one :class:`Recorded`: a
    file of scored outputs, or a range of topics. The range is of the topics read (offsets and
    partitions of each; times are when the outputs were published, i.e. scored), as
    `replay`'s is of the topic it reads."""

    def gather(command: cli.F) -> cli.F:
        @functools.wraps(command)
        def gathered(file: str | None, from_topics: bool, topics: tuple[str, ...], **flags: Any):
            scope = {name: flags.pop(name) for name in ranges.RANGE_FLAGS}
            prefix = flags.pop("output_prefix", None)
            return command(Recorded(file, from_topics, topics, scope, prefix), **flags)

        return gathered  # type: ignore[return-value]

    return cli.options(
        click.argument(
            "file",
            required=False,
            cls=cli.Described,
            help="JSONL of scored outputs (as `score` writes), or - for stdin",
        ),
        click.option("--from-topics", is_flag=True, help=f"read {topics} instead of a file"),
        click.option(
            "--topic",
            "topics",
            multiple=True,
            help=f"with --from-topics: a topic to read (repeatable; default: {default_topics})",
        ),
        ranges.range_options("output"),
        gather,
    )


@click.command(
    cls=cli.Command,
    help="re-score recorded outputs with other profiles/thresholds (recorded novelty, no model)",
)
@recorded_outputs("the accepted and rejected topics", "KP_ACCEPTED_TOPIC and KP_REJECTED_TOPIC")
@click.option(
    "--output-prefix",
    type=cli.topic_prefix,
    metavar="PREFIX",
    help="with --from-topics: publish to PREFIX.accepted/.rejected",
)
@click.option(
    "--output",
    metavar="PATH",
    help="write the re-scored JSONL here (- for stdout; the default for a FILE)",
)
@cli.what_if_options
@cli.domain_threshold_option
@cli.json_option("summary as JSON, not tables")
@cli.quiet_option
def rescore(
    recorded: Recorded, output: str | None, as_json: bool, quiet: bool, **what_if: Any
) -> int:
    """Re-score recorded outputs with other settings, from their recorded novelty (no model)."""
    from worker.cli.rescore import print_summary
    from worker.core.rescoring import RAW_TRACE, RescoreSummary

    settings, rescorer = recorded.start(what_if, "human")
    output = output if output is not None else (None if recorded.from_topics else "-")
    refuse_writing_over(recorded.file, output)
    with contextlib.ExitStack() as opened:
        out_stream = None
        if output is not None:  # "-": stdout, which closing leaves open
            try:
                out_stream = click.open_file(output, "wb")
            except OSError as exc:
                cli.fail(f"cannot write {output}: {exc}")
            opened.push(_closed_after(out_stream))
        summary = RescoreSummary()
        source = recorded.read(settings, rescorer, out_stream, quiet, summary)
    # The summary goes to stdout unless the re-scored records do.
    summary_console = cli.err_console if output == "-" else Console()
    if as_json:
        report = {
            "source": source,
            "settings": {
                "profiles": None if settings.profiles_file is None else str(settings.profiles_file),
                "threshold": rescorer.threshold,
                "domain_thresholds": dict(rescorer.domain_thresholds),
            },
            **summary.to_json(),
        }
        cli.print_json(report, summary_console.file)
    else:
        print_summary(summary_console, summary, source)
    if any(example["detail"] == RAW_TRACE for example in summary.examples):
        cli.say(
            "kp-scorer: rescore re-scores outputs that `score` or the worker wrote; for raw "
            "traces use `kp-scorer score FILE`",
            "yellow",
        )
    return 0


@click.command(
    cls=cli.Command,
    help="an HTML page of score distributions and acceptance by threshold, from recorded "
    "outputs (recorded novelty, no model)",
)
@recorded_outputs(
    "the accepted, rejected and dead-letter topics",
    "KP_ACCEPTED_TOPIC, KP_REJECTED_TOPIC and KP_DEAD_LETTER_TOPIC",
)
@click.option(
    "--output",
    "-o",
    metavar="PATH",
    help="the HTML page (default report.html; with --json, only when given)",
)
@cli.what_if_options
@cli.domain_threshold_option
@cli.json_option("the numbers as JSON on stdout")
@cli.quiet_option
def report(
    recorded: Recorded, output: str | None, as_json: bool, quiet: bool, **what_if: Any
) -> int:
    """The score report of recorded outputs: an HTML page, or its numbers as JSON."""
    from worker.cli.report import PlottingUnavailableError, figure_class, render_html
    from worker.core.score_report import ScoreReport

    settings, rescorer = recorded.start(what_if, "json", need_file=True)
    output = output if output is not None else (None if as_json else "report.html")
    refuse_writing_over(recorded.file, output)
    if output is not None:
        try:  # a missing extra fails at once, before anything is read
            figure_class()
        except PlottingUnavailableError as exc:
            cli.fail(str(exc))
    scores = ScoreReport()
    every = (settings.accepted_topic, settings.rejected_topic, settings.dead_letter_topic)
    source = recorded.read(settings, rescorer, None, quiet, scores, every)
    if not scores.rescored and not scores.dead_letters:
        _nothing_to_report(scores, source, recorded.from_topics)
    numbers = scores.report_json(rescorer.threshold, dict(rescorer.domain_thresholds))
    if output is not None:
        try:
            Path(output).write_text(render_html(numbers, source), encoding="utf-8")
        except OSError as exc:
            cli.fail(f"cannot write {output}: {exc}")
        cli.err_console.print(
            f"report of {scores.rescored} scored records and {scores.dead_letters} dead "
            f"letters from {source} written to {output}",
            markup=False,  # paths as written: one may hold "[/x]", which reads as markup
        )
    if as_json:
        cli.print_json({"source": source, **numbers})
    return 0


def _nothing_to_report(scores: RescoreSummary, source: str, from_topics: bool) -> NoReturn:
    """End `report` in one line (exit 1, no page written) when no record read was a scored
    output or a dead letter: raw traces given for scored ones, or an empty file or range,
    made a page of empty charts that exited 0 ("0 scored records")."""
    from worker.core.rescoring import Unrescorable

    if not scores.records:
        cli.fail(f"no records in {source}: nothing to report", cli.EXIT_NOTHING_TO_REPORT)
    reasons = ", ".join(
        f"{reason} {count}" for reason, count in sorted(scores.unrescorable.items())
    )
    # The hint for the commonest reason: raw traces (or the input topic), or outputs that
    # cannot be re-scored (scored without a model, by an older scorer, ...).
    most = scores.unrescorable.most_common(1)[0][0]
    if most == Unrescorable.NO_EMBEDDER:
        how = (
            "outputs scored without a model (--no-embedder) have no novelty to re-score from: "
            "score the traces with the model"
        )
    elif most != Unrescorable.NOT_AN_OUTPUT:
        how = "`kp-scorer rescore` of the same input shows why, with examples"
    elif from_topics:
        how = "read the output topics (accepted, rejected, dead letters), not the input topic"
    else:
        how = (
            "score traces first: `kp-scorer score FILE > scored.jsonl`, then "
            "`kp-scorer report scored.jsonl`"
        )
    cli.fail(
        f"no scored outputs in {source} ({scores.records} records read: {reasons}); {how}",
        cli.EXIT_NOTHING_TO_REPORT,
    )
