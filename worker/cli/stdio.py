"""The command's standard streams when the shell closed one (``>&-``), or when their reader
went away (``| head``): each ends in one line from ``main``, never a traceback."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import NoReturn


class _ClosedStream(io.TextIOBase):
    """Stdin or stdout that the shell closed (``>&-``, ``<&-``): Python leaves None in their
    place, on which the first read or write fails with an AttributeError; this fails with the
    OSError that ``main`` ends in one line. Flushing it is io.IOBase's no-op (nothing is
    held), and it is no terminal (IOBase's isatty)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _closed(self, *args: object) -> NoReturn:
        raise OSError(errno.EBADF, f"{self._name} is closed")

    read = readline = write = fileno = _closed  # type: ignore[assignment]
    buffer = property(_closed)


def stand_in_for_closed_streams() -> None:
    if sys.stdin is None:
        sys.stdin = _ClosedStream("stdin")
    if sys.stdout is None:
        sys.stdout = _ClosedStream("stdout")


def discard_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone (``| head``), so that the flush at
    interpreter exit does not fail a second time with an "Exception ignored" message."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (tests capture it): nothing to flush
        pass
