"""The Faust app: the worker's life cycle around its pipeline. A thin shell.

faust runs the process (``kp-scorer worker``: its command line, signals, services); the input
topic is consumed by :class:`~worker.io.group_consumer.GroupConsumer`, aiokafka's own group
consumer, which hands each record to the StreamScorer as it arrives. A record is acknowledged
only after the broker acknowledged its output, so a crash or SIGTERM commits nothing that was
not published. ``faust -A worker.io.app worker`` and ``kp-scorer worker`` both run it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import itertools
import logging
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import faust
from aiokafka.errors import KafkaConnectionError, KafkaError

from worker.core.cache_store import StoreTopic
from worker.core.failures import FailurePolicy
from worker.core.output import output_topics
from worker.core.scorer import build_scorer
from worker.io import http
from worker.io.access import connection_refusal, topic_refusal
from worker.io.group_consumer import GroupConsumer
from worker.io.kafka import PartitionLogReader, TopicNotAuthorized, ensure_topics, stop_all
from worker.io.publisher import Publisher
from worker.io.shutdown import EXIT_DEADLINE, ShutdownDeadline
from worker.io.transactions import TransactionalPublisher
from worker.logs import error_line, logging_config
from worker.memory import release_freed_memory
from worker.retry import backoff
from worker.settings import Settings, load_settings
from worker.stream.checkpoint import CONFIRM_SECONDS, drain_seconds, unconfirmed_commits
from worker.stream.observer import MetricsObserver
from worker.stream.permissions import Refusal
from worker.stream.processor import StreamScorer
from worker.version import __version__

log = logging.getLogger(__name__)

STARTUP_BACKOFF_SECONDS = (1, 2, 4, 8, 15, 30)
# The connectivity probe (metadata, the owned partitions' end offsets): this often, this long.
PROBE_INTERVAL_SECONDS = 2.0
PROBE_TIMEOUT_SECONDS = 3.0
# How often freed heap memory goes back to the system: with 16 full caches after a 20,000-trace
# backlog, median 353 MB (9 runs) against 378 without (12), same speed (bench/live_memory.py).
MEMORY_TRIM_SECONDS = 1.0


class ScorerWorker(faust.Worker):
    """faust's worker with a shutdown deadline: the first SIGTERM/SIGINT starts the usual
    graceful stop and a ``KP_SHUTDOWN_TIMEOUT_SECONDS`` countdown that ends the process if the
    stop hangs (e.g. on a commit to an unreachable broker); a second signal exits at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No terminal spinner: the worker writes JSON lines only, and faust's spinner draws on
        # a terminal's stdout at log level WARNING and up (and lowers the root logger to DEBUG
        # to animate itself on every record).
        self.spinner = None

    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()
        if sys.platform == "win32":
            return
        # mode answers SIGUSR1 by printing every thread's and task's local variables (records'
        # values and keys among them) as plain text on stderr, and SIGUSR2 by starting a
        # debugger on the event loop: neither belongs in a worker whose log is JSON lines that
        # never hold a record.
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            self.loop.add_signal_handler(signum, _signal_ignored, signum)

    def _schedule_shutdown(self, signal: Any) -> None:
        deadline: ShutdownDeadline = self.app.shutdown_deadline  # type: ignore[attr-defined]
        if deadline.started:
            deadline.now(f"second signal ({getattr(signal, 'name', signal)})")
            return
        deadline.start()
        self.app.observer.health.stopping()  # type: ignore[attr-defined]
        super()._schedule_shutdown(signal)

    def stop_and_shutdown(self) -> None:
        # faust calls this from a `finally`: an exception in flight is a start that failed
        # (logged as "Error: ..."; the process exits 1), which is no clean stop.
        start_failed = sys.exc_info()[1] is not None
        super().stop_and_shutdown()
        if self.app.left_uncommitted:  # type: ignore[attr-defined]
            raise SystemExit(EXIT_DEADLINE)
        if start_failed:
            return
        # The last line of a clean stop: nothing is left for the next worker to redo.
        log.info("stopped; every published record is committed", extra={"exit_code": 0})


def _signal_ignored(signum: signal.Signals) -> None:
    log.warning("signal ignored", extra={"signal": signum.name})


class ScorerApp(faust.App):
    """faust.App that prepares topics and owns the scorer's Kafka clients: faust's own consumer
    and producer are never started (the worker's are :class:`GroupConsumer` and
    :class:`Publisher`)."""

    class BootStrategy(faust.app.BootStrategy):
        enable_kafka = False

    def __init__(self, settings: Settings, metrics_listener: socket.socket | None = None) -> None:
        self.scorer_settings = settings
        # The metrics port, bound before the app starts (``kp-scorer worker`` does it, so that a
        # busy port ends the start in one line), or at start-up.
        self.metrics_listener = metrics_listener
        super().__init__(
            settings.group_id,
            broker=[f"kafka://{s.strip()}" for s in settings.kafka_bootstrap_servers.split(",")],
            web_enabled=False,
            datadir=_data_directory(settings.group_id),
            logging_config=logging_config(settings.log_level, settings.log_repeat_interval_seconds),
            Worker=ScorerWorker,
        )
        self.shutdown_deadline = ShutdownDeadline(settings.shutdown_timeout_seconds)
        self.observer = MetricsObserver(
            settings.latency_budget_seconds, stall_seconds=settings.health_stall_seconds
        )
        # A publish failure stops the worker; a broker that does not answer is counted.
        self.failures = FailurePolicy(self._scoring_failed, self.observer.broker.unreachable)
        self.stream_scorer: StreamScorer | None = None
        self.left_uncommitted: list[tuple[str, int]] = []
        self._publisher: Publisher | None = None
        # Exactly-once only: the publisher, which owns each partition's transaction.
        self.transactions: TransactionalPublisher | None = None
        self._reader: PartitionLogReader | None = None
        self._http: http.OpsServer | None = None
        self._periodic: list[asyncio.Future[None]] = []
        self.group: GroupConsumer | None = None

    async def on_first_start(self) -> None:
        await super().on_first_start()
        settings = self.scorer_settings
        observer = self.observer
        observer.watch()
        # Probes get answers from the start: alive while loading, ready once scoring can begin.
        if self.metrics_listener is not None:
            self._http = http.OpsServer(self.metrics_listener, observer.health).start()
        else:
            self._http = http.serve(settings.metrics_port, observer.health)
        # The loop's tick is /healthz's; freed memory is returned off the loop.
        trim = functools.partial(asyncio.to_thread, release_freed_memory)
        self._periodic = [
            asyncio.ensure_future(every(observer.health.tick_seconds, observer.health.loop_ticked)),
            asyncio.ensure_future(every(MEMORY_TRIM_SECONDS, trim)),
        ]
        observer.configured_thresholds(settings.accept_threshold, settings.domain_thresholds)
        store = await _wait_for_kafka(settings, observer, self.failures)
        scorer = await asyncio.to_thread(build_scorer, settings)
        observer.configured(__version__, scorer.model_id)
        if not scorer.has_embedder:
            log.warning(
                "embedder unavailable; novelty is 0.5", extra={"reason": scorer.embedder_reason}
            )
        if settings.processing_guarantee == "exactly_once":
            self.transactions = TransactionalPublisher(settings, observer=observer, store=store)
            self._publisher = self.transactions
        else:
            self._publisher = Publisher(settings, observer=observer, store=store)
        self._reader = PartitionLogReader(settings, group_id=settings.group_id)
        await self._publisher.start()
        await self._reader.start()
        self.stream_scorer = StreamScorer(
            scorer,
            self._reader,
            self._publisher,
            settings.max_in_flight_records,
            failures=self.failures,
            observer=observer,
            timing_header=settings.timing_header,
            store=store,
        )
        self.group = GroupConsumer(
            settings, self.stream_scorer, observer, self._scoring_failed, self.transactions
        )
        await self.group.start()
        self._periodic.append(asyncio.ensure_future(every(PROBE_INTERVAL_SECONDS, self._probe)))
        observer.embedder_loaded(scorer.model_id, scorer.embedder_reason)
        log.info(
            "scorer ready",
            extra={
                "input_topic": settings.input_topic,
                "group_id": settings.group_id,
                "model": scorer.model_id,
                "metrics_port": settings.metrics_port,
                "idempotent_publishing": self._publisher.idempotent,
                "processing_guarantee": settings.processing_guarantee,
            },
        )

    async def _probe(self) -> None:
        """Connectivity for logs and metrics, also while no records arrive."""
        assert self.stream_scorer is not None and self._reader is not None
        try:
            held = self.stream_scorer.partitions.held()
            ends = await self._reader.probe(held, PROBE_TIMEOUT_SECONDS)
        except (TimeoutError, KafkaError, OSError) as exc:
            self.failures.consumer_failed(exc)
        else:
            self.observer.broker.fetched()
            self.observer.lag.log_ends(ends)

    def _scoring_failed(self, exc: BaseException) -> None:
        """A record could not be scored or published: exit rather than idle with a gap (the
        record and everything after it is redelivered to the next worker)."""
        self.loop.create_task(self.crash(exc))

    async def on_stop(self) -> None:
        # Before the consumer's last commit (which covers only acknowledged records): finish
        # what is in the pipeline, so that no record is published after that commit and
        # delivered again to the next worker.
        self.observer.health.stopping()
        if self.group is not None:
            await self.group.stop_fetching()
        if self.stream_scorer is not None:
            await self.stream_scorer.close(
                drain_seconds(self.scorer_settings.shutdown_timeout_seconds)
            )
        if self.group is not None:
            await self.group.stop()
        await super().on_stop()

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        if self.stream_scorer is not None:  # closed by on_stop unless it was built after that
            await self.stream_scorer.stop()
            self.stream_scorer.scorer.close()
        if self._reader is not None:
            self.left_uncommitted = await unconfirmed_commits(
                self.observer.lag.finished_positions(), self._reader.committed, CONFIRM_SECONDS
            )
            if self.left_uncommitted:
                log.warning(
                    "stopped with published records whose offsets are not committed; they will "
                    "be redelivered",
                    extra={"partitions": self.left_uncommitted, "exit_code": EXIT_DEADLINE},
                )
        await stop_all(self._reader, self._publisher)
        for task in self._periodic:
            task.cancel()
        if self._http is not None:
            self._http.shutdown()


def _data_directory(group_id: str) -> Path:
    """faust's data directory (it stores nothing there with the memory store), one per group.
    Named by a digest: a group id may be any string, and faust would take a ``/`` in it for a
    directory that does not exist, and braces for a format field."""
    digest = hashlib.sha256(group_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"kp-scorer-{digest}"


async def every(seconds: float, action: Callable[[], Awaitable[None] | None]) -> None:
    """Run ``action`` (awaited if it is a coroutine) now, then every ``seconds``."""
    while True:
        if inspect.isawaitable(result := action()):
            await result
        await asyncio.sleep(seconds)


async def _wait_for_kafka(
    settings: Settings, observer: MetricsObserver, failures: FailurePolicy
) -> StoreTopic | None:
    """Create topics, retrying with backoff until reachable, with one clear log line per try
    (the broker unreachable, or refusing its certificate's trust or the credentials), and until
    the user may use them (one line per permission refused, :mod:`worker.stream.permissions`);
    the broker counts as reached (``kp_broker_reachable``) once it answers."""
    outputs = list(output_topics(settings).values())
    delays = backoff(STARTUP_BACKOFF_SECONDS)
    refused: Refusal | None = None
    for attempt in itertools.count(1):
        delay = next(delays)
        try:
            _, store = await ensure_topics(settings, outputs)
            observer.broker.reached()
            if refused is not None:
                observer.permissions.granted(refused)
            return store
        except TopicNotAuthorized as exc:
            observer.broker.reached()  # it answered: a refusal, not an outage
            topic = topic_refusal(settings, exc.topic)
            if refused is not None and refused != topic:
                observer.permissions.granted(refused)  # granted: the next topic was refused
            refused = topic
            observer.permissions.refused(refused)
        except (KafkaError, OSError) as exc:
            refusal = None
            if isinstance(exc, KafkaConnectionError):  # the reason is in aiokafka's own line
                refusal = await connection_refusal(settings)
            if refusal is None:
                failures.consumer_failed(exc)
            else:
                observer.broker.unreachable(str(refusal))
            log.error(
                "%s; retrying",
                "Kafka unreachable" if refusal is None else refusal.problem,
                extra={
                    "bootstrap_servers": settings.kafka_bootstrap_servers,
                    "error": error_line(exc) if refusal is None else refusal.error,
                    **({"check": refusal.check} if refusal is not None else {}),
                    "retry_in_s": delay,
                    "attempt": attempt,
                },
            )
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def create_app(
    settings: Settings | None = None, metrics_listener: socket.socket | None = None
) -> ScorerApp:
    settings = settings or load_settings()
    app = ScorerApp(settings, metrics_listener)
    return app


def __getattr__(name: str) -> Any:
    """``faust -A worker.io.app`` finds ``app``: built from the environment on first access."""
    if name == "app":
        globals()["app"] = created = create_app()
        return created
    raise AttributeError(name)
