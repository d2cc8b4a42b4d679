"""kp-scorer command line: worker, demo, score (offline JSONL), replay, rescore, report,
settings, check, model build."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from worker import __version__
from worker.logs import configure_logging, error_line
from worker.memory import keep_large_blocks_mapped
from worker.settings import (
    UNSET_MEANS,
    Settings,
    SettingsError,
    by_variable,
    load_settings,
    unknown_variables,
)

if TYPE_CHECKING:
    from worker.core.rescoring import Rescorer, RescoreSummary

# Error lines stay whole (not wrapped at 80 columns) when stderr goes to a file or a log.
err_console = Console(stderr=True, soft_wrap=True)
log = logging.getLogger("worker.cli")
T = TypeVar("T")

# Flags that override a setting: argparse destination -> (flag, setting).
SETTING_FLAGS = {
    "profiles": ("--profiles", "profiles_file"),
    "threshold": ("--threshold", "accept_threshold"),
}
# `score --fail-on-error` when a line was dead-lettered.
EXIT_DEAD_LETTERS = 1
# `worker`: the metrics port cannot be bound (a setting to change, as for a bad setting).
EXIT_METRICS_PORT = 2
# Whoever read our stdout stopped (`| head`): what a shell reports for a filter ended by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + 13
# `replay`, `rescore --from-topics`: the broker is unreachable, or stopped answering.
EXIT_UNREACHABLE = 1
# Ctrl-C: what a shell reports for a command ended by SIGINT.
EXIT_INTERRUPTED = 128 + 2


def _checked_settings(args: argparse.Namespace | None = None) -> Settings:
    """Settings (with the command's flags over the environment) plus the weight profiles they
    name, validated before anything starts; an error names the flag or variable it came from."""
    from worker.cli.model import int8_batch_problem
    from worker.core.scoring import ProfileError, load_profiles

    overrides: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for dest, (flag, field) in SETTING_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides[field], flags[field] = value, flag
    try:
        settings = load_settings(flags, **overrides)
    except SettingsError as exc:
        err_console.print(f"[red]kp-scorer: {exc}[/red]")
        raise SystemExit(2) from None
    problem = int8_batch_problem(settings)
    if problem is not None:
        _say(f"kp-scorer: invalid configuration:\n  {problem}", "red")
        raise SystemExit(2)
    try:
        load_profiles(settings.profiles_file)
    except ProfileError as exc:
        where = flags.get("profiles_file", "KP_PROFILES_FILE")
        err_console.print(f"[red]kp-scorer: {where}: {exc}[/red]")
        raise SystemExit(2) from None
    return settings


def _warn_unknown_variables(as_log: bool = False) -> None:
    """One warning per ``KP_*`` variable that no setting reads (a typo is otherwise silent):
    a JSON log line from the worker, whose output is all JSON; a plain line elsewhere."""
    for name, close in unknown_variables(os.environ):
        hint = f" (did you mean {close}?)" if close else ""
        if as_log:
            log.warning(
                f"unknown environment variable {name} ignored{hint}",
                extra={"variable": name, "did_you_mean": close},
            )
        else:
            err_console.print(
                f"[yellow]kp-scorer: unknown environment variable {name} ignored{hint}[/]",
                soft_wrap=True,
                highlight=False,
            )


def _read_lines_with_progress(
    verb: str,
    file: str | None,
    quiet: bool,
    run: Callable[[BinaryIO, Callable[[int, int], None]], T],
) -> tuple[T, str] | None:
    """Open FILE (or stdin for ``-``) and run over it under a progress bar in bytes and lines;
    None (after one line on stderr) when the file does not exist."""
    name = name_of(file)
    if file in (None, "-"):
        stream, total = sys.stdin.buffer, None
        if sys.stdin.isatty():  # a person who forgot the file would otherwise see nothing
            _say("kp-scorer: reading JSONL from stdin (Ctrl-D ends it; give a FILE to read one)")
    else:
        path = Path(file)
        if path.is_dir():
            _say(f"kp-scorer: {path} is a directory; give a JSONL file", "red")
            return None
        if not path.is_file():
            _say(f"kp-scorer: no such file: {path}", "red")
            return None
        stream, total = path.open("rb"), path.stat().st_size
    progress = Progress(
        TextColumn(verb),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[lines]} lines"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=quiet,
        # The bar draws on stderr; stdout is the command's output (`> out.jsonl`), which a
        # live display would otherwise take over on a terminal and print on stderr.
        redirect_stdout=False,
    )
    with stream, progress:
        task = progress.add_task(verb, total=total, lines=0)
        lines_done = 0

        def advance(lines: int, size: int) -> None:
            nonlocal lines_done
            lines_done += lines
            progress.update(task, advance=size, lines=lines_done)

        try:
            return run(stream, advance), name
        except BaseException:
            # Cut short (`| head`, Ctrl-C): take the bar off the terminal, not leave it there
            # half-drawn above the prompt.
            progress.live.transient = True
            raise


def _say(text: str, style: str | None = None) -> None:
    """One line on stderr, as written (no markup: paths and errors may hold brackets)."""
    err_console.print(text, style=style, markup=False, highlight=False)


def _model_whole(settings: Settings) -> Settings:
    """Settings for a command that embeds a backlog (``score``, ``replay``): the model whole.

    On a backlog every model thread has a text of its own, so a run finds no idle thread to
    split over; loading the model as stages would only add their start-up check, a model run
    per layer and their memory (bench/RESULTS.md: ``kp-scorer score`` of 360 lines ~1.13x as
    fast, ~90 MiB less at its peak).
    """
    return settings.model_copy(update={"embed_split_min_tokens": 0})


def name_of(file: str | None) -> str:
    """How a line source is named in outputs: the path, or ``stdin``."""
    return "stdin" if file in (None, "-") else str(Path(file))


def cmd_score(args: argparse.Namespace) -> int:
    from worker.cli.score import LineRecords, score_lines
    from worker.core.scorer import build_scorer

    settings = _checked_settings(args)
    configure_logging(settings.log_level, settings.log_repeat_interval_seconds, human=True)
    # JSON lines are never framed: KP_INPUT_FRAMING is the input topic's, not a file's.
    offline = _model_whole(settings).model_copy(update={"input_framing": "json"})
    scorer = build_scorer(offline, use_embedder=not args.no_embedder)
    if scorer.embedder is None and not args.no_embedder:
        err_console.print(
            f"[yellow]embedder unavailable ({scorer.embedder_reason}); novelty 0.5[/]"
        )

    records = LineRecords(name_of(args.file), args.partition_by)
    result = _read_lines_with_progress(
        "scoring",
        args.file,
        args.quiet,
        lambda stream, advance: score_lines(scorer, stream, sys.stdout, records, advance),
    )
    if result is None:
        return 2
    summary, _ = result
    err_console.print(summary.describe())
    if args.partition_by is not None and summary.lines and not records.lines_with_field:
        _say(
            f"kp-scorer: --partition-by {args.partition_by}: no line has this field, so every "
            "line shared one novelty cache",
            "yellow",
        )
    if args.fail_on_error and summary.dead_letters:
        return EXIT_DEAD_LETTERS
    return 0


# faust's --loglevel knows crit/error/warn/info/debug, not Python's WARNING.
FAUST_LOG_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error"}


def cmd_worker(args: argparse.Namespace, faust_args: list[str]) -> int:
    """Run the stream worker through Faust's own CLI (its flags pass through)."""
    settings = _checked_settings()
    configure_logging(settings.log_level, settings.log_repeat_interval_seconds)
    _warn_unknown_variables(as_log=True)
    keep_large_blocks_mapped()  # before the model is loaded
    from worker.io import http
    from worker.io.app import create_app

    try:
        listener = http.listen(settings.metrics_port) if settings.metrics_port else None
    except http.MetricsPortUnavailable as exc:
        log.error(str(exc), extra={"port": exc.port, "variable": "KP_METRICS_PORT"})
        return EXIT_METRICS_PORT
    app = create_app(settings, metrics_listener=listener)
    if not any(arg.startswith(("--loglevel", "-l")) for arg in faust_args):
        faust_args = ["--loglevel", FAUST_LOG_LEVELS[settings.log_level], *faust_args]
    # --quiet: no startup banner on stdout; the worker writes JSON log lines only.
    sys.argv = ["kp-scorer", "--quiet", "worker", "--without-web", *faust_args]
    app.main()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from worker.cli.demo import run_demo

    # The worker's JSON log goes to its own file; what the Kafka clients of the demo itself
    # warn of is said in plain lines.
    configure_logging("WARNING", human=True)
    return run_demo(args.traces, args.rate, args.timeout, args.keep_running)


def _what_if_options(parser: argparse.ArgumentParser, profiles: str, threshold: str) -> None:
    """The profiles and thresholds that `rescore` and `report` apply to recorded outputs."""
    parser.add_argument("--profiles", type=Path, help=profiles)
    parser.add_argument("--threshold", type=float, help=threshold)
    parser.add_argument(
        "--domain-threshold",
        type=_domain_threshold,
        action="append",
        metavar="DOMAIN=T",
        help="accept threshold for one task_domain (repeatable; adds to KP_DOMAIN_THRESHOLDS)",
    )


def _recorded_outputs_options(
    parser: argparse.ArgumentParser, topics: str, default_topics: str
) -> None:
    """What `rescore` and `report` read: a file of scored outputs, or a range of topics. The
    range is of the topics read (offsets and partitions of each; times are when the outputs
    were published, i.e. scored), as `replay`'s is of the topic it reads."""
    parser.add_argument(
        "file", nargs="?", help="JSONL of scored outputs (as `score` writes), or - for stdin"
    )
    parser.add_argument(
        "--from-topics", action="store_true", help=f"read {topics} instead of a file"
    )
    parser.add_argument(
        "--topic",
        action="append",
        help=f"with --from-topics: a topic to read (repeatable; default: {default_topics})",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-offset", type=int, help="first offset (default: the beginning)")
    start.add_argument("--from-time", type=_iso, help="first output at or after this ISO time")
    end = parser.add_mutually_exclusive_group()
    end.add_argument("--to-offset", type=int, help="stop before this offset")
    end.add_argument("--to-time", type=_iso, help="stop at the first output at or after this")
    parser.add_argument(
        "--partitions", type=_partition_list, help="of the topics read, e.g. 0,2 (default: all)"
    )


def _iso(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _partition_list(value: str) -> list[int]:
    try:
        return [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected partitions like 0,1,2: {value!r}") from None


def _range_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The partitions and offset/time bounds that replay and rescore read alike."""
    return {
        "partitions": args.partitions,
        "from_offset": args.from_offset,
        "from_time": args.from_time,
        "to_offset": args.to_offset,
        "to_time": args.to_time,
    }


def _with_record_progress(
    verb: str,
    settings: Settings,
    run: Callable[[Callable[[int, int | None], None]], T],
    quiet: bool = False,
) -> T | int:
    """Run a long read of topics under a progress bar; a bad range or an unreachable broker
    ends as one line and an exit code (2 and 1) instead of a traceback."""
    from aiokafka.errors import KafkaError

    progress = Progress(
        TextColumn(verb),
        BarColumn(),
        TextColumn("{task.completed} records"),
        TextColumn("{task.fields[rate]:.1f}/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=quiet,
        # The bar draws on stderr; stdout is the command's output (`> out.jsonl`), which a
        # live display would otherwise take over on a terminal and print on stderr.
        redirect_stdout=False,
    )
    started = time.monotonic()
    failure: tuple[str, int] | None = None
    with progress:
        task = progress.add_task(verb, total=None, rate=0.0)

        def advance(count: int, total: int | None) -> None:
            done = progress.tasks[0].completed + count
            rate = done / max(time.monotonic() - started, 1e-9)
            progress.update(task, completed=done, total=total, rate=rate)

        try:
            return run(advance)
        except ValueError as exc:
            failure = f"kp-scorer: {exc}", 2
        except (KafkaError, OSError) as exc:
            failure = (
                f"kp-scorer: Kafka unreachable at {settings.kafka_bootstrap_servers}: "
                f"{error_line(exc)}",
                EXIT_UNREACHABLE,
            )
        except KeyboardInterrupt:
            done = int(progress.tasks[0].completed)
            failure = f"kp-scorer: interrupted after {done} records", EXIT_INTERRUPTED
        # The error is the last line, not the bar.
        progress.live.transient = True
    assert failure is not None  # every way out of the block above returns or sets it
    line, code = failure
    _say(line, "red")
    return code


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.table import Table

    from worker.cli.replay import ReplayRange, run_replay
    from worker.core.scorer import build_scorer

    settings = _checked_settings(args)
    configure_logging(
        "WARNING" if settings.log_level == "INFO" else settings.log_level,
        settings.log_repeat_interval_seconds,
        human=True,
    )
    scorer = build_scorer(_model_whole(settings))
    scope = ReplayRange(topic=args.topic, **_range_flags(args))
    result = _with_record_progress(
        "replaying",
        settings,
        lambda advance: run_replay(settings, scorer, scope, args.output_prefix, advance),
        quiet=not err_console.is_terminal,  # as rescore: no bar written into a log file
    )
    if isinstance(result, int):
        return result
    summary = result
    decisions = ", ".join(f"{k}={v}" for k, v in sorted(summary.decisions.items()))
    err_console.print(
        f"replayed {summary.records} records into {args.output_prefix}.*: {decisions}"
    )
    if not summary.original_found:
        err_console.print("no earlier decisions found in the live output topics to compare")
        return 0
    err_console.print(
        f"compared with the live outputs: {summary.compared} records, "
        f"{summary.accept_to_reject} flipped accepted -> rejected, "
        f"{summary.reject_to_accept} flipped rejected -> accepted"
    )
    table = Table(title="score change (replay - live)")
    table.add_column("delta")
    table.add_column("records", justify="right")
    peak = max((count for _, count in summary.delta_histogram()), default=1) or 1
    table.add_column("")
    for label, count in summary.delta_histogram():
        table.add_row(label, str(count), "█" * round(30 * count / peak))
    err_console.print(table)
    return 0


def _domain_threshold(value: str) -> tuple[str, float]:
    domain, sep, number = value.rpartition("=")
    try:
        threshold = float(number)
    except ValueError:
        threshold = float("nan")
    if not sep or not domain or not 0.0 <= threshold <= 1.0:
        raise argparse.ArgumentTypeError(
            f"expected DOMAIN=THRESHOLD with a threshold in [0, 1]: {value!r}"
        )
    return domain, threshold


_RESCORE_TOPIC_FLAGS = {
    "--topic": "topic",
    "--partitions": "partitions",
    "--from-offset": "from_offset",
    "--from-time": "from_time",
    "--to-offset": "to_offset",
    "--to-time": "to_time",
    "--output-prefix": "output_prefix",
}


def cmd_rescore(args: argparse.Namespace) -> int:
    """Re-score recorded outputs with other settings, from their recorded novelty (no model)."""
    import orjson

    from worker.cli.rescore import print_summary
    from worker.core.rescoring import RAW_TRACE, Rescorer
    from worker.core.scoring import load_profiles

    if args.from_topics and args.file is not None:
        err_console.print("[red]kp-scorer: give a FILE or --from-topics, not both[/red]")
        return 2
    used = [flag for flag, name in _RESCORE_TOPIC_FLAGS.items() if getattr(args, name) is not None]
    if not args.from_topics and used:
        err_console.print(f"[red]kp-scorer: {', '.join(used)} need --from-topics[/red]")
        return 2
    settings = _checked_settings(args)
    configure_logging(
        "WARNING" if settings.log_level == "INFO" else settings.log_level,
        settings.log_repeat_interval_seconds,
        human=True,
    )
    rescorer = Rescorer(
        load_profiles(settings.profiles_file),
        settings.accept_threshold,
        {**settings.domain_thresholds, **dict(args.domain_threshold or ())},
    )
    output = args.output if args.output is not None else (None if args.from_topics else "-")
    out_stream = None
    if output == "-":
        out_stream = sys.stdout.buffer
    elif output is not None:
        try:
            out_stream = Path(output).open("wb")  # noqa: SIM115  (closed below)
        except OSError as exc:
            err_console.print(f"[red]kp-scorer: cannot write {output}: {exc}[/red]")
            return 2
    quiet = args.quiet or not err_console.is_terminal
    found: tuple[RescoreSummary, str] | int | None
    try:
        if args.from_topics:
            found = _rescore_topics(args, settings, rescorer, out_stream, quiet)
        else:
            found = _rescore_file(args, rescorer, out_stream, quiet)
    finally:
        if out_stream is not None and out_stream is not sys.stdout.buffer:
            out_stream.close()
    if found is None:
        return 2
    if isinstance(found, int):  # the broker was unreachable, or Ctrl-C: already said
        return found
    summary, source = found
    # The summary goes to stdout unless the re-scored records do.
    summary_console = err_console if output == "-" else Console()
    if args.json:
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
        _say(
            "kp-scorer: rescore re-scores outputs that `score` or the worker wrote; for raw "
            "traces use `kp-scorer score FILE`",
            "yellow",
        )
    return 0


def _rescore_file(
    args: argparse.Namespace,
    rescorer: Rescorer,
    out: BinaryIO | None,
    quiet: bool,
    summary: RescoreSummary | None = None,
) -> tuple[RescoreSummary, str] | None:
    """File mode: a JSONL of scored outputs (or stdin), the same lines re-scored to ``out``."""
    from worker.cli.rescore import rescore_stream

    return _read_lines_with_progress(
        "rescoring",
        args.file,
        quiet,
        lambda stream, advance: rescore_stream(rescorer, stream, out, advance, summary=summary),
    )


def _rescore_topics(
    args: argparse.Namespace,
    settings: Settings,
    rescorer: Rescorer,
    out: BinaryIO | None,
    quiet: bool,
    summary: RescoreSummary | None = None,
    default_topics: Sequence[str] | None = None,
) -> tuple[RescoreSummary, str] | int:
    """Topic mode: ranges of the accepted/rejected topics (or ``default_topics``), read
    without a group; an exit code (as ``replay``'s) when it could not finish."""
    from worker.cli.rescore import RescoreRange, run_rescore_topics

    topics = args.topic or list(
        default_topics or (settings.accepted_topic, settings.rejected_topic)
    )
    scope = RescoreRange(topics=topics, **_range_flags(args))
    output_prefix = getattr(args, "output_prefix", None)
    result = _with_record_progress(
        "rescoring",
        settings,
        lambda advance: run_rescore_topics(
            settings, rescorer, scope, output_prefix, out, advance, summary
        ),
        quiet=quiet,
    )
    if isinstance(result, int):
        return result
    return result, ", ".join(topics)


def cmd_report(args: argparse.Namespace) -> int:
    """The score report of recorded outputs: an HTML page, or its numbers as JSON."""
    import orjson
    from rich.markup import escape

    from worker.core.rescoring import Rescorer
    from worker.core.score_report import ScoreReport
    from worker.core.scoring import load_profiles

    if args.from_topics and args.file is not None:
        err_console.print("[red]kp-scorer: give a FILE or --from-topics, not both[/red]")
        return 2
    used = [
        flag for flag, name in _RESCORE_TOPIC_FLAGS.items() if getattr(args, name, None) is not None
    ]
    if not args.from_topics and used:
        err_console.print(f"[red]kp-scorer: {', '.join(used)} need --from-topics[/red]")
        return 2
    if args.file is None and not args.from_topics:
        err_console.print("[red]kp-scorer: give a FILE of scored outputs or --from-topics[/red]")
        return 2
    settings = _checked_settings(args)
    configure_logging(
        "WARNING" if settings.log_level == "INFO" else settings.log_level,
        settings.log_repeat_interval_seconds,
    )
    rescorer = Rescorer(
        load_profiles(settings.profiles_file),
        settings.accept_threshold,
        {**settings.domain_thresholds, **dict(args.domain_threshold or ())},
    )
    output = args.output if args.output is not None else (None if args.json else "report.html")
    if output is not None:
        try:  # a missing extra fails at once, before anything is read
            from worker.cli.report import figure_class

            figure_class()
        except RuntimeError as exc:
            err_console.print(f"[red]kp-scorer: {escape(str(exc))}[/red]")
            return 2
    report = ScoreReport()
    quiet = args.quiet or not err_console.is_terminal
    found: tuple[RescoreSummary, str] | int | None
    if args.from_topics:
        topics = (settings.accepted_topic, settings.rejected_topic, settings.dead_letter_topic)
        found = _rescore_topics(args, settings, rescorer, None, quiet, report, topics)
    else:
        found = _rescore_file(args, rescorer, None, quiet, report)
    if found is None:
        return 2
    if isinstance(found, int):
        return found
    _, source = found
    thresholds = dict(rescorer.domain_thresholds)
    if output is not None:
        from worker.cli.report import PlottingUnavailableError, render_html

        try:
            page = render_html(report, source, rescorer.threshold, thresholds)
        except PlottingUnavailableError as exc:
            err_console.print(f"[red]kp-scorer: {escape(str(exc))}[/red]")
            return 2
        try:
            Path(output).write_text(page, encoding="utf-8")
        except OSError as exc:
            err_console.print(f"[red]kp-scorer: cannot write {output}: {exc}[/red]")
            return 2
        err_console.print(
            f"report of {report.rescored} scored records and {report.dead_letters} dead "
            f"letters from {source} written to {output}"
        )
    if args.json:
        numbers = {"source": source, **report.report_json(rescorer.threshold, thresholds)}
        sys.stdout.write(orjson.dumps(numbers, option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


def _in_use(settings: Settings) -> dict[str, object]:
    """The settings by variable name, with what is resolved at start-up filled in (the model
    file and hash the worker loads, its model threads): an operator asking "which model, how
    many threads?" gets the answer, not ``None``."""
    from worker.embedding.files import packaged_model

    values = by_variable(settings)
    values["KP_EMBED_CONCURRENCY"] = settings.resolved_embed_concurrency
    packaged = packaged_model() if settings.model_path is None else None
    if packaged is not None:  # none installed: no model is in use
        values["KP_MODEL_PATH"] = packaged.path
        values["KP_MODEL_SHA256"] = settings.model_sha256 or packaged.sha256
    return values


def cmd_settings(args: argparse.Namespace) -> int:
    import orjson

    settings = _checked_settings()  # a broken profiles file is a broken configuration too
    values = _in_use(settings)
    if args.json:
        sys.stdout.write(orjson.dumps(values, default=str, option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
    else:
        for name, value in values.items():
            if value is None:
                meaning = UNSET_MEANS.get(name)
                value = f"(unset: {meaning})" if meaning else "(unset)"
            print(f"{name} = {value}")
    sys.stdout.flush()
    return 0


# `check` found something this installation cannot do.
EXIT_CHECK_FAILED = 1


def cmd_check(args: argparse.Namespace) -> int:
    import orjson

    from worker.cli.check import run_check

    settings = _checked_settings()
    configure_logging(settings.log_level, settings.log_repeat_interval_seconds, human=True)
    report, failures = run_check(settings)
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()
    if failures:
        err_console.print(
            f"kp-scorer check: FAILED: {'; '.join(failures)}", markup=False, highlight=False
        )
        return EXIT_CHECK_FAILED
    return 0


class DefaultsShown(argparse.HelpFormatter):
    """Help that states each option's default, where it has one beyond off or unset (and
    the help does not already say it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kp-scorer", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kp-scorer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def add_command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return commands.add_parser(name, formatter_class=DefaultsShown, **kwargs)

    threshold_help = (
        f"accept threshold (default: KP_ACCEPT_THRESHOLD, else "
        f"{Settings.model_fields['accept_threshold'].default})"
    )
    profiles_help = "weight profiles JSON file (default: KP_PROFILES_FILE, else the built-in ones)"

    score = add_command("score", help="score a JSONL file of traces to stdout")
    score.add_argument("file", nargs="?", default="-", help="JSONL file, or - for stdin")
    score.add_argument("--no-embedder", action="store_true", help="novelty 0.5 (no model)")
    score.add_argument(
        "--partition-by",
        metavar="PATH",
        help="dotted field (e.g. metadata.agent_id): lines with equal values share a cache",
    )
    score.add_argument("--profiles", type=Path, help=profiles_help)
    score.add_argument("--threshold", type=float, help=threshold_help)
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.add_argument(
        "--fail-on-error",
        action="store_true",
        help=f"exit {EXIT_DEAD_LETTERS} if any line could not be scored (every line is "
        "still written); without it such lines leave the exit code 0",
    )
    score.set_defaults(func=cmd_score)

    worker = add_command(
        "worker",
        help="run the stream worker against KAFKA_BOOTSTRAP_SERVERS (Faust flags pass through)",
    )
    worker.set_defaults(func=cmd_worker, passthrough=True)

    demo = add_command(
        "demo", help="run broker + worker locally, publish sample traces, print a summary"
    )
    demo.add_argument("--traces", type=Path, help="JSONL traces (default examples/traces.jsonl)")
    demo.add_argument("--rate", type=float, default=10.0, help="traces published per second")
    demo.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for outputs")
    demo.add_argument("--keep-running", action="store_true", help="keep serving until Ctrl-C")
    demo.set_defaults(func=cmd_demo)

    replay = add_command(
        "replay", help="re-score a range of a topic into PREFIX.accepted/.rejected/.dead-letter"
    )
    replay.add_argument("--topic", required=True, help="topic to re-score")
    start = replay.add_mutually_exclusive_group()
    start.add_argument("--from-offset", type=int, help="first offset (default: the beginning)")
    start.add_argument("--from-time", type=_iso, help="first record at or after this ISO time")
    end = replay.add_mutually_exclusive_group()
    end.add_argument("--to-offset", type=int, help="stop before this offset")
    end.add_argument("--to-time", type=_iso, help="stop at the first record at or after this")
    replay.add_argument("--partitions", type=_partition_list, help="e.g. 0,2 (default: all)")
    replay.add_argument("--output-prefix", required=True, help="writes PREFIX.accepted etc.")
    replay.add_argument("--profiles", type=Path, help=profiles_help)
    replay.add_argument("--threshold", type=float, help=threshold_help)
    replay.set_defaults(func=cmd_replay)

    rescore = add_command(
        "rescore",
        help="re-score recorded outputs with other profiles/thresholds (recorded novelty, "
        "no model)",
    )
    _recorded_outputs_options(
        rescore, "the accepted and rejected topics", "KP_ACCEPTED_TOPIC and KP_REJECTED_TOPIC"
    )
    rescore.add_argument(
        "--output-prefix", help="with --from-topics: publish to PREFIX.accepted/.rejected"
    )
    rescore.add_argument(
        "--output",
        metavar="PATH",
        help="write the re-scored JSONL here (- for stdout; the default for a FILE)",
    )
    _what_if_options(rescore, profiles_help, threshold_help)
    rescore.add_argument("--json", action="store_true", help="summary as JSON, not tables")
    rescore.add_argument("--quiet", action="store_true", help="no progress bar")
    rescore.set_defaults(func=cmd_rescore)

    report = add_command(
        "report",
        help="an HTML page of score distributions and acceptance by threshold, from recorded "
        "outputs (recorded novelty, no model)",
    )
    _recorded_outputs_options(
        report,
        "the accepted, rejected and dead-letter topics",
        "KP_ACCEPTED_TOPIC, KP_REJECTED_TOPIC and KP_DEAD_LETTER_TOPIC",
    )
    report.add_argument(
        "--output",
        "-o",
        metavar="PATH",
        help="the HTML page (default report.html; with --json, only when given)",
    )
    _what_if_options(report, profiles_help, threshold_help)
    report.add_argument("--json", action="store_true", help="the numbers as JSON on stdout")
    report.add_argument("--quiet", action="store_true", help="no progress bar")
    report.set_defaults(func=cmd_report)

    show = add_command(
        "settings", help="print the effective settings by variable name (secrets masked)"
    )
    show.add_argument("--json", action="store_true", help="one JSON object keyed by variable")
    show.set_defaults(func=cmd_settings)

    check = add_command(
        "check",
        help="verify this installation: model loads and embeds, every Kafka codec reads; "
        "versions and results as JSON",
    )
    check.set_defaults(func=cmd_check)

    from worker.cli.model import add_model_command

    add_model_command(add_command("model", help="build the model file the worker loads"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    passthrough = getattr(args, "passthrough", False)
    if extra and not passthrough:
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    if not passthrough:  # the worker warns in its own JSON log, once logging is set up
        _warn_unknown_variables()
    try:
        result = args.func(args, extra) if passthrough else args.func(args)
    except SystemExit as exc:  # start-up checks stop with a message and a code
        return exc.code if isinstance(exc.code, int) else 1
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # Ctrl-C outside a read of topics (loading the model, ...)
        _say("kp-scorer: interrupted", "red")
        return EXIT_INTERRUPTED
    return int(result or 0)


def _discard_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone (``| head``), so that the flush at
    interpreter exit does not fail a second time with an "Exception ignored" message."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (tests capture it): nothing to flush
        pass
