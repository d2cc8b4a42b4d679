"""Outage logging and connectivity state, on fake clocks: repeated Kafka client errors are
collapsed to one line per distinct error per interval, and broker reachability changes are
logged once each."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from worker.dev.process import free_loopback_port
from worker.io.shutdown import EXIT_DEADLINE, ShutdownDeadline
from worker.logs import RepeatCollapser
from worker.stream.checkpoint import unconfirmed_commits
from worker.stream.connectivity import BrokerHealth
from worker.stream.observer import MetricsObserver


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collapsed():
    clock = Clock()
    handler = Collect()
    handler.addFilter(RepeatCollapser(interval=10, clock=clock))
    loggers = [logging.getLogger(n) for n in ("aiokafka.conn", "worker.test_outage", "kafka")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
    yield clock, handler.records
    for logger in loggers:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def test_repeated_client_errors_become_one_line_per_interval(collapsed) -> None:
    clock, records = collapsed
    log = logging.getLogger("aiokafka.conn")
    for second in range(60):  # 75 errors a second for a minute, from 3 nodes
        clock.now = 1000.0 + second
        for i in range(75):
            log.error("Unable connect to node with id %s: %s", i % 3, "refused")
    clock.now += 10
    logging.getLogger("worker.test_outage").info("broker reachable again")
    messages = [r.getMessage() for r in records]
    assert len(records) <= 60 / 10 + 2, messages
    assert messages[0] == "Unable connect to node with id 0: refused"
    summaries = [r for r in records if getattr(r, "repeated", None)]
    assert summaries and all("repeated" in r.getMessage() for r in summaries)
    assert 1 + sum(r.repeated for r in summaries) == 60 * 75, "every error is counted"
    assert records[-1].getMessage() == "broker reachable again"


def test_distinct_errors_and_other_loggers_are_kept(collapsed) -> None:
    clock, records = collapsed
    client = logging.getLogger("aiokafka.conn")
    ours = logging.getLogger("worker.test_outage")
    for _ in range(5):
        client.error("Unable to update metadata from %s", "n1")
        client.warning("Failed fetch messages from %s: %s", 1, "timeout")
        client.info("informational %s", 1)
        ours.error("our own error")
    assert [r.getMessage() for r in records].count("our own error") == 5
    assert sum("informational" in r.getMessage() for r in records) == 5
    assert sum("update metadata" in r.getMessage() for r in records) == 1
    assert sum("Failed fetch" in r.getMessage() for r in records) == 1
    clock.now += 11
    ours.info("later")  # any record flushes the expired windows' counts
    summaries = {r.getMessage() for r in records if getattr(r, "repeated", None) == 4}
    assert summaries == {
        "Unable to update metadata from n1 (repeated 4 times in the last 11 s)",
        "Failed fetch messages from 1: timeout (repeated 4 times in the last 11 s)",
    }


def test_a_single_error_after_quiet_interval_is_logged_plainly(collapsed) -> None:
    clock, records = collapsed
    log = logging.getLogger("kafka")
    log.warning("once")
    clock.now += 30
    log.warning("once")
    assert [r.getMessage() for r in records] == ["once", "once"]
    assert not any(getattr(r, "repeated", None) for r in records)


def test_broker_health_logs_each_state_change_once_and_times_grow(caplog) -> None:
    clock = Clock()
    health = BrokerHealth(clock=clock, wall_clock=lambda: 1_790_000_000.0)
    observer = MetricsObserver(broker=health)
    caplog.set_level(logging.INFO, logger="worker.stream.connectivity")
    assert health.reachable_value() == 0.0, "not reachable before the broker has answered"
    observer.broker.unreachable(OSError("connection refused"))  # a start-up retry: no line
    clock.now += 3
    observer.broker.fetched()
    assert health.reachable_value() == 1.0
    clock.now += 2
    observer.broker.published()
    assert health.seconds_since_fetch() == 2 and health.seconds_since_publish() == 0
    for _ in range(50):  # every failed probe of a long outage
        clock.now += 2
        observer.broker.unreachable(TimeoutError("probe"))
    assert health.reachable_value() == 0.0
    assert health.seconds_since_fetch() == 102 and health.seconds_since_publish() == 100
    observer.broker.fetched()
    observer.broker.published()
    assert health.reachable_value() == 1.0 and health.seconds_since_fetch() == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "broker unreachable since 2026-09-21T14:13:20+00:00",
        "broker reachable again after 98 s",
    ]
    assert caplog.records[0].error == "TimeoutError: probe"
    assert caplog.records[1].outage_s == 98


def test_a_broker_never_reached_is_unreachable_and_not_ready() -> None:
    clock = Clock()
    health = BrokerHealth(clock=clock)
    observer = MetricsObserver(broker=health)
    observer.health.scorer_ready("model-x", None)
    observer.health.assignment_received()
    assert health.reachable_value() == 0.0
    clock.now += 12
    observer.broker.unreachable(OSError("Connect call failed ('127.0.0.1', 1)"))
    verdict = observer.health.readiness()
    assert not verdict.ok
    assert verdict.checks["broker"] == (
        "never reached for 12 s: OSError: Connect call failed ('127.0.0.1', 1)"
    )
    observer.broker.reached()
    assert health.reachable_value() == 1.0 and observer.health.readiness().ok
    clock.now += 1
    observer.broker.unreachable(TimeoutError("probe"))
    clock.now += 5
    verdict = observer.health.readiness()
    assert not verdict.ok and verdict.checks["broker"] == "unreachable for 5 s: TimeoutError: probe"
    observer.broker.fetched()
    assert observer.health.readiness().checks["broker"] == "ok"


def test_connectivity_gauges_read_the_health_at_scrape_time() -> None:
    from prometheus_client import REGISTRY

    clock = Clock()
    observer = MetricsObserver(broker=BrokerHealth(clock=clock))
    observer.watch()
    observer.broker.unreachable("refused")
    clock.now += 42
    assert REGISTRY.get_sample_value("kp_broker_reachable") == 0.0
    assert REGISTRY.get_sample_value("kp_seconds_since_last_fetch") == 42.0
    assert REGISTRY.get_sample_value("kp_seconds_since_last_publish") == 42.0


def test_shutdown_deadline_exits_when_the_stop_hangs_and_at_once_on_a_second_signal() -> None:
    exits: list[int] = []
    fired = threading.Event()

    def fake_exit(code: int) -> None:
        exits.append(code)
        fired.set()

    deadline = ShutdownDeadline(0.2, exit=fake_exit)
    assert not deadline.started
    deadline.start()
    deadline.start()  # a second start is not a second countdown
    assert fired.wait(5) and exits == [EXIT_DEADLINE]
    time.sleep(0.3)
    assert exits == [EXIT_DEADLINE]

    second = ShutdownDeadline(60, exit=fake_exit)
    second.start()
    second.now("second signal (SIGTERM)")
    assert exits == [EXIT_DEADLINE, EXIT_DEADLINE]


def test_replay_with_an_unreachable_broker_fails_in_one_line() -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_loopback_port()}"}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "replay", "--topic", "t", "--output-prefix", "p"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Kafka unreachable at" in done.stderr and "Traceback" not in done.stderr


def test_a_stop_is_clean_only_when_every_published_offset_is_confirmed_committed() -> None:
    finished = {("in", 0): 10, ("in", 1): 5, ("in", 2): 7}
    committed = {("in", 0): 10, ("in", 1): 4, ("in", 2): None}

    async def from_broker(topic: str, partition: int) -> int | None:
        return committed[(topic, partition)]

    async def unreachable(topic: str, partition: int) -> int | None:
        await asyncio.sleep(60)
        return None

    assert asyncio.run(unconfirmed_commits(finished, from_broker, 1.0)) == [("in", 1), ("in", 2)]
    assert asyncio.run(unconfirmed_commits({("in", 0): 10}, from_broker, 1.0)) == []
    started = time.monotonic()
    assert asyncio.run(unconfirmed_commits(finished, unreachable, 0.2)) == sorted(finished)
    assert time.monotonic() - started < 2, "an unreachable broker costs the timeout, no more"
