"""The license ships with the package, and retries back off with jitter.

- LICENSE holds the Apache-2.0 text verbatim, beside NOTICE; both are the package's license
  files, in its wheel's metadata (``License-File``) and in its sdist, and in the image build.
- Every retry loop waits a jittered step of its schedule, never longer than the step, so
  replicas that failed together do not retry together.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from worker.retry import JITTER, backoff

from support.paths import REPO

# sha256 of the Apache License 2.0 as apache.org publishes it (LICENSE-2.0.txt), which
# Debian ships as /usr/share/common-licenses/Apache-2.0.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_is_the_apache_2_0_text_verbatim() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    debian = Path("/usr/share/common-licenses/Apache-2.0")
    if debian.is_file():
        assert text == debian.read_bytes()


def test_license_files_are_declared_and_built_into_the_image() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE", "NOTICE"]
    copied = [
        line.split()[1:-1]
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY pyproject.toml")
    ]
    assert copied and {"LICENSE", "NOTICE"} <= set(copied[0])


@pytest.mark.timeout(300)
def test_the_wheel_carries_license_and_notice(tmp_path: Path) -> None:
    """Built as the image builds it (pip, an isolated build environment)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "worker", source / "worker", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copytree(REPO / "schemas", source / "schemas")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=280,
    )
    if built.returncode != 0 and "No matching distribution" in built.stderr:
        pytest.skip(f"no build backend to be had here: {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("kp_scorer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = archive.read(metadata).decode().splitlines()
        dist_info = metadata.rsplit("/", 1)[0]
        shipped = archive.read(f"{dist_info}/licenses/LICENSE")
    assert "License-File: LICENSE" in fields
    assert "License-File: NOTICE" in fields
    assert f"{dist_info}/licenses/NOTICE" in names
    assert shipped == (REPO / "LICENSE").read_bytes()


# --- backoff ------------------------------------------------------------------------------

SCHEDULE = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


def first(count: int, delays: object) -> list[float]:
    return [next(delays) for _ in range(count)]  # type: ignore[call-overload]


def test_each_wait_is_within_its_step_and_never_longer() -> None:
    steps = [*SCHEDULE, *[SCHEDULE[-1]] * 14]
    waits = first(len(steps), backoff(SCHEDULE, uniform=random.Random(7).random))
    for wait, step in zip(waits, steps, strict=True):
        assert step * (1 - JITTER) <= wait <= step


def test_the_extremes_of_the_random_source_are_the_bounds() -> None:
    assert first(3, backoff(SCHEDULE, uniform=lambda: 0.0)) == [1.0, 2.0, 4.0]
    lowest = first(3, backoff(SCHEDULE, uniform=lambda: 1.0))
    assert lowest == [s * (1 - JITTER) for s in SCHEDULE[:3]]


def test_replicas_do_not_retry_in_lockstep() -> None:
    """Ten replicas that lost the broker at the same moment: their waits spread over the
    jitter range, step after step, instead of all retrying at the same moments."""
    replicas = [
        first(10, backoff(SCHEDULE, uniform=random.Random(seed).random)) for seed in range(10)
    ]
    for attempt in range(10):
        waits = sorted(replica[attempt] for replica in replicas)
        step = SCHEDULE[min(attempt, len(SCHEDULE) - 1)]
        assert len(set(waits)) == len(waits), "no two replicas wait the same"
        assert waits[-1] - waits[0] >= step * JITTER / 3, "spread over the jitter range"
    # Moments of the retries (sums of the waits) differ as well.
    third_retry = sorted(sum(replica[:3]) for replica in replicas)
    assert third_retry[-1] - third_retry[0] >= 1.0


def test_the_same_seed_gives_the_same_waits() -> None:
    one = first(8, backoff(SCHEDULE, uniform=random.Random(42).random))
    two = first(8, backoff(SCHEDULE, uniform=random.Random(42).random))
    assert one == two


def test_no_jitter_is_the_schedule_itself() -> None:
    assert first(8, backoff(SCHEDULE, jitter=0.0)) == [*SCHEDULE, 30.0, 30.0]


@pytest.mark.parametrize("jitter", [-0.1, 1.5])
def test_a_jitter_outside_0_1_is_refused(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        next(backoff(SCHEDULE, jitter=jitter))


def test_an_empty_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one delay"):
        next(backoff(()))
