"""Returning freed heap memory to the system (glibc keeps it otherwise)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(
            ctypes.util.find_library("c") or "libc.so.6"
        ).malloc_trim
    except (OSError, AttributeError):  # a C library without malloc_trim (musl)
        return None
    return trim


def release_freed_memory() -> None:
    """Hand the free pages of every malloc heap back to the system; a no-op elsewhere.

    glibc keeps what a process freed for later allocations, and the heap only shrinks from its
    top. A worker on a backlog frees a record's buffers in a different order than it took
    them, so its resident size ratchets up. ctypes releases the GIL during the call.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
