"""The stream worker under test: its settings, topics, the backlogs produced to it, its outputs.

Run the benches as scripts from the repository root (``python bench/<name>.py``): this
directory is then on ``sys.path``, so ``import _worker`` works.
Nothing here imports the tests; the few pieces needed from them are reimplemented small.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import orjson
from _corpus import Record
from _metrics import scrape
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from worker.dev.process import WorkerProcess
from worker.stream.timing import TIMING_HEADER

PARTITIONS = 4
# Producers batch for the backlog bursts (the test broker is slow one record per request).
BURST_BATCH_BYTES = 512 * 1024


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (as given to --env) -> a dict; the last of a key wins."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        env[key.strip()] = val
    return env


def env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items()) or "shipped settings"


# -- broker and topics -----------------------------------------------------------------------
@dataclass(frozen=True)
class Topics:
    prefix: str

    @property
    def input(self) -> str:
        return f"{self.prefix}.raw"

    @property
    def outputs(self) -> dict[str, str]:
        """output topic -> decision"""
        return {
            f"{self.prefix}.accepted": "accepted",
            f"{self.prefix}.rejected": "rejected",
            f"{self.prefix}.dead-letter": "dead_letter",
        }

    def worker_env(self) -> dict[str, str]:
        by_decision = {d: t for t, d in self.outputs.items()}
        return {
            "KP_INPUT_TOPIC": self.input,
            "KP_ACCEPTED_TOPIC": by_decision["accepted"],
            "KP_REJECTED_TOPIC": by_decision["rejected"],
            "KP_DEAD_LETTER_TOPIC": by_decision["dead_letter"],
            "KP_GROUP_ID": f"{self.prefix}-group",
            "KP_CACHE_STORE_TOPIC": f"{self.prefix}.novelty-cache",
            "KP_INPUT_PARTITIONS": str(PARTITIONS),
        }


async def create_topics(bootstrap: str, topics: Topics, input_partitions: int = PARTITIONS) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(topics.input, input_partitions, 1)]
            + [NewTopic(name, PARTITIONS, 1) for name in topics.outputs]
        )
        errors = [e for e in response.topic_errors if e[1] not in (0, 36)]
        if errors:
            raise RuntimeError(f"create_topics failed: {errors}")
    finally:
        await admin.close()


class Worker(WorkerProcess):
    """``kp-scorer worker`` as a subprocess with KP_* overrides; log in a temp file.

    Settings not overridden are the shipped defaults (``env`` goes on top of this process's
    environment and the bench's topics, metrics port and short group timings).
    """

    def __init__(self, bootstrap: str, **env: str) -> None:
        super().__init__(bootstrap, **{"KP_LOG_LEVEL": "INFO", **env})

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    async def wait_serving(self, timeout: float = 120.0) -> None:
        """Until /metrics answers (the scorer is built then); joining the group comes later."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"worker exited:\n{self.tail()}")
            try:
                await asyncio.to_thread(self.metrics_text)
                return
            except OSError:
                await asyncio.sleep(0.2)
        raise TimeoutError(f"worker did not serve metrics in {timeout} s:\n{self.tail()}")

    def cleanup(self) -> None:
        self.stop(20)
        with contextlib.suppress(OSError):
            self.log_path.unlink()


# -- producing -------------------------------------------------------------------------------
@dataclass
class Sent:
    """A produced record: where it landed and when it was handed to the producer."""

    partition: int
    offset: int
    sent_at: float  # time.time()


async def produce_burst(
    bootstrap: str, topic: str, records: Sequence[Record], spread_over: int | None = None
) -> list[Sent]:
    """All records at once, batched (a backlog); returns once the broker acked them all.

    Partitions follow the keys, or with ``spread_over`` the records go round-robin to that
    many partitions.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        max_batch_size=BURST_BATCH_BYTES,
        max_request_size=2 * BURST_BATCH_BYTES,
        linger_ms=5,
        acks="all",
    )
    await producer.start()
    try:
        futures, times = [], []
        for index, record in enumerate(records):
            partition = None if spread_over is None else index % spread_over
            times.append(time.time())
            futures.append(
                await producer.send(topic, value=record.value, key=record.key, partition=partition)
            )
        results = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return [Sent(m.partition, m.offset, t) for m, t in zip(results, times, strict=True)]


# -- reading outputs -------------------------------------------------------------------------
@dataclass
class Output:
    decision: str
    source: tuple[int, int]  # (partition, offset) of the input record
    timestamp: float  # the output record's CreateTime (set by the worker's producer), seconds
    received_at: float  # time.time() when this process fetched it
    # The record's stages up to publishing, in ms (the kp-timing-ms header of a worker run
    # with KP_TIMING_HEADER=true); None without one.
    timing: dict[str, float] | None = None


@dataclass
class OutputCollector:
    """Reads the three output topics from the beginning in the background, indexed by source."""

    bootstrap: str
    topics: Topics
    by_source: dict[tuple[int, int], Output] = field(default_factory=dict)
    duplicates: int = 0
    _task: asyncio.Task[None] | None = None
    _consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=10,  # receipt times should not wait on the fetch long-poll
        )
        await consumer.start()
        partitions = [TopicPartition(t, p) for t in self.topics.outputs for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        self._consumer = consumer
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            now = time.time()
            for tp, messages in batches.items():
                decision = self.topics.outputs[tp.topic]
                for message in messages:
                    output = Output(
                        decision,
                        _source(decision, message),
                        message.timestamp / 1000,
                        now,
                        _timing(message),
                    )
                    if output.source in self.by_source:
                        self.duplicates += 1
                    else:
                        self.by_source[output.source] = output

    async def wait_for(self, sources: Iterable[tuple[int, int]], timeout: float) -> list[Output]:
        wanted = list(sources)
        deadline = time.monotonic() + timeout
        while True:
            missing = [s for s in wanted if s not in self.by_source]
            if not missing:
                return [self.by_source[s] for s in wanted]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(missing)} of {len(wanted)} outputs missing")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        task, consumer, self._task, self._consumer = self._task, self._consumer, None, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if consumer is not None:
            await consumer.stop()


class OutputCount:
    """How many outputs the worker has had acknowledged (``kp_records_total`` on its /metrics,
    counted after each publish is acknowledged): lets a bench wait for its outputs without
    reading them while the worker runs on the same cores. End offsets would be cheaper still,
    but a broker may answer them per batch rather than per record."""

    def __init__(self, process: Worker) -> None:
        self._worker = process

    async def total(self) -> int:
        samples = scrape(await asyncio.to_thread(self._worker.metrics_text))
        return int(sum(v for (name, _), v in samples.items() if name == "kp_records_total"))

    async def wait_for(
        self,
        count: int,
        timeout: float,
        poll_seconds: float = 1.0,
        still_short: Callable[[], None] | None = None,
    ) -> None:
        """Until the worker has had ``count`` outputs (or more) acknowledged.

        Once a second: rendering /metrics costs the worker ~9 ms of CPU, so polling four times
        a second took ~3.5 % of a core from the run being measured (Prometheus itself scrapes
        every 15-30 s). The rates come from the outputs' timestamps, not from this poll.
        ``still_short`` is called after each poll that found fewer: the worker was still busy.
        """
        deadline = time.monotonic() + timeout
        while await self.total() < count:
            if still_short is not None:
                still_short()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker acknowledged fewer than {count} outputs")
            await asyncio.sleep(poll_seconds)


def _source(decision: str, message: object) -> tuple[int, int]:
    if decision == "dead_letter":
        headers = {k: bytes(v) for k, v in (message.headers or ())}  # type: ignore[attr-defined]
        return int(headers["kp-source-partition"]), int(headers["kp-source-offset"])
    source = orjson.loads(message.value)["source"]  # type: ignore[attr-defined]
    return int(source["partition"]), int(source["offset"])


def _timing(message: object) -> dict[str, float] | None:
    for key, value in message.headers or ():  # type: ignore[attr-defined]
        if key == TIMING_HEADER:
            return {str(k): float(v) for k, v in orjson.loads(value).items()}
    return None


def output_rate(outputs: Sequence[Output], produced_at: float) -> tuple[float, float, float]:
    """(traces/s first->last output, traces/s burst-acked->last output, span s) by broker
    timestamps. First->last counts the records after the first output's millisecond."""
    stamps = sorted(o.timestamp for o in outputs)
    first, last = stamps[0], stamps[-1]
    after_first = sum(1 for s in stamps if s > first)
    span = last - first
    return (after_first / span if span > 0 else 0.0, len(stamps) / (last - produced_at), span)
