"""kp-scorer command line: worker, demo, score (offline JSONL), replay, rescore, report,
settings, check, model build."""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar, NoReturn, TypeVar

import click
import orjson
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from worker.cli import stdio
from worker.logs import configure_logging, error_line
from worker.settings import (
    RepeatedKeyError,
    Settings,
    SettingsError,
    load_settings,
    unique_keys,
    unknown_variables,
)
from worker.version import __version__

# Error lines stay whole (not wrapped at 80 columns) when stderr goes to a file or a log.
err_console = Console(stderr=True, soft_wrap=True)
log = logging.getLogger("worker.cli")
F = TypeVar("F", bound=Callable[..., Any])

# `score --fail-on-error` when a line was dead-lettered.
EXIT_DEAD_LETTERS = 1
# `worker`: the metrics port cannot be bound (a setting to change, as for a bad setting).
EXIT_METRICS_PORT = 2
# Whoever read our stdout stopped (`| head`): what a shell reports for a filter ended by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + 13
# `replay`, `rescore --from-topics`: the broker is unreachable, or stopped answering.
EXIT_UNREACHABLE = 1
# The output could not be written (a full disk) or the input read, once the command began.
EXIT_IO_ERROR = 1
# Ctrl-C: what a shell reports for a command ended by SIGINT.
EXIT_INTERRUPTED = 128 + 2
# `report` read no scored output and no dead letter (raw traces, an empty file or range).
EXIT_NOTHING_TO_REPORT = 1
# `check` found something this installation cannot do.
EXIT_CHECK_FAILED = 1
# faust's --loglevel knows crit/error/warn/info/debug, not Python's WARNING.
FAUST_LOG_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error"}


def checked_settings(
    profiles: Path | None = None,
    threshold: float | None = None,
    logs: str | None = "human",
    quieter: bool = False,
) -> Settings:
    """Settings (with the command's flags over the environment) plus the weight profiles they
    name, validated before anything starts; an error names the flag or variable it came from.
    Then the command's logging: ``logs`` "human" (plain lines), "json" or None (none set up);
    ``quieter``: the default level INFO logs at WARNING (a command that reads a backlog)."""
    from worker.core.scoring import ProfileError, load_profiles
    from worker.io.tls import tls_problem

    overrides: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for field, flag, value in (
        ("profiles_file", "--profiles", profiles),
        ("accept_threshold", "--threshold", threshold),
    ):
        if value is not None:
            overrides[field], flags[field] = value, flag
    try:
        settings = load_settings(flags, **overrides)
    except SettingsError as exc:
        fail(str(exc))
    problem = tls_problem(settings)
    # Only an operator's model, run batched, can be int8 and batched: the import loads onnxruntime.
    if settings.model_path is not None and settings.embed_batch_size != 1:
        from worker.embedding.files import int8_batch_problem

        problem = int8_batch_problem(settings) or problem
    if problem is not None:
        fail(f"invalid configuration:\n  {problem}")
    try:
        load_profiles(settings.profiles_file)
    except ProfileError as exc:
        fail(f"{flags.get('profiles_file', 'KP_PROFILES_FILE')}: {exc}")
    if logs is not None:
        level = "WARNING" if quieter and settings.log_level == "INFO" else settings.log_level
        configure_logging(level, settings.log_repeat_interval_seconds, human=logs == "human")
    return settings


def warn_unknown_variables(as_log: bool = False) -> None:
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
            say(f"kp-scorer: unknown environment variable {name} ignored{hint}", "yellow")


def say(text: str, style: str | None = None) -> None:
    """One line on stderr, as written (no markup: paths and errors may hold brackets)."""
    err_console.print(text, style=style, markup=False, highlight=False)


def fail(problem: str, code: int = 2) -> NoReturn:
    """End the command with one red line on stderr and exit ``code`` (2: the flags or the
    configuration are wrong); :func:`main` turns the SystemExit into the exit code."""
    say(f"kp-scorer: {problem}", "red")
    raise SystemExit(code)


def print_json(value: Any, file: IO[str] | None = None, default: Any = None) -> None:
    """A command's JSON result, indented, on stdout (or ``file``)."""
    file = file or sys.stdout
    file.write(orjson.dumps(value, default=default, option=orjson.OPT_INDENT_2).decode() + "\n")
    file.flush()


def bar_table(
    title: str, rows: Sequence[tuple[str, int]], *columns: str, width: int = 30, style: str = ""
) -> Table:
    """Counts with a bar each, scaled to the largest: a histogram in a terminal."""
    table = Table(columns[0], Column(columns[1], justify="right"), "", title=title)
    peak = max((count for _, count in rows), default=0) or 1
    for label, count in rows:
        table.add_row(label, str(count), Text("█" * round(width * count / peak), style=style))
    return table


def name_of(file: str | None) -> str:
    """How a line source is named in outputs: the path, or ``stdin``. Outputs are UTF-8 JSON,
    and a file name may hold other bytes (a Latin-1 name): those are replaced."""
    if file in (None, "-"):
        return "stdin"
    return os.fsencode(Path(file)).decode("utf-8", "replace")


# --- flag values (a bad one is a usage error naming the flag) ------------------------------


# What Apache Kafka allows in a topic name (some brokers accept more; a cluster refuses it).
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_LONGEST_SUFFIX = ".dead-letter"


def topic_prefix(value: str) -> str:
    """``--output-prefix``: PREFIX.accepted, .rejected and .dead-letter must be legal topic
    names, or the cluster refuses to make them (said as if Kafka were unreachable)."""
    name = value + _LONGEST_SUFFIX
    if not _TOPIC_NAME.fullmatch(name):
        raise click.BadParameter(
            f"{value!r}: topic names are letters, digits, '.', '_' and '-', at most "
            f"{249 - len(_LONGEST_SUFFIX)} characters before {_LONGEST_SUFFIX}"
        )
    return value


def _domain_threshold(value: str) -> tuple[str, float]:
    domain, sep, number = value.rpartition("=")
    try:
        threshold = float(number)
    except ValueError:
        threshold = float("nan")
    if not sep or not domain or not 0.0 <= threshold <= 1.0:
        raise click.BadParameter(f"expected DOMAIN=THRESHOLD with a threshold in [0, 1]: {value!r}")
    return domain, threshold


def _distinct_domains(
    ctx: click.Context, param: click.Parameter, value: tuple[tuple[str, float], ...]
) -> tuple[tuple[str, float], ...]:
    """Refuse a domain given twice, as KP_DOMAIN_THRESHOLDS refuses a key given twice: which
    threshold was meant is unknown (the last one silently won)."""
    try:
        unique_keys(list(value))
    except RepeatedKeyError as exc:
        raise click.BadParameter(f"domain {exc.key!r} given twice") from None
    return value


FILE_PATH = click.Path(path_type=Path)


# --- shared options -------------------------------------------------------------------------


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several click decorators as one, listed in help in the order given."""

    def apply(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


# The weight profiles and accept threshold a command scores with, over the settings'.
what_if_options = options(
    click.option(
        "--profiles",
        type=FILE_PATH,
        help="weight profiles JSON file (default: KP_PROFILES_FILE, else the built-in ones)",
    ),
    click.option(
        "--threshold",
        type=float,
        help="accept threshold (default: KP_ACCEPT_THRESHOLD, else "
        f"{Settings.model_fields['accept_threshold'].default})",
    ),
)
# What `rescore` and `report` add to them: a threshold for one task domain.
domain_threshold_option = click.option(
    "--domain-threshold",
    type=_domain_threshold,
    metavar="DOMAIN=T",
    multiple=True,
    callback=_distinct_domains,
    help="accept threshold for one task_domain (repeatable; adds to KP_DOMAIN_THRESHOLDS)",
)
quiet_option = click.option("--quiet", is_flag=True, help="no progress bar")


def json_option(what: str) -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=what)


# --- help -----------------------------------------------------------------------------------


class Described(click.Argument):
    """A positional argument with a line of help, listed with the options."""

    def __init__(self, *args: Any, help: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = help

    def get_help_record(self, ctx: click.Context) -> tuple[str, str]:
        default = self.get_default(ctx, call=False)
        shown = f" [default: {default}]" if isinstance(default, str) else ""  # not unset
        return self.make_metavar(ctx), self.help + shown


class Command(click.Command):
    """A command whose help lists its positional arguments with the options, each default
    shown by click (``show_default``, set on the group), and that warns of unknown ``KP_*``
    variables once its flags are read."""

    def get_short_help_str(self, limit: int = 0) -> str:
        return self.short_help or self.help or ""  # whole, as the list of commands has room

    def invoke(self, ctx: click.Context) -> Any:
        warn_unknown_variables()
        return super().invoke(ctx)


class SuggestingGroup(click.Group):
    """A group that answers a misspelt command with the closest one ("Did you mean 'score'?"),
    as click does for a misspelt option: click 8 has no suggestion for commands."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        unknown = not name.startswith("-") and self.get_command(ctx, name) is None
        if unknown and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1)
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)


class Group(SuggestingGroup):
    """The commands, each loaded from its module when named (it imports what only it needs)."""

    modules: ClassVar = {"score": "score", "worker": "service", "demo": "demo"}
    modules |= {"replay": "replay", "rescore": "recorded", "report": "recorded"}
    modules |= {"settings": "service", "check": "check", "model": "model"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.modules)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self.modules.get(cmd_name)
        if module is None:
            return None
        command: click.Command = getattr(importlib.import_module(f"worker.cli.{module}"), cmd_name)
        return command


kp_scorer = Group(
    "kp-scorer",
    help=__doc__,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
click.version_option(__version__, "--version", message="kp-scorer %(version)s")(kp_scorer)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (a usage error exits 2, as ``SystemExit``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    stdio.stand_in_for_closed_streams()
    try:
        with kp_scorer.make_context("kp-scorer", args) as ctx:
            return int(kp_scorer.invoke(ctx) or 0)
    except click.exceptions.Exit as exc:  # --help, --version
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:  # a usage error: the flag and what is wrong with it
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except SystemExit as exc:  # start-up checks stop with a message and a code
        return exc.code if isinstance(exc.code, int) else 1
    except BrokenPipeError:
        stdio.discard_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # the output cannot be written (a full disk), or the input read
        stdio.discard_stdout()
        say(f"kp-scorer: {error_line(exc)}", "red")
        return EXIT_IO_ERROR
    except (KeyboardInterrupt, ImportError) as exc:
        # Ctrl-C outside a read of topics (loading the model, ...); while an extension module
        # initialises (onnxruntime takes ~0.3 s), it surfaces as the ImportError it caused.
        if isinstance(exc, ImportError) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        say("kp-scorer: interrupted", "red")
        return EXIT_INTERRUPTED
