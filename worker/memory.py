"""Returning freed heap memory to the system (glibc keeps it otherwise)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = getattr(
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name
        )
    except (OSError, AttributeError):  # a C library without it (musl has no malloc_trim)
        return None
    return function


def release_freed_memory() -> None:
    """Hand the free pages of every malloc heap back to the system; a no-op elsewhere.

    glibc keeps what a process freed for later allocations, and the heap only shrinks from its
    top. A worker on a backlog frees a record's buffers in a different order than it took
    them, so its resident size ratchets up. ctypes releases the GIL during the call.
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value


def keep_large_blocks_mapped() -> None:
    """Give every block over 128 KiB a mapping of its own for the life of the process.

    glibc raises that threshold to the size of each large block freed (up to 32 MiB), so
    after the model is loaded, blocks of many megabytes come from the heaps instead, where
    they strand pages trimming cannot return: a worker then stayed ~30 MiB larger in some
    starts and not others. A fixed threshold made it start the same size every time, with
    no loss of speed (bench/RESULTS.md). Other C libraries ignore it.
    """
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
