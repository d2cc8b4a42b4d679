"""The worker's malloc settings, checked in a process of their own (they are process-wide)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Counts glibc's mapped blocks (mallinfo2().hblks) after a large block was freed and a
# smaller large one taken: glibc serves the second from its heap once the first freed block
# has raised the threshold, unless the threshold is fixed.
PROBE = textwrap.dedent(
    """
    import ctypes, sys

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "fixed":
        from worker.memory import keep_large_blocks_mapped
        keep_large_blocks_mapped()
    libc.free(libc.malloc(24 << 20))
    before = libc.mallinfo2().hblks
    block = libc.malloc(4 << 20)
    print(libc.mallinfo2().hblks - before)
    libc.free(block)
    """
)


def mapped_blocks_taken(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_large_blocks_stay_mapped_after_a_larger_one_was_freed() -> None:
    try:
        adaptive = mapped_blocks_taken("adaptive")
    except subprocess.CalledProcessError as exc:  # no glibc 2.33+ (mallinfo2)
        pytest.skip(f"cannot read glibc's allocator: {exc.stderr.strip()[-200:]}")
    assert adaptive == 0  # glibc's default: the freed 24 MiB block raised the threshold
    assert mapped_blocks_taken("fixed") == 1
