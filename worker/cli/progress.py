"""The progress bars of the commands that read a backlog, on stderr (``main.err_console``):
of a file's bytes and lines (``score``, ``rescore``, ``report``) or of a topic range's records
(``replay``, and ``rescore``/``report --from-topics``)."""

from __future__ import annotations

import codecs
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from rich import progress as bars

from worker.cli import main as cli
from worker.logs import error_line
from worker.settings import Settings

T = TypeVar("T")

# How much of a file's start decides whether it is JSON lines at all (as grep decides that a
# file is binary from its first buffer): a later line that is not UTF-8 is one bad record.
HEAD_BYTES = 8192


class OutputUnwritableError(Exception):
    """The command's output file cannot be written (a full disk) while it reads topics: the
    file's failure, not the broker's."""


@contextmanager
def _bar(verb: str, *columns: Any, quiet: bool, **fields: Any) -> Iterator[bars.Progress]:
    """A progress bar of one task; cut short (`| head`, Ctrl-C, an error), it is taken off
    the terminal rather than left there half-drawn above the prompt or the error line."""
    progress = bars.Progress(
        bars.TextColumn(verb),
        bars.BarColumn(),
        *columns,
        bars.TimeElapsedColumn(),
        bars.TimeRemainingColumn(),
        console=cli.err_console,
        disable=quiet,
        # The bar draws on stderr; stdout is the command's output (`> out.jsonl`), which a
        # live display would otherwise take over on a terminal and print on stderr.
        redirect_stdout=False,
    )
    with progress:
        progress.add_task(verb, **fields)
        try:
            yield progress
        except BaseException:
            progress.live.transient = True
            raise


def read_lines_with_progress(
    verb: str,
    file: str | None,
    quiet: bool,
    run: Callable[[BinaryIO, Callable[[int, int], None]], T],
) -> T:
    """Open FILE (or stdin for ``-``) and run over it under a progress bar in bytes and lines;
    a FILE that does not exist or cannot be read ends the command. FILE may be a pipe, as
    ``<(zcat traces.jsonl.gz)`` gives (its size is then unknown)."""
    if file in (None, "-"):
        stream, total = sys.stdin.buffer, None
        if sys.stdin.isatty():  # a person who forgot the file would otherwise see nothing
            cli.say("kp-scorer: reading JSONL from stdin (Ctrl-D ends it; give a FILE to read one)")
    else:
        path = Path(file)
        if path.is_dir():
            cli.fail(f"{path} is a directory; give a JSONL file")
        if not path.exists():
            cli.fail(f"no such file: {path}")
        try:
            stream = path.open("rb")
        except OSError as exc:
            cli.fail(f"cannot read {path}: {exc.strerror or exc}")
        total = path.stat().st_size if path.is_file() else None
    columns = (
        bars.DownloadColumn(),
        bars.TransferSpeedColumn(),
        bars.TextColumn("{task.fields[lines]} lines"),
    )
    with stream:
        _refuse_other_files(stream, cli.name_of(file))
        with _bar(verb, *columns, quiet=quiet, total=total, lines=0) as progress:

            def advance(lines: int, size: int) -> None:
                task = progress.tasks[0]
                progress.update(task.id, advance=size, lines=task.fields["lines"] + lines)

            return run(stream, advance)


def first_bad_line(head: bytes) -> str | None:
    """Why the start of a file is not JSON lines, naming its first bad line (1-based), or None.
    JSON text is UTF-8 and never holds a NUL byte (it escapes control characters): a start
    that breaks either is another kind of file (an image, an archive, UTF-16 text). The last
    line of ``head`` may be cut inside a character, which is not held against it."""
    lines = head.split(b"\n")
    for number, line in enumerate(lines, 1):
        try:
            codecs.getincrementaldecoder("utf-8")().decode(line, final=number < len(lines))
        except UnicodeDecodeError:
            return f"line {number} is not UTF-8"
        if b"\0" in line:
            return f"line {number} holds a NUL byte"
    return None


def _refuse_other_files(stream: BinaryIO, name: str) -> None:
    """End the command (exit 2) before anything is written when the input is not UTF-8 JSON
    lines (a binary file): otherwise every line of it became an error line of its own. Looks
    at what the stream holds already, without consuming it. Not judged: a terminal (a person
    typing, whose Ctrl-D a look ahead would take, leaving the read to wait for another) and
    a stream that cannot be peeked (as in tests)."""
    peek = getattr(stream, "peek", None)
    if peek is None or stream.isatty():
        return
    problem = first_bad_line(bytes(peek(HEAD_BYTES)[:HEAD_BYTES]))
    if problem is not None:
        cli.fail(f"{name} is not UTF-8 JSON lines ({problem}); give a JSONL file")


def with_record_progress(
    verb: str,
    settings: Settings,
    run: Callable[[Callable[[int, int | None], None]], T],
    quiet: bool = False,
) -> T:
    """Run a long read of topics under a progress bar; a bad range or an unreachable broker
    ends the command with one line and an exit code (2 and 1) instead of a traceback."""
    from aiokafka.errors import KafkaError

    columns = (
        bars.TextColumn("{task.completed} records"),
        bars.TextColumn("{task.fields[rate]:.1f}/s"),
    )
    started, done = time.monotonic(), 0
    try:
        with _bar(verb, *columns, quiet=quiet, total=None, rate=0.0) as progress:

            def advance(count: int, total: int | None) -> None:
                nonlocal done
                done += count
                rate = done / max(time.monotonic() - started, 1e-9)
                progress.update(progress.task_ids[0], completed=done, total=total, rate=rate)

            return run(advance)
    except ValueError as exc:
        cli.fail(str(exc))
    except OutputUnwritableError as exc:
        cli.fail(str(exc), cli.EXIT_IO_ERROR)
    except (KafkaError, OSError) as exc:
        where = settings.kafka_bootstrap_servers
        cli.fail(f"Kafka unreachable at {where}: {error_line(exc)}", cli.EXIT_UNREACHABLE)
    except KeyboardInterrupt:
        cli.fail(f"interrupted after {done} records", cli.EXIT_INTERRUPTED)
