"""The machine a bench runs on: its description, load, and the CPU time of processes and threads.

Run the benches as scripts from the repository root (``python bench/<name>.py``): this
directory is then on ``sys.path``, so ``import _machine`` works.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine_line() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 2**20
    versions = ", ".join(
        f"{name} {_version(name)}"
        for name in ("onnxruntime", "numpy", "faust-streaming", "aiokafka", "tokenizers")
    )
    return (
        f"{platform.machine()}, {os.cpu_count()} cpus ({model}), {mem_gib:.1f} GiB, "
        f"Python {platform.python_version()}, {versions}"
    )


def cpu_list(text: str) -> set[int]:
    """``0,2-3`` -> {0, 2, 3}, as taskset and /proc's Cpus_allowed_list write CPUs."""
    cpus: set[int] = set()
    for item in text.split(","):
        first, _, last = item.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    unknown = cpus - os.sched_getaffinity(0)
    if unknown:
        raise ValueError(f"CPUs {sorted(unknown)} are not available here")
    return cpus


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Run the block on ``cpus`` (None: where it is): what it starts (a process, a thread,
    an onnxruntime session's threads) inherits the calling thread's CPUs, and keeps them."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(idle, all) CPU seconds of the whole machine since boot, summed over its cores
    (/proc/stat; idle includes waiting for I/O)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return idle / os.sysconf("SC_CLK_TCK"), sum(fields[:8]) / os.sysconf("SC_CLK_TCK")


def thread_schedstats(pid: int | None) -> dict[int, tuple[float, float]]:
    """Per thread of a process: (seconds on a core, seconds runnable but waiting for one),
    from /proc/PID/task/TID/schedstat (empty where the kernel does not keep it)."""
    stats: dict[int, tuple[float, float]] = {}
    if pid is None:
        return stats
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                on_core, waiting, _ = (task / "schedstat").read_text().split()
                stats[int(task.name)] = (int(on_core) / 1e9, int(waiting) / 1e9)
    return stats


def thread_deltas(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    """Per thread of ``after``: (seconds on a core, seconds waiting for one) since ``before``
    (a thread started meanwhile counts from 0)."""
    return {
        tid: (on - before.get(tid, (0.0, 0.0))[0], wait - before.get(tid, (0.0, 0.0))[1])
        for tid, (on, wait) in after.items()
    }


def thread_lines(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]], wall: float
) -> list[str]:
    """The busiest threads' share of the wall time on a core and waiting for one; the rest
    summed. A thread that waits for a core while another of the machine's processes or
    threads holds it is the cost of sharing the cores, not of the thread's own work."""
    deltas = sorted(thread_deltas(before, after).values(), reverse=True)
    if not deltas or wall <= 0:
        return []
    cores = os.cpu_count() or 1
    top, rest = deltas[:cores], deltas[cores:]
    shares = ", ".join(f"{on / wall:.2f} / {wait / wall:.2f}" for on, wait in top)
    return [
        f"  threads (share of the wall time on a core / waiting for one): the {len(top)} "
        f"busiest {shares}; the other {len(rest)} together "
        f"{sum(d[0] for d in rest) / wall:.2f} / {sum(d[1] for d in rest) / wall:.2f}"
    ]


def thread_ms_per_item(
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    main_tid: int | None,
    items: int,
) -> str:
    """Each busy thread's ms on a core per item (a trace), the main thread (the event loop)
    first, then the others by size: where a process's CPU a trace goes."""
    if not items:
        return ""
    ms = {tid: on * 1000 / items for tid, (on, _) in thread_deltas(before, after).items()}
    main = ms.pop(main_tid, 0.0)
    busy = sorted((v for v in ms.values() if v >= 0.05), reverse=True)
    others = ", ".join(f"{v:.2f}" for v in busy)
    quiet = sum(v for v in ms.values() if v < 0.05)
    return f"main thread {main:.2f}; the others {others} (and {quiet:.2f} more)"


def proc_status_kib(pid: int | str, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0
