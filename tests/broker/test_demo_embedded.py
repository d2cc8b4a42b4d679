"""The embedded broker's smoke tier: ``kp-scorer demo`` as a newcomer runs it (its own embedded
broker, the worker, the sample traces), whichever broker the other tests run against."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker


def test_the_demo_accounts_for_every_record_on_the_embedded_broker() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "demo", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all records accounted for" in result.stdout
    total = re.search(r"total / published\D+(\d+) / (\d+)", result.stdout)
    assert total is not None, result.stdout
    assert total.group(1) == total.group(2) == "56"
    assert "broker ready at 127.0.0.1:" in result.stderr
    # The worker's log (kept for the user to read) holds no error line.
    log = re.search(r"log (\S+kp-scorer-demo-worker-\S+\.log)\)", result.stderr)
    assert log is not None, result.stderr
    lines = Path(log.group(1)).read_text().splitlines()
    errors = [line for line in lines if '"level":"error"' in line]
    assert errors == [], errors
