"""The embedded broker's start-up failures, with a stand-in binary (no broker package needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.dev import embedded_broker


def test_a_broker_that_exits_at_start_up_is_reported_with_its_status_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "broker"
    binary.write_text("#!/bin/sh\necho 'no storage engine here'\nexit 3\n")
    binary.chmod(0o755)
    monkeypatch.setattr(embedded_broker, "_broker_binary", lambda: str(binary))
    broker = embedded_broker.EmbeddedBroker()

    with pytest.raises(embedded_broker.BrokerStartError) as failed:
        broker.start(timeout=10)

    assert "exited during start-up with status 3" in str(failed.value)
    assert "no storage engine here" in str(failed.value)
    assert not broker.is_running() and broker.log_path is None  # nothing left behind
