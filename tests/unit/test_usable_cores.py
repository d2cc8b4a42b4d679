"""The default number of model runs follows the cores a container may use, not the host's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.cores import usable_cores
from worker.settings import Settings

AFFINITY = len(os.sched_getaffinity(0))


def cgroup(tmp_path: Path, cpu_max: str | None, own: str = "0::/kubepods/pod1/c1\n") -> int:
    (tmp_path / "cgroup").write_text(own)
    if cpu_max is not None:
        limits = tmp_path / "fs" / "kubepods" / "pod1" / "c1"
        limits.mkdir(parents=True)
        (limits / "cpu.max").write_text(cpu_max)
    return usable_cores(tmp_path / "fs", tmp_path / "cgroup")


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", AFFINITY),  # no limit
        ("50000 100000\n", 1),  # half a core still runs one model
        ("100000 100000\n", 1),
        ("150000 100000\n", min(AFFINITY, 2)),  # rounded up
        (f"{64 * 100000} 100000\n", AFFINITY),  # a quota above the cpuset: the cpuset
        (None, AFFINITY),  # no cpu.max (the root cgroup)
        ("garbled", AFFINITY),
    ],
)
def test_a_cgroup_cpu_quota_caps_the_cores(
    tmp_path: Path, cpu_max: str | None, expected: int
) -> None:
    assert cgroup(tmp_path, cpu_max) == expected


def test_cgroup_v1_only_leaves_the_affinity(tmp_path: Path) -> None:
    assert cgroup(tmp_path, "50000 100000\n", own="4:memory:/x\n1:cpu:/\n") == AFFINITY


def cgroup_v1(
    tmp_path: Path, quota: str, folder: str = "kubepods/pod1/c1", period: str = "100000\n"
) -> int:
    """A cgroup v1 process in /kubepods/pod1/c1 with its CPU quota in ``folder`` of the cpu
    hierarchy (what a container sees as its own cgroup: the mount's top, "")."""
    (tmp_path / "cgroup").write_text(
        "12:memory:/kubepods/pod1/c1\n4:cpu,cpuacct:/kubepods/pod1/c1\n1:name=systemd:/\n"
    )
    limits = tmp_path / "fs" / "cpu" / folder
    limits.mkdir(parents=True)
    (limits / "cpu.cfs_quota_us").write_text(quota)
    (limits / "cpu.cfs_period_us").write_text(period)
    return usable_cores(tmp_path / "fs", tmp_path / "cgroup")


@pytest.mark.parametrize(
    ("quota", "folder", "expected"),
    [
        ("-1\n", "kubepods/pod1/c1", AFFINITY),  # no limit
        ("50000\n", "kubepods/pod1/c1", 1),  # half a core still runs one model
        ("150000\n", "kubepods/pod1/c1", min(AFFINITY, 2)),  # rounded up
        (f"{64 * 100000}\n", "kubepods/pod1/c1", AFFINITY),  # above the cpuset: the cpuset
        ("100000\n", "", 1),  # inside the container: its own cgroup at the mount's top
        ("garbled", "kubepods/pod1/c1", AFFINITY),
    ],
)
def test_a_cgroup_v1_cpu_quota_caps_the_cores(
    tmp_path: Path, quota: str, folder: str, expected: int
) -> None:
    """A 2-CPU container on a cgroup v1 host ran as many model runs as the host has cores."""
    assert cgroup_v1(tmp_path, quota, folder) == expected


def test_a_zero_cgroup_v1_period_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_v1(tmp_path, "100000\n", period="0\n") == AFFINITY


def test_a_setting_wins_over_the_cores() -> None:
    assert Settings(embed_concurrency=3).resolved_embed_concurrency == 3
    assert Settings().resolved_embed_concurrency == usable_cores()
