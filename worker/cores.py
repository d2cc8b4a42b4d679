"""The cores this process may run on, which size the embedder's default number of model runs."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores(
    cgroup_root: Path = Path("/sys/fs/cgroup"), own_cgroup: Path = Path("/proc/self/cgroup")
) -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset),
    capped by its cgroup CPU quota, v2 or v1, rounded up (``docker run --cpus``, a Kubernetes
    CPU limit). ``os.cpu_count()`` counts the host's: 64 model runs in a 2-CPU container share
    two cores and each holds its own buffers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    try:
        own = own_cgroup.read_text().splitlines()
    except OSError:  # not Linux
        return cores
    for quota in (_v2_quota(cgroup_root, own), _v1_quota(cgroup_root, own)):
        if quota is not None:
            cores = min(cores, max(1, math.ceil(quota)))
    return cores


def _v2_quota(cgroup_root: Path, own: list[str]) -> float | None:
    """Cores of cgroup v2's ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD": none)."""
    # "0::/kubepods/.../cri-containerd-..." ("0::/" inside a cgroup namespace)
    path = next((line[4:] for line in own if line.startswith("0::/")), None)
    if path is None:
        return None
    try:
        quota, period = (cgroup_root / path / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ArithmeticError):  # no limit file (the root cgroup), garbled
        return None


def _v1_quota(cgroup_root: Path, own: list[str]) -> float | None:
    """Cores of cgroup v1's ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``, in
    the cpu controller's hierarchy ("4:cpu,cpuacct:/docker/ID"). A container sees that
    hierarchy mounted at its own cgroup: its files lie at the mount's top, not under the
    path."""
    for line in own:
        controllers, _, path = line.partition(":")[2].partition(":")
        if "cpu" not in controllers.split(","):
            continue
        mount = cgroup_root / "cpu"
        for folder in (mount / path.lstrip("/"), mount):
            try:
                quota = int((folder / "cpu.cfs_quota_us").read_text())
                period = int((folder / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):  # not this folder, garbled
                continue
            return None if quota < 0 or period <= 0 else quota / period
        return None
    return None
