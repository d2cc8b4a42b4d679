"""The default number of model runs follows the cores a container may use, not the host's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.settings import Settings, usable_cores

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


def test_a_setting_wins_over_the_cores() -> None:
    assert Settings(embed_concurrency=3).resolved_embed_concurrency == 3
    assert Settings().resolved_embed_concurrency == usable_cores()
