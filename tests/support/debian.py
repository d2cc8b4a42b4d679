"""Programs the tests take from Debian's packages, none of which PyPI has: the Prometheus
server from ``prometheus`` (fetched with ``apt-get download`` and extracted, nothing installed
system-wide) and the headless browser from ``chromium`` (installed with ``apt-get install``
where it is missing, which a root CI machine allows).

Downloads are cached in ``/tmp/kp-scorer-test-cache`` (``TEST_CACHE_DIR`` overrides), so a
machine fetches each package once. Where a program cannot be had, the test is skipped and
says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("TEST_CACHE_DIR") or "/tmp/kp-scorer-test-cache")
APT_TIMEOUT_SECONDS = 600.0


def runs(program: Path, *args: str) -> bool:
    """The program starts and answers ``args`` (``--version`` by default) with status 0."""
    try:
        result = subprocess.run(
            [str(program), *(args or ("--version",))],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def apt_get(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``apt-get ARGS``, waiting for apt's locks: tests in parallel processes may fetch
    packages at the same time."""
    deadline = time.monotonic() + APT_TIMEOUT_SECONDS
    while True:
        result = subprocess.run(
            ["apt-get", "-q", "-o", f"DPkg::Lock::Timeout={int(APT_TIMEOUT_SECONDS)}", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=APT_TIMEOUT_SECONDS,
            check=False,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        locked = result.returncode != 0 and "Could not get lock" in result.stderr
        if not locked or time.monotonic() > deadline:
            return result
        time.sleep(5)


def _with_fresh_lists(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``apt-get ARGS``; when that fails, as root, once more after ``apt-get update`` (a fresh
    machine's package lists may not know the package yet)."""
    result = apt_get(*args, cwd=cwd)
    if result.returncode != 0 and os.geteuid() == 0 and apt_get("update").returncode == 0:
        result = apt_get(*args, cwd=cwd)
    return result


def extract_file(deb: Path, member_path: str, target: Path) -> None:
    """Copy one file out of a .deb (streamed through dpkg-deb; nothing installed)."""
    command = ["dpkg-deb", "--fsys-tarfile", str(deb)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as deb_tar:
        assert deb_tar.stdout is not None
        with tarfile.open(fileobj=deb_tar.stdout, mode="r|") as archive:
            for member in archive:
                if member.name == member_path and member.isfile():
                    source = archive.extractfile(member)
                    assert source is not None
                    with target.open("wb") as out:
                        shutil.copyfileobj(source, out)
                    target.chmod(0o755)
                    return  # dpkg-deb stops on the closed pipe; the rest is not needed
    raise RuntimeError(f"{deb.name} has no {member_path} (dpkg-deb: {deb_tar.returncode})")


def debian_program(package: str, name: str, env_var: str) -> Path:
    """``/usr/bin/NAME`` of Debian's ``package``, or ``pytest.skip`` saying why none can be had.

    First found: the ``env_var`` environment variable (a path), a copy cached by an earlier
    run, or the package fetched with ``apt-get download`` and the program alone extracted.
    The PATH is not searched: a system-wide install may be another version.
    """
    if os.environ.get(env_var):
        explicit = Path(os.environ[env_var])
        if not runs(explicit):
            pytest.fail(f"{env_var}={explicit} does not run")
        return explicit
    cached = CACHE / package / name
    if runs(cached):
        return cached
    missing = [tool for tool in ("apt-get", "dpkg-deb") if not shutil.which(tool)]
    if missing:
        pytest.skip(
            f"{name} not found ({env_var}, {cached}), and no {' or '.join(missing)} to fetch it "
            f"from Debian's {package} package"
        )
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as scratch:
        result = _with_fresh_lists("download", package, cwd=Path(scratch))
        debs = sorted(Path(scratch).glob(f"{package}_*.deb"))
        if result.returncode != 0 or not debs:
            pytest.skip(f"apt-get download {package} failed: {result.stderr.strip()[-500:]}")
        partial = Path(scratch) / name
        try:
            extract_file(debs[0], f"./usr/bin/{name}", partial)
        except (RuntimeError, OSError, tarfile.TarError) as exc:
            pytest.skip(f"cannot extract {name} from Debian's {package}: {exc}")
        if not runs(partial):
            pytest.skip(f"the {name} of Debian's {package} package does not run here")
        os.replace(partial, cached)  # atomic: a concurrent run sees all of it or nothing
    return cached


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def headless_browser() -> Path:
    """A Chromium that runs headless (``CHROMIUM`` overrides), installed from Debian's
    ``chromium`` package where none is on the PATH; or ``pytest.skip`` saying why not."""
    if os.environ.get("CHROMIUM"):
        explicit = Path(os.environ["CHROMIUM"])
        if not runs(explicit):
            pytest.fail(f"CHROMIUM={explicit} does not run")
        return explicit
    for name in BROWSERS:
        found = shutil.which(name)
        if found and runs(Path(found)):
            return Path(found)
    if not shutil.which("apt-get"):
        pytest.skip("no Chromium on the PATH, and no apt-get to install Debian's chromium")
    if os.geteuid() != 0:
        pytest.skip("no Chromium on the PATH; installing Debian's chromium needs root")
    result = _with_fresh_lists("install", "-y", "--no-install-recommends", "chromium")
    found = shutil.which("chromium")
    if result.returncode != 0 or not found:
        pytest.skip(f"apt-get install chromium failed: {result.stderr.strip()[-500:]}")
    return Path(found)
