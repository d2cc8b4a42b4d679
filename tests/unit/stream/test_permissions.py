"""A permission the broker refuses is one error line naming it, /readyz failing on it while it
lasts, and one line when the refused operation works again (worker/stream/permissions.py).
The broker test is tests/broker/test_security_kafka.py."""

from __future__ import annotations

import logging

import pytest

from worker.stream.health import WorkerHealth
from worker.stream.permissions import Permissions, Refusal

READ_INPUT = Refusal("Read", "topic", "kp.traces.raw")
READ_GROUP = Refusal("Read", "group", "kp-scorer")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name.endswith("permissions")]


def test_a_refusal_is_one_error_line_naming_the_operation_and_the_resource(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="worker")
    permissions = Permissions()
    for _ in range(3):  # asked again and refused again: still one line
        permissions.refused(READ_INPUT)
    assert lines(caplog) == [("ERROR", "not authorized: Read on topic 'kp.traces.raw'")]
    (record,) = caplog.records
    assert (record.operation, record.topic) == ("Read", "kp.traces.raw")  # type: ignore[attr-defined]
    assert permissions.readiness() == "not authorized: Read on topic 'kp.traces.raw'"


def test_what_worked_again_lifts_its_refusal_alone_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="worker")
    permissions = Permissions()
    permissions.refused(READ_INPUT)
    permissions.refused(READ_GROUP)
    assert permissions.readiness() == (
        "not authorized: Read on group 'kp-scorer'; Read on topic 'kp.traces.raw'"
    )
    permissions.granted(READ_GROUP)
    permissions.granted(READ_GROUP)
    permissions.granted(Refusal("Write", "topic", "kp.traces.raw"))  # never refused: nothing
    assert permissions.refusals() == [READ_INPUT]
    assert lines(caplog)[-1] == ("INFO", "authorized: Read on group 'kp-scorer'")
    assert len(lines(caplog)) == 3


def test_a_refusal_seen_within_the_quiet_time_is_not_lifted() -> None:
    clock = Clock()
    permissions = Permissions(clock)
    permissions.refused(READ_INPUT)
    clock.now += 1.0
    permissions.granted(READ_INPUT, quiet_seconds=2.0)
    assert permissions.refusals() == [READ_INPUT]
    clock.now += 1.5
    permissions.granted(READ_INPUT, quiet_seconds=2.0)
    assert permissions.readiness() == "ok"


def test_a_refusal_with_an_alternative_says_it() -> None:
    refusal = Refusal("Write", "topic", "out", "or Create, for the worker to create it")
    assert str(refusal) == "Write on topic 'out' (or Create, for the worker to create it)"


def test_readiness_fails_while_a_permission_is_refused() -> None:
    permissions = Permissions()
    health = WorkerHealth(60.0, permissions=permissions.readiness)
    health.scorer_ready("model", None)
    health.assignment_received()
    assert health.readiness().ok
    permissions.refused(READ_GROUP)
    verdict = health.readiness()
    assert not verdict.ok
    assert verdict.checks["permissions"] == "not authorized: Read on group 'kp-scorer'"
    assert verdict.checks["broker"] == "ok"
    permissions.granted(READ_GROUP)
    assert health.readiness().ok
