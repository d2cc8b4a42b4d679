"""Lag computed when read, liveness and readiness from stamps, and the endpoints serving them."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import orjson
import pytest
from prometheus_client import REGISTRY, generate_latest

from worker.core.errors import ERROR_KINDS
from worker.dev.process import free_loopback_port
from worker.io import http
from worker.stream import metrics
from worker.stream.health import WorkerHealth
from worker.stream.lag import Lag, PartitionLag
from worker.stream.observer import MetricsObserver
from worker.stream.timing import RecordTiming

TP = ("in", 0)


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_lag_grows_while_nothing_is_finished_and_is_zero_when_caught_up() -> None:
    clock = Clock()
    lag = PartitionLag(clock)
    lag.assigned([TP, ("in", 1)])
    assert lag.snapshot() == [], "unknown until position and log end are known"
    lag.started(TP, 10)
    lag.log_ends({TP: 10, ("other", 0): 99})
    assert lag.snapshot() == [Lag("in", 0, 0, 0.0)]
    clock.now += 5
    lag.log_ends({TP: 14})  # four records arrive; none is finished
    clock.now += 7
    assert lag.snapshot() == [Lag("in", 0, 4, 12.0)], "behind since it was last caught up"
    clock.now += 30
    assert lag.snapshot() == [Lag("in", 0, 4, 42.0)], "a stuck partition keeps growing"
    lag.finished(TP, 10, timestamp_ms=1_020_000)
    assert lag.snapshot() == [Lag("in", 0, 3, 22.0)], "now minus the last finished record's time"
    for offset in (11, 12, 13):
        lag.finished(TP, offset, timestamp_ms=1_030_000)
    assert lag.snapshot() == [Lag("in", 0, 0, 0.0)]


def test_lag_of_a_backlog_found_on_assignment_and_of_revoked_partitions() -> None:
    clock = Clock(1_800_000_000.0)  # an hour before it is after 1970
    lag = PartitionLag(clock)
    lag.assigned([TP])
    lag.started(TP, 0)
    lag.log_ends({TP: 500})
    clock.now += 3
    assert lag.snapshot() == [Lag("in", 0, 500, 3.0)], "at least as long as it has owned it"
    lag.finished(TP, 0, timestamp_ms=int((clock.now - 3_600) * 1000))
    assert lag.snapshot()[0].seconds == 3_600, "an hour-old backlog shows an hour"
    lag.started(TP, None)
    assert lag.snapshot() == [], "a forgotten partition is not reported until it restarts"
    lag.assigned([])
    lag.started(TP, 0)
    assert lag.snapshot() == [], "partitions not owned are ignored"


def test_a_timestamp_ahead_of_the_clock_counts_as_now_and_is_reported() -> None:
    clock = Clock()
    lag = PartitionLag(clock)
    lag.assigned([TP])
    lag.started(TP, 0)
    lag.log_ends({TP: 1})
    hour_ahead = int((clock.now + 3_600) * 1000)
    assert lag.finished(TP, 0, timestamp_ms=hour_ahead) is True
    assert lag.snapshot() == [Lag("in", 0, 0, 0.0)]
    clock.now += 2
    lag.log_ends({TP: 4})  # three records arrive and wait
    clock.now += 10
    assert lag.snapshot() == [Lag("in", 0, 3, 12.0)], "behind since the hour-ahead one was scored"
    assert lag.finished(TP, 1, timestamp_ms=int((clock.now - 5) * 1000)) is False
    assert lag.snapshot() == [Lag("in", 0, 2, 5.0)], "the next record's real time counts"
    clock.now += 3
    assert lag.finished(TP, 2, timestamp_ms=int((clock.now + 0.5) * 1000)) is False, (
        "a clock half a second fast is within tolerance"
    )
    clock.now += 4
    assert lag.snapshot() == [Lag("in", 0, 1, 4.0)], "and still counts as now"


def test_the_observer_counts_future_timestamps() -> None:
    from prometheus_client import REGISTRY

    from worker.core.errors import EmptyMessageError
    from worker.core.output import dead_letter
    from worker.core.records import SourceRecord

    def counted() -> float:
        return REGISTRY.get_sample_value("kp_future_timestamps_total") or 0.0

    observer = MetricsObserver()
    observer.partitions_assigned([TP])
    before = counted()
    for ahead_s, offset in ((3_600, 0), (0, 1), (-60, 2)):
        ts = int((time.time() + ahead_s) * 1000)
        record = SourceRecord("in", 0, offset, ts, None, None)
        routed = dead_letter(record, EmptyMessageError("empty"))
        observer.record_published(routed, RecordTiming(0.0, 0.0, ts), False, None)
    assert counted() - before == 1


def test_a_record_without_a_timestamp_counts_as_none_in_lag_and_latency() -> None:
    """Kafka reads a record that has no timestamp (from a producer of the old message format)
    as -1: no moment to measure from, not one in 1970."""
    from prometheus_client import REGISTRY

    from worker.core.errors import EmptyMessageError
    from worker.core.output import dead_letter
    from worker.core.records import SourceRecord

    clock = Clock()
    lag = PartitionLag(clock)
    lag.assigned([TP])
    lag.started(TP, 0)
    lag.log_ends({TP: 3})
    clock.now += 4
    assert lag.finished(TP, 0, timestamp_ms=-1) is False
    assert lag.snapshot() == [Lag("in", 0, 2, 4.0)], "behind since its assignment"

    def observed(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    fetch = ("kp_stage_latency_seconds_count", {"stage": "fetch"})
    before = [observed("kp_end_to_end_latency_seconds_count"), observed(*fetch)]
    observer = MetricsObserver()
    record = SourceRecord("in", 0, 0, -1, None, None)
    routed = dead_letter(record, EmptyMessageError("empty"))
    timing = RecordTiming.received_at(time.monotonic(), -1)
    assert "fetch" not in dict(timing.stages())
    assert b"fetch" not in timing.header()[1]
    observer.record_published(routed, timing, False, None)
    assert [observed("kp_end_to_end_latency_seconds_count"), observed(*fetch)] == before


def test_a_lone_offset_no_record_fills_stops_counting_as_waiting() -> None:
    """A transaction's commit marker takes the last offset: one behind, for good."""
    clock = Clock()
    lag = PartitionLag(clock)
    lag.assigned([TP])
    lag.started(TP, 0)
    lag.log_ends({TP: 5})
    lag.finished(TP, 3, timestamp_ms=999_000)
    assert lag.records_waiting(settled_after=60) == 1, "the last record may still come"
    clock.now += 61
    assert lag.records_waiting(settled_after=60) == 0
    assert lag.snapshot()[0].records == 1, "the lag itself still shows it"
    lag.log_ends({TP: 7})
    assert lag.records_waiting(settled_after=60) == 3, "new records count at once"


@pytest.mark.parametrize("stall_seconds", [0.6, 1.5, 3.0])
def test_a_running_event_loop_is_live_at_any_stall_setting(stall_seconds: float) -> None:
    """The loop must tick well within a third of KP_HEALTH_STALL_SECONDS, however short."""
    from worker.io.app import every

    observer = MetricsObserver(stall_seconds=stall_seconds)

    async def sample() -> list[str]:
        health = observer.health
        ticker = asyncio.ensure_future(every(health.tick_seconds, health.loop_ticked))
        checks = []
        for _ in range(30):
            await asyncio.sleep(0.05)
            checks.append(observer.health.liveness().checks["event_loop"])
        ticker.cancel()
        return checks

    checks = asyncio.run(sample())
    assert set(checks) == {"ok"}, checks


def test_liveness_fails_when_records_wait_and_nothing_moves() -> None:
    clock = Clock()
    waiting = [0]
    health = WorkerHealth(60, records_waiting=lambda: waiting[0], clock=clock)
    clock.now += 300
    health.loop_ticked()
    assert health.liveness().ok, "idle with nothing waiting is healthy"
    waiting[0] = 5
    verdict = health.liveness()
    assert not verdict.ok and "5 records waiting" in verdict.checks["consume_loop"]
    health.progress(in_pipeline=1)
    assert health.liveness().ok
    clock.now += 59
    health.loop_ticked()
    assert health.liveness().ok
    clock.now += 2
    health.loop_ticked()
    assert not health.liveness().ok, "in the pipeline and not finished for over a minute"
    health.progress(rebuilding=1)
    assert health.liveness().ok, "a cache rebuild in progress is progress"
    health.progress(rebuilding=-1)
    health.progress(in_pipeline=-1)
    waiting[0] = 0
    assert health.liveness().ok


def test_liveness_fails_when_the_event_loop_stops_ticking() -> None:
    clock = Clock()
    health = WorkerHealth(60, clock=clock)
    clock.now += 19
    assert health.liveness().ok
    clock.now += 2
    verdict = health.liveness()
    assert not verdict.ok and verdict.checks["event_loop"] == "no tick for 21 s"


def test_readiness_needs_the_scorer_and_an_assignment_and_not_stopping() -> None:
    health = WorkerHealth(60)
    assert not health.readiness().ok
    health.scorer_ready(None, "KP_MODEL_PATH missing")
    assert not health.readiness().ok
    health.assignment_received()
    verdict = health.readiness()
    assert verdict.ok, "running without a model as configured is ready"
    assert verdict.checks["scorer"].startswith("none (")
    health.stopping()
    assert not health.readiness().ok


def test_every_dead_letter_kind_is_exported_once_the_worker_is_configured() -> None:
    """KpScorerInternalErrors reads increase(kp_dead_letters_total{kind="internal"}[15m]); a
    series first exported at 1 shows no increase, so the first internal error since a start
    would raise no alert unless the series was there, at 0, before it."""
    MetricsObserver().configured("9.9.9", "model-x")
    for kind in ERROR_KINDS:
        assert REGISTRY.get_sample_value("kp_dead_letters_total", {"kind": kind}) is not None, kind


def test_endpoints_answer_from_the_health_state_and_lag_is_exported_at_scrape_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http, "METRICS_MAX_AGE_SECONDS", 0.0)  # each scrape sees the change
    observer = MetricsObserver(stall_seconds=60)
    observer.watch()
    observer.configured_thresholds(0.7, {"finance": 0.8})
    observer.configured("9.9.9", "model-x")
    observer.partitions_assigned([TP])
    observer.lag.started(TP, 3)
    observer.lag.log_ends({TP: 8})
    port = free_loopback_port()
    server = http.serve(port, observer.health, host="127.0.0.1")
    assert server is not None
    try:

        def get(path: str) -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()

        status, body = get("/readyz")
        assert status == 503 and orjson.loads(body)["checks"]["scorer"] == "starting"
        observer.embedder_loaded("model-x", None)
        status, body = get("/readyz")
        assert status == 503 and orjson.loads(body)["checks"]["broker"].startswith("never reached")
        assert "kp_broker_reachable 0.0" in get("/metrics")[1].decode()
        observer.broker.reached()
        assert get("/readyz")[0] == 200
        assert "kp_broker_reachable 1.0" in get("/metrics")[1].decode()
        assert get("/healthz")[0] == 200
        status, body = get("/metrics")
        text = body.decode()
        assert status == 200
        assert 'kp_consumer_lag_records{partition="0",topic="in"} 5.0' in text
        assert 'kp_build_info{model="model-x",version="9.9.9"} 1.0' in text
        assert "kp_accept_threshold 0.7" in text
        assert 'kp_domain_accept_threshold{domain="finance"} 0.8' in text
        assert "kp_latency_budget_seconds 0.1" in text
        assert get("/nope")[0] == 404
    finally:
        server.shutdown()
        metrics.consumer_lag.source = None
    assert b"kp_consumer_lag_records{" not in generate_latest()


def test_paused_partitions_are_counted_once_and_cleared_by_a_new_assignment() -> None:
    from prometheus_client import REGISTRY

    def paused() -> float | None:
        return REGISTRY.get_sample_value("kp_fetch_paused_partitions")

    def pauses() -> float:
        return REGISTRY.get_sample_value("kp_fetch_pauses_total") or 0.0

    observer = MetricsObserver()
    observer.partitions_assigned([("in", 0), ("in", 1)])
    before = pauses()
    observer.fetching_paused(("in", 0), True)
    observer.fetching_paused(("in", 0), True)  # faust reports a full buffer again: one pause
    observer.fetching_paused(("in", 1), True)
    assert (paused(), pauses() - before) == (2.0, 2.0)
    observer.fetching_paused(("in", 0), False)
    assert paused() == 1.0
    # A rebalance: the Kafka client starts every newly assigned partition fetching.
    observer.partitions_assigned([("in", 1)])
    assert paused() == 0.0
    observer.fetching_paused(("in", 1), False)  # faust's late drop callback changes nothing
    assert (paused(), pauses() - before) == (0.0, 2.0)


def test_the_port_answers_head_gzip_and_refuses_what_is_not_a_get() -> None:
    import gzip
    import socket

    port = free_loopback_port()
    server = http.serve(port, WorkerHealth(60), host="127.0.0.1")
    assert server is not None

    def exchange(request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(request)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    try:
        head, _, body = exchange(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
        ).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Encoding: gzip" in head
        assert b"kp_broker_reachable" in gzip.decompress(body)
        answer = exchange(b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"\r\n\r\n")
        assert exchange(b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
        assert exchange(b"hello\r\n\r\n").startswith(b"HTTP/1.1 400")
        too_long = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (http.MAX_REQUEST_HEAD_BYTES + 10)
        assert exchange(too_long + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    finally:
        server.shutdown()
