"""``kp-scorer rescore`` and ``kp-scorer report``: what recorded outputs (a file that `score`
wrote, or ranges of the output topics) become under other profiles and thresholds, from
their recorded novelty (no model)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import click
from rich.console import Console
from rich.markup import escape

from worker.cli import main as cli
from worker.logs import configure_logging
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.core.rescoring import Rescorer, RescoreSummary

Found = tuple["RescoreSummary", str] | int | None


def _start(
    file: str | None,
    from_topics: bool,
    topic_flags: dict[str, Any],
    what_if: dict[str, Any],
    human: bool,
    need_file: bool = False,
) -> tuple[Settings, Rescorer] | int:
    """The settings and rescorer of a run, or exit code 2 (after one line) when FILE and
    --from-topics, or the flags of a topic range without --from-topics, are given together
    (or, ``need_file``, neither: stdin is no default)."""
    from worker.core.rescoring import Rescorer
    from worker.core.scoring import load_profiles

    if from_topics and file is not None:
        cli.say("kp-scorer: give a FILE or --from-topics, not both", "red")
        return 2
    used = [flag for flag, value in topic_flags.items() if value not in (None, ())]
    if not from_topics and used:
        cli.say(f"kp-scorer: {', '.join(used)} need --from-topics", "red")
        return 2
    if need_file and file is None and not from_topics:
        cli.say("kp-scorer: give a FILE of scored outputs or --from-topics", "red")
        return 2
    settings = cli.checked_settings(what_if["profiles"], what_if["threshold"])
    configure_logging(
        "WARNING" if settings.log_level == "INFO" else settings.log_level,
        settings.log_repeat_interval_seconds,
        human=human,
    )
    rescorer = Rescorer(
        load_profiles(settings.profiles_file),
        settings.accept_threshold,
        {**settings.domain_thresholds, **dict(what_if["domain_threshold"])},
    )
    return settings, rescorer


def _topic_flags(topics: Sequence[str], bounds: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The flags of a topic range, by flag, as given (None or empty when not)."""
    given = {"topic": topics, **{name: bounds[name] for name in cli.RANGE_FLAGS}, **more}
    return {f"--{name.replace('_', '-')}": value for name, value in given.items()}


def _read(
    file: str | None,
    from_topics: bool,
    topics: Sequence[str],
    bounds: dict[str, Any],
    settings: Settings,
    rescorer: Rescorer,
    out: BinaryIO | None,
    quiet: bool,
    summary: RescoreSummary | None = None,
    default_topics: Sequence[str] | None = None,
    output_prefix: str | None = None,
) -> Found:
    """File mode: a JSONL of scored outputs (or stdin), the same lines re-scored to ``out``.
    Topic mode: ranges of ``topics`` (default: the accepted/rejected topics, or
    ``default_topics``), read without a group; an exit code (as ``replay``'s) when it could not
    finish."""
    from worker.cli.progress import read_lines_with_progress, with_record_progress
    from worker.cli.rescore import RescoreRange, rescore_stream, run_rescore_topics

    if not from_topics:
        return read_lines_with_progress(
            "rescoring",
            file,
            quiet,
            lambda stream, advance: rescore_stream(rescorer, stream, out, advance, summary=summary),
        )
    read = list(topics or default_topics or (settings.accepted_topic, settings.rejected_topic))
    scope = RescoreRange(topics=read, **bounds)
    result = with_record_progress(
        "rescoring",
        settings,
        lambda advance: run_rescore_topics(
            settings, rescorer, scope, output_prefix, out, advance, summary
        ),
        quiet=quiet,
    )
    return result if isinstance(result, int) else (result, ", ".join(read))


@click.command(
    cls=cli.Command,
    help="re-score recorded outputs with other profiles/thresholds (recorded novelty, no model)",
)
@cli.recorded_outputs_options(
    "the accepted and rejected topics", "KP_ACCEPTED_TOPIC and KP_REJECTED_TOPIC"
)
@click.option("--output-prefix", help="with --from-topics: publish to PREFIX.accepted/.rejected")
@click.option(
    "--output",
    metavar="PATH",
    help="write the re-scored JSONL here (- for stdout; the default for a FILE)",
)
@cli.what_if_options(per_domain=True)
@cli.json_option("summary as JSON, not tables")
@cli.quiet_option
def rescore(
    file: str | None,
    from_topics: bool,
    topics: tuple[str, ...],
    output_prefix: str | None,
    output: str | None,
    as_json: bool,
    quiet: bool,
    **given: Any,
) -> int:
    """Re-score recorded outputs with other settings, from their recorded novelty (no model)."""
    import orjson

    from worker.cli.rescore import print_summary
    from worker.core.rescoring import RAW_TRACE

    bounds = {name: given.pop(name) for name in cli.RANGE_FLAGS}
    flags = _topic_flags(topics, bounds, output_prefix=output_prefix)
    started = _start(file, from_topics, flags, given, human=True)
    if isinstance(started, int):
        return started
    settings, rescorer = started
    output = output if output is not None else (None if from_topics else "-")
    out_stream = None
    if output == "-":
        out_stream = sys.stdout.buffer
    elif output is not None:
        try:
            out_stream = Path(output).open("wb")  # noqa: SIM115  (closed below)
        except OSError as exc:
            cli.err_console.print(f"[red]kp-scorer: cannot write {output}: {exc}[/red]")
            return 2
    quiet = quiet or not cli.err_console.is_terminal
    try:
        found = _read(
            file,
            from_topics,
            topics,
            bounds,
            settings,
            rescorer,
            out_stream,
            quiet,
            output_prefix=output_prefix,
        )
    finally:
        if out_stream is not None and out_stream is not sys.stdout.buffer:
            out_stream.close()
    if found is None:
        return 2
    if isinstance(found, int):  # the broker was unreachable, or Ctrl-C: already said
        return found
    summary, source = found
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
        summary_console.file.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        summary_console.file.write("\n")
        summary_console.file.flush()
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
@cli.recorded_outputs_options(
    "the accepted, rejected and dead-letter topics",
    "KP_ACCEPTED_TOPIC, KP_REJECTED_TOPIC and KP_DEAD_LETTER_TOPIC",
)
@click.option(
    "--output",
    "-o",
    metavar="PATH",
    help="the HTML page (default report.html; with --json, only when given)",
)
@cli.what_if_options(per_domain=True)
@cli.json_option("the numbers as JSON on stdout")
@cli.quiet_option
def report(
    file: str | None,
    from_topics: bool,
    topics: tuple[str, ...],
    output: str | None,
    as_json: bool,
    quiet: bool,
    **given: Any,
) -> int:
    """The score report of recorded outputs: an HTML page, or its numbers as JSON."""
    import orjson

    from worker.core.score_report import ScoreReport

    bounds = {name: given.pop(name) for name in cli.RANGE_FLAGS}
    started = _start(file, from_topics, _topic_flags(topics, bounds), given, False, need_file=True)
    if isinstance(started, int):
        return started
    settings, rescorer = started
    output = output if output is not None else (None if as_json else "report.html")
    if output is not None:
        try:  # a missing extra fails at once, before anything is read
            from worker.cli.report import figure_class

            figure_class()
        except RuntimeError as exc:
            cli.err_console.print(f"[red]kp-scorer: {escape(str(exc))}[/red]")
            return 2
    scores = ScoreReport()
    quiet = quiet or not cli.err_console.is_terminal
    every = (settings.accepted_topic, settings.rejected_topic, settings.dead_letter_topic)
    found = _read(file, from_topics, topics, bounds, settings, rescorer, None, quiet, scores, every)
    if found is None:
        return 2
    if isinstance(found, int):
        return found
    _, source = found
    thresholds = dict(rescorer.domain_thresholds)
    if output is not None:
        from worker.cli.report import PlottingUnavailableError, render_html

        try:
            page = render_html(scores, source, rescorer.threshold, thresholds)
        except PlottingUnavailableError as exc:
            cli.err_console.print(f"[red]kp-scorer: {escape(str(exc))}[/red]")
            return 2
        try:
            Path(output).write_text(page, encoding="utf-8")
        except OSError as exc:
            cli.err_console.print(f"[red]kp-scorer: cannot write {output}: {exc}[/red]")
            return 2
        cli.err_console.print(
            f"report of {scores.rescored} scored records and {scores.dead_letters} dead "
            f"letters from {source} written to {output}"
        )
    if as_json:
        numbers = {"source": source, **scores.report_json(rescorer.threshold, thresholds)}
        sys.stdout.write(orjson.dumps(numbers, option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0
