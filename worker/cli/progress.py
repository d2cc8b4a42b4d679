"""The progress bars of the commands that read a backlog, on stderr (``main.err_console``):
of a file's bytes and lines (``score``, ``rescore``, ``report``) or of a topic range's records
(``replay``, and ``rescore``/``report --from-topics``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from rich import progress as bars

from worker.cli import main as cli
from worker.logs import error_line
from worker.settings import Settings

T = TypeVar("T")


def _progress(verb: str, *columns: object, quiet: bool) -> bars.Progress:
    return bars.Progress(
        bars.TextColumn(verb),
        bars.BarColumn(),
        *columns,  # type: ignore[arg-type]
        bars.TimeElapsedColumn(),
        bars.TimeRemainingColumn(),
        console=cli.err_console,
        disable=quiet,
        # The bar draws on stderr; stdout is the command's output (`> out.jsonl`), which a
        # live display would otherwise take over on a terminal and print on stderr.
        redirect_stdout=False,
    )


def read_lines_with_progress(
    verb: str,
    file: str | None,
    quiet: bool,
    run: Callable[[BinaryIO, Callable[[int, int], None]], T],
) -> tuple[T, str] | None:
    """Open FILE (or stdin for ``-``) and run over it under a progress bar in bytes and lines;
    None (after one line on stderr) when the file does not exist."""
    name = cli.name_of(file)
    if file in (None, "-"):
        stream, total = sys.stdin.buffer, None
        if sys.stdin.isatty():  # a person who forgot the file would otherwise see nothing
            cli.say("kp-scorer: reading JSONL from stdin (Ctrl-D ends it; give a FILE to read one)")
    else:
        path = Path(file)
        if path.is_dir():
            cli.say(f"kp-scorer: {path} is a directory; give a JSONL file", "red")
            return None
        if not path.is_file():
            cli.say(f"kp-scorer: no such file: {path}", "red")
            return None
        stream, total = path.open("rb"), path.stat().st_size
    columns = (
        bars.DownloadColumn(),
        bars.TransferSpeedColumn(),
        bars.TextColumn("{task.fields[lines]} lines"),
    )
    progress = _progress(verb, *columns, quiet=quiet)
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


def with_record_progress(
    verb: str,
    settings: Settings,
    run: Callable[[Callable[[int, int | None], None]], T],
    quiet: bool = False,
) -> T | int:
    """Run a long read of topics under a progress bar; a bad range or an unreachable broker
    ends as one line and an exit code (2 and 1) instead of a traceback."""
    from aiokafka.errors import KafkaError

    columns = (
        bars.TextColumn("{task.completed} records"),
        bars.TextColumn("{task.fields[rate]:.1f}/s"),
    )
    progress = _progress(verb, *columns, quiet=quiet)
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
                cli.EXIT_UNREACHABLE,
            )
        except KeyboardInterrupt:
            done = int(progress.tasks[0].completed)
            failure = f"kp-scorer: interrupted after {done} records", cli.EXIT_INTERRUPTED
        # The error is the last line, not the bar.
        progress.live.transient = True
    assert failure is not None  # every way out of the block above returns or sets it
    line, code = failure
    cli.say(line, "red")
    return code
