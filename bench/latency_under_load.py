"""Per-trace latency of the stream worker under paced load: p50/p95/p99 and the 100 ms budget.

    python bench/latency_under_load.py [--quick] [--config NAME:KEY=VALUE,KEY=VALUE ...]
                                       [--env KEY=VALUE ...] [--rate R] [--loads 0.25,0.5,0.8]
                                       [--per-phase N] [--max-rate-records N]
                                       [--arrivals poisson|even] [--repeat-texts]
                                       [--others-cpus LIST]
                                       [--broker embedded|kafka | --bootstrap HOST:PORT]

On the embedded broker (Apache Kafka with --broker kafka, started on loopback as the tests
start it, or the broker --bootstrap names), one `kp-scorer worker` subprocess per
configuration, each on its own 4-partition topics, all started up front (an idle worker costs
next to nothing). A configuration is a name and the settings its worker runs with, e.g.
`--config default:` (the shipped settings; the default) or `--config
conc1:KP_EMBED_CONCURRENCY=1`; --env settings apply to every worker, under the
configuration's own.

First each worker's max rate is measured as in bench/worker_throughput.py (a backlog,
first to last output timestamp). Then a paced producer sends at 25 %, 50 % and 80 % (--loads)
of the first configuration's max rate (or --rate), one phase per load and configuration,
--per-phase traces each (default 2,000, so that a phase's p99 is its 20th-slowest trace: at
600 the same code's worker / simulated ratio ranged 1.12-1.80 between runs), draining
between phases; every load level runs each configuration in turn, rotating the order, at
the same absolute rates.
Arrivals are Poisson by default (exponential gaps, fixed seed: bursts happen, as in a real
fleet) or evenly spaced with --arrivals even. Records are sent one at a time (linger 0), each
stamped with its send time. Texts are unique (every trace costs one model run) unless
--repeat-texts.

Per phase, from deltas of the worker's own /metrics:
- worker latency: kp_trace_latency_seconds (receipt by the worker -> broker ack of the
  output); breaches = share over 100 ms, exact (0.1 s is a bucket boundary);
- end to end: kp_end_to_end_latency_seconds (the record's timestamp, i.e. its send time ->
  broker ack of the output: includes the producer, the broker and the consumer's fetch);
- quantiles are interpolated inside buckets as Prometheus' histogram_quantile does;
- mean pipeline depth (kp_batch_size: records in the pipeline when one enters, itself
  included), embeddings reused (identical text seen before: no model run), mean
  embed_wait (for a model thread), embed (the model run) and publish stage times;
- CPU seconds of the worker, the broker and this process (the load generator: producer,
  /metrics polls), from /proc/PID/stat, over the phase's sending and acknowledgements.
And exactly, per record, by this process: "send->stamp", send time -> output record
timestamp (set by the worker's producer; 1 ms resolution; the fetch included, the output's
ack not: its mean is the publish stage above).

Per record (the workers run with KP_TIMING_HEADER=true: each output carries its stages up to
publishing in its kp-timing-ms header), the slowest 5 % of traces by send->stamp, with the
mean ms of each stage (fetch = send -> the worker's receipt; "rest" = what send->stamp holds
beyond the stages, the stamp's 1 ms resolution), beside the mean of all traces. Publish (the
broker's ack) comes after the stamp: its mean over all traces is the /metrics one above.

The model alone on the same arrivals: before the max rates, this process measures the
model as bench/budget_floor.py does (each example text alone on one thread and as shipped, and
a backlog's rate; --sim-repeats timings per text) while the workers idle; each phase's send
times then run through budget_floor's fluid model of the embedder as shipped (each trace's
work is its example text's), and the ratio, send->stamp p99 / simulated p99, says how much
of the worker's p99 the model alone accounts for on those arrivals (1.0: all of it). The
machine's speed drifts by 5-10 % within minutes, so the model alone's CPU a text is also
measured just before and just after each phase (the worker idle) and the simulation runs at
that speed (the ratio against the speed at the start is printed beside it). The ratio is
taken from the exact send->stamp, not from the histogram: between its 250 and 500 ms bounds
the histogram's p99 is interpolated, and in 20 phases of 2026-11-30 it read 1.01-1.46x the
exact one (the "hist" column: 1.71 against 1.20 at half load in one run).

Pinned apart (Linux): `--others-cpus 2,3` runs this process (the load generator) and the
broker on those CPUs, and a configuration's `CPUS=0-1` (a bench key, not a worker setting)
runs its worker on its own, e.g. `--others-cpus 2,3 --config apart:CPUS=0-1 --config
shared:CPUS=2,3` compares a worker alone on two cores with one sharing them with the broker
and the load generator, in one run. The model alone is measured on the first configuration's
CPUs.

Target, at 50 % load: worker p99 <= 100 ms, end-to-end p99 <= 150 ms and breaches < 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import _corpus
import _machine
import _metrics
import _worker
import budget_floor
import numpy as np
from _metrics import BUDGET_SECONDS, fmt_ms
from aiokafka import AIOKafkaProducer

from worker.dev.embedded_broker import EmbeddedBroker
from worker.settings import Settings
from worker.stream.timing import STAGES

# Apache Kafka is started by the tests' launcher (tests/support/apache_kafka.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.apache_kafka import ApacheKafka

WARMUP_RECORDS = 24
MODEL_TEXTS = 50  # texts of each measurement of the model alone
TARGET_LOAD = 0.5
TARGET_P99 = 0.1
TARGET_E2E_P99 = 0.15
TARGET_BREACHES = 0.01
SLOWEST_SHARE = 0.05
# The stages of the kp-timing-ms header, in pipeline order (publish comes after the stamp).
HEADER_STAGES = tuple(stage for stage in STAGES if stage != "publish")
WAITS = ("decode_wait", "embed_wait", "order_wait")
# Settings in a --config are separated by commas that start a new KEY=, so a value may
# itself contain commas (a JSON object, say).
_SETTING_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_]*=)")


@dataclass
class Config:
    name: str
    env: dict[str, str]
    topics: _worker.Topics = field(
        default_factory=lambda: _worker.Topics(f"bench-lat-{uuid.uuid4().hex[:8]}")
    )
    cpus: set[int] | None = None  # where its worker runs (None: anywhere)
    worker: _worker.Worker | None = None
    count: _worker.OutputCount | None = None
    acknowledged: int = 0  # outputs the worker has had acknowledged so far (its count)
    max_rate: float = 0.0


@dataclass
class Phase:
    config: str
    load: float
    rate: float
    sent: int
    achieved_rate: float
    worker: _metrics.Histogram
    e2e: _metrics.Histogram
    breaches_counter: float
    send_to_stamp: list[float]
    depth: float
    reused: float
    embed_wait_ms: float
    embed_ms: float
    publish_ms: float
    worker_cores: float
    load_average: str
    cpu_seconds: dict[str, float]  # worker, broker, load generator (this process)
    threads: str  # the worker's CPU a trace, thread by thread
    wall_seconds: float
    breakdown: list[str]  # the slowest traces' stages, and all traces'
    # The model alone as shipped on the phase's arrivals, at its speed just before and after
    # the phase, and at its speed when first measured.
    simulated_p99: float | None
    simulated_p99_at_start: float | None
    # CPU ms a text: around the phase (the mean), at the start, just before, just after
    model_ms: tuple[float, float, float, float] | None
    # The same with each run as long as the worker's CPU a trace (its other threads' work
    # spread over its runs), and that CPU a trace against the model's.
    simulated_at_worker_cpu: tuple[float, float, float] | None


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` -> (name, settings); ``NAME:`` runs the shipped settings."""
    name, _, settings = text.partition(":")
    if not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME:KEY=VALUE,..., got {text!r}")
    items = [item for item in _SETTING_SPLIT.split(settings) if item.strip()]
    try:
        return name.strip(), _worker.parse_env(items)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def paced(
    bootstrap: str,
    config: Config,
    records: list[_corpus.Record],
    rate: float,
    arrivals: str,
    seed: int,
) -> tuple[list[_worker.Sent], float]:
    """Send records at ``rate`` per second; returns what was sent and the achieved rate."""
    rng = np.random.default_rng(seed)
    gaps = (
        rng.exponential(1 / rate, size=len(records))
        if arrivals == "poisson"
        else np.full(len(records), 1 / rate)
    )
    gaps[0] = 0.0
    due = np.cumsum(gaps)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    await producer.start()
    try:
        futures, times = [], []
        started = time.monotonic()
        for record, at in zip(records, due, strict=True):
            wait = started + at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            times.append(time.time())
            futures.append(
                await producer.send(
                    config.topics.input,
                    value=record.value,
                    key=record.key,
                    timestamp_ms=int(times[-1] * 1000),
                )
            )
        elapsed = time.monotonic() - started
        results = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    sent = [_worker.Sent(m.partition, m.offset, t) for m, t in zip(results, times, strict=True)]
    return sent, (len(records) - 1) / elapsed if elapsed > 0 else 0.0


async def wait_acknowledged(config: Config, sent: list[_worker.Sent], timeout: float) -> None:
    """Until the worker has had ``sent``'s outputs acknowledged (its own count on /metrics).

    Reading the output topics while the worker runs (a consumer polling 12 partitions every
    10 ms) took the broker and this process ~0.3 of the 2 cores the worker runs on: outputs
    are read only afterwards (``read_outputs``).
    """
    assert config.count is not None
    await config.count.wait_for(config.acknowledged + len(sent), timeout=timeout)
    config.acknowledged += len(sent)


async def read_outputs(
    bootstrap: str, config: Config, sent: list[_worker.Sent]
) -> list[_worker.Output]:
    collector = _worker.OutputCollector(bootstrap, config.topics)
    await collector.start()
    try:
        return await collector.wait_for([(s.partition, s.offset) for s in sent], timeout=60)
    finally:
        await collector.stop()


async def measure_max_rate(bootstrap: str, config: Config, count: int, unique_texts: bool) -> float:
    records = _corpus.corpus(count, f"max-{uuid.uuid4().hex[:6]}", unique_texts)
    sent = await _worker.produce_burst(bootstrap, config.topics.input, records)
    produced = time.time()
    await wait_acknowledged(config, sent, timeout=60 + count)
    outputs = await read_outputs(bootstrap, config, sent)
    rate, _, _ = _worker.output_rate(outputs, produced)
    return rate


def measure_model(count: int, repeats: int) -> budget_floor.Engine:
    """The model as shipped, as bench/budget_floor.py measures it, on one text per example
    (a phase's trace i embeds example i mod count, made unique by a few characters)."""
    texts = [record.text for record in _corpus.corpus(count, f"sim-{uuid.uuid4().hex[:6]}")]
    engine, shipped = budget_floor.measure_engine("model", texts, repeats)
    shipped.close()
    return engine


def model_reference(cpu: set[int] | None) -> Callable[[int], float]:
    """The embedder as shipped, loaded on ``cpu``; the function gives its CPU ms a text over
    ``count`` new texts, one at a time. The machine's speed drifts by 5-10 % within minutes
    here, so each phase is held against the model measured just before and just after it."""
    from worker.embedding import EmbedderConfig, load_embedder

    with _machine.pinned(cpu):  # the model's thread, started by the first run, stays there
        embedder, why = load_embedder(EmbedderConfig.from_settings(Settings()))
        if embedder is None:
            raise SystemExit(f"the model did not load: {why}")
        embedder.embed([r.text for r in _corpus.corpus(4, "warm")])

    def measure(count: int) -> float:
        texts = [r.text for r in _corpus.corpus(count, f"model-{uuid.uuid4().hex[:6]}")]
        before = time.process_time()
        for text in texts:
            embedder.submit([text]).result()
        return (time.process_time() - before) * 1000 / count

    return measure


def simulated_p99(
    engine: budget_floor.Engine, sent: list[_worker.Sent], scale: float = 1.0
) -> float:
    """p99 of the fluid model of the embedder as shipped, fed the phase's send times, each
    run's work multiplied by ``scale``."""
    times = np.array([s.sent_at for s in sent])
    examples = np.arange(len(sent)) % len(engine.work)
    response = budget_floor.as_shipped(
        times - times[0],
        engine.work[examples] * scale,
        engine.alone_speed[examples],
        engine.side_by_side,
        engine.slots,
    )
    return float(np.percentile(response, 99))


def simulated_at_worker_cpu(
    engine: budget_floor.Engine, sent: list[_worker.Sent], worker_cpu_seconds: float
) -> tuple[float, float, float]:
    """(p99, worker CPU ms a trace, model CPU ms a trace): the fluid model with every run
    stretched by the worker's CPU a trace over the model's. Whatever the worker spends beyond
    its runs (Kafka clients, decoding, publishing, polling the broker) takes the model's core
    away from them; where the worker's p99 is close to this p99, its tail is that CPU, not
    waits of the pipeline's making. The p99 grows faster than the CPU (bench/RESULTS.md)."""
    examples = np.arange(len(sent)) % len(engine.work)
    model = float(engine.work[examples].mean())
    worker = worker_cpu_seconds / len(sent)
    return simulated_p99(engine, sent, worker / model), worker * 1000, model * 1000


def breakdown_lines(
    outputs: list[_worker.Output],
    sent: list[_worker.Sent],
    engine: budget_floor.Engine | None = None,
) -> list[str]:
    """Mean ms per stage of the slowest traces by send->stamp, and of all traces; with the
    model measured, what their texts' runs take alone (one thread, and as shipped)."""
    rows = [
        ((o.timestamp - s.sent_at) * 1000, index, o.timing)
        for index, (o, s) in enumerate(zip(outputs, sent, strict=True))
        if o.timing is not None
    ]
    if not rows:
        return ["    no kp-timing-ms headers on the outputs (KP_TIMING_HEADER off?)"]
    rows.sort(key=lambda row: row[0], reverse=True)
    slowest = rows[: max(1, math.ceil(SLOWEST_SHARE * len(rows)))]

    def line(label: str, chosen: list[tuple[float, int, dict[str, float]]]) -> str:
        means = {
            stage: sum(timing.get(stage, 0.0) for _, _, timing in chosen) / len(chosen)
            for stage in HEADER_STAGES
        }
        total = sum(row[0] for row in chosen) / len(chosen)
        rest = total - sum(means.values())
        waits = sum(means[stage] for stage in WAITS)
        model = means["tokenize"] + means["embed"]
        stages = " ".join(f"{stage} {ms:.1f}" for stage, ms in means.items())
        text = (
            f"    {label}: {stages} rest {rest:.1f} = {total:.1f} ms; of it waits "
            f"{waits / total:.0%}, model {model / total:.0%}, fetch {means['fetch'] / total:.0%}"
        )
        if engine is not None:
            examples = [index % len(engine.work) for _, index, _ in chosen]
            text += (
                f"; their texts alone: {engine.work[examples].mean() * 1000:.1f} ms on one "
                f"thread, {engine.alone[examples].mean() * 1000:.1f} as shipped"
            )
        return text

    return [
        line(
            f"slowest {SLOWEST_SHARE:.0%} ({len(slowest)} of {len(rows)}, send->stamp >= "
            f"{slowest[-1][0]:.0f} ms) mean ms",
            slowest,
        ),
        line("all traces mean ms", rows),
    ]


async def run_phase(
    bootstrap: str,
    config: Config,
    load: float,
    rate: float,
    args: argparse.Namespace,
    seed: int,
    broker_pid: int | None,
    engine: budget_floor.Engine | None,
    model: tuple[Callable[[int], float], float] | None = None,
) -> Phase:
    assert config.worker is not None
    records = _corpus.corpus(
        args.per_phase, f"p{seed}-{uuid.uuid4().hex[:6]}", not args.repeat_texts
    )
    # the model alone just before and just after the phase, while the worker idles
    model_before = None if model is None else await asyncio.to_thread(model[0], MODEL_TEXTS)
    before = _metrics.scrape(await asyncio.to_thread(config.worker.metrics_text))
    pids = {"worker": config.worker.pid, "broker": broker_pid, "load generator": os.getpid()}
    cpu_before = {name: _machine.cpu_seconds(pid) for name, pid in pids.items()}
    threads_before = _machine.thread_schedstats(config.worker.pid)
    wall_before = time.monotonic()
    load_average = _machine.load_average()
    sent, achieved = await paced(bootstrap, config, records, rate, args.arrivals, seed)
    await wait_acknowledged(config, sent, timeout=60 + args.per_phase)
    wall = time.monotonic() - wall_before
    cpu = {name: _machine.cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    threads = _machine.thread_ms_per_item(
        threads_before, _machine.thread_schedstats(config.worker.pid), config.worker.pid, len(sent)
    )
    cores = cpu["worker"] / wall
    model_ms = None
    if model is not None and model_before is not None:
        model_after = await asyncio.to_thread(model[0], MODEL_TEXTS)
        model_ms = (model_before + model_after) / 2, model[1], model_before, model_after
    await asyncio.sleep(0.5)  # metrics are observed right after the broker's acks
    diff = _metrics.delta(
        _metrics.scrape(await asyncio.to_thread(config.worker.metrics_text)), before
    )
    outputs = await read_outputs(bootstrap, config, sent)
    entered = _metrics.value(diff, "kp_batch_size_count")

    def mean_ms(stage: str) -> float:
        count = _metrics.value(diff, "kp_stage_latency_seconds_count", stage=stage)
        total = _metrics.value(diff, "kp_stage_latency_seconds_sum", stage=stage)
        return total / count * 1000 if count else 0.0

    return Phase(
        config=config.name,
        load=load,
        rate=rate,
        sent=len(sent),
        achieved_rate=achieved,
        worker=_metrics.histogram(diff, "kp_trace_latency_seconds"),
        e2e=_metrics.histogram(diff, "kp_end_to_end_latency_seconds"),
        breaches_counter=_metrics.value(diff, "kp_budget_breaches_total"),
        send_to_stamp=[o.timestamp - s.sent_at for o, s in zip(outputs, sent, strict=True)],
        depth=_metrics.value(diff, "kp_batch_size_sum") / entered if entered else 0.0,
        reused=_metrics.value(diff, "kp_embeddings_reused_total"),
        embed_wait_ms=mean_ms("embed_wait"),
        embed_ms=mean_ms("embed"),
        publish_ms=mean_ms("publish"),
        worker_cores=cores,
        load_average=load_average,
        cpu_seconds=cpu,
        threads=threads,
        wall_seconds=wall,
        breakdown=breakdown_lines(outputs, sent, engine),
        simulated_p99=(
            None
            if engine is None
            else simulated_p99(engine, sent, 1.0 if model_ms is None else model_ms[0] / model_ms[1])
        ),
        simulated_p99_at_start=None if engine is None else simulated_p99(engine, sent),
        model_ms=model_ms,
        simulated_at_worker_cpu=(
            None if engine is None else simulated_at_worker_cpu(engine, sent, cpu["worker"])
        ),
    )


async def run(args: argparse.Namespace, configs: list[Config]) -> list[Phase]:
    broker: EmbeddedBroker | ApacheKafka | None = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = ApacheKafka() if args.broker == "kafka" else EmbeddedBroker()
        broker.start()
        bootstrap = broker.bootstrap_servers
    broker_pid = None if broker is None else broker.pid
    unique = not args.repeat_texts
    phases: list[Phase] = []
    try:
        for config in configs:
            await _worker.create_topics(bootstrap, config.topics)
            # Each output carries its stages (kp-timing-ms), read back per record.
            env = {
                "KP_TIMING_HEADER": "true",
                **(broker.worker_settings if isinstance(broker, EmbeddedBroker) else {}),
                **config.env,
            }
            config.worker = _worker.Worker(bootstrap, **{**config.topics.worker_env(), **env})
            with _machine.pinned(config.cpus):
                config.worker.start()
        for config in configs:
            assert config.worker is not None
            await config.worker.wait_serving()
            config.count = _worker.OutputCount(config.worker)
            warm = await _worker.produce_burst(
                bootstrap, config.topics.input, _corpus.corpus(WARMUP_RECORDS, "warm", unique)
            )
            await wait_acknowledged(config, warm, 180)
        engine, model = None, None
        if not (args.no_simulation or args.repeat_texts):  # repeated texts run no model
            examples = [line for line in _corpus.EXAMPLES.read_bytes().splitlines() if line.strip()]
            with _machine.pinned(configs[0].cpus):
                engine = measure_model(len(examples), args.sim_repeats)
            print(
                f"the model alone (as bench/budget_floor.py measures it, workers idle): one "
                f"thread {engine.work.mean() * 1000:.1f} ms/text, as shipped alone "
                f"{engine.alone.mean() * 1000:.1f} ms, backlog {engine.max_rate:.1f} texts/s",
                flush=True,
            )
            meter = model_reference(configs[0].cpus)
            model = meter, meter(MODEL_TEXTS)
            print(f"the model alone's CPU a text, the phases' reference: {model[1]:.1f} ms")
        for config in configs:
            config.max_rate = await measure_max_rate(
                bootstrap, config, args.max_rate_records, unique
            )
            print(
                f"max rate [{config.name}]: {config.max_rate:.1f} traces/s "
                f"({args.max_rate_records}-trace backlog; load average {_machine.load_average()})",
                flush=True,
            )
        reference = args.rate or configs[0].max_rate
        print(f"paced rates are fractions of {reference:.1f} traces/s ({args.arrivals} arrivals)")
        seed = 0
        for level, load in enumerate(args.loads):
            shift = level % len(configs)
            for config in configs[shift:] + configs[:shift]:
                seed += 1
                phase = await run_phase(
                    bootstrap, config, load, load * reference, args, seed, broker_pid, engine, model
                )
                phases.append(phase)
                print_phase(phase)
    finally:
        for config in configs:
            if config.worker is not None:
                config.worker.cleanup()
        if broker is not None:
            broker.stop()
    return phases


def quantiles_ms(h: _metrics.Histogram) -> str:
    return " ".join(fmt_ms(h.quantile(q)) for q in (0.5, 0.95, 0.99))


def print_phase(phase: Phase) -> None:
    h, e2e = phase.worker, phase.e2e
    stamp = _metrics.percentiles(phase.send_to_stamp)
    print(
        f"[{phase.config}] load {phase.load:.0%}: {phase.sent} traces at {phase.rate:.2f}/s "
        f"(achieved {phase.achieved_rate:.2f}/s), mean pipeline depth {phase.depth:.2f}, "
        f"reused {phase.reused:.0f}, "
        f"embed_wait {phase.embed_wait_ms:.0f} embed {phase.embed_ms:.0f} "
        f"publish {phase.publish_ms:.0f} ms/trace, worker {phase.worker_cores:.2f} cores, "
        f"load average {phase.load_average}\n"
        f"    CPU s over {phase.wall_seconds:.1f} s: "
        + ", ".join(f"{name} {seconds:.2f}" for name, seconds in phase.cpu_seconds.items())
        + f"\n    the worker's CPU ms a trace by thread: {phase.threads}\n"
        f"    worker      p50/p95/p99 ms {quantiles_ms(h)}   over 100 ms "
        f"{h.share_above(BUDGET_SECONDS):6.1%} ({phase.breaches_counter:.0f}/{h.count:.0f})\n"
        f"    end to end  p50/p95/p99 ms {quantiles_ms(e2e)}   over 150 ms "
        f"{e2e.share_above(TARGET_E2E_P99):6.1%}   (send->stamp p50/p95/p99 "
        f"{' '.join(fmt_ms(s).strip() for s in stamp)})",
        flush=True,
    )
    print("\n".join(phase.breakdown), flush=True)
    if phase.simulated_p99 is not None and phase.simulated_p99_at_start is not None:
        if phase.model_ms is not None:
            now, start, before, after = phase.model_ms
            print(
                f"    the model alone just before and after the phase: {before:.1f} and "
                f"{after:.1f} CPU ms a text ({now / start:.3f}x its {start:.1f} at the start); "
                f"the worker's CPU a trace "
                f"{phase.cpu_seconds['worker'] * 1000 / phase.sent / now:.3f}x that",
                flush=True,
            )
        print(
            f"    send->stamp p99 / simulated p99 (the model alone as shipped, same arrivals, "
            f"at its speed around the phase): {fmt_ms(stamp[2]).strip()} / "
            f"{fmt_ms(phase.simulated_p99).strip()} ms = {stamp[2] / phase.simulated_p99:.2f} "
            f"(at its speed at the start: {stamp[2] / phase.simulated_p99_at_start:.2f}; the "
            f"histogram's p99 / it: {h.quantile(0.99) / phase.simulated_p99:.2f})",
            flush=True,
        )
    if phase.simulated_at_worker_cpu is not None:
        sim, worker_ms, model_ms = phase.simulated_at_worker_cpu
        print(
            f"    the same with runs as long as the worker's CPU a trace ({worker_ms:.1f} ms "
            f"against the model's {model_ms:.1f}): simulated p99 {fmt_ms(sim).strip()} ms, "
            f"send->stamp p99 / it = {stamp[2] / sim:.2f}",
            flush=True,
        )


def print_summary(phases: list[Phase], loads: list[float]) -> None:
    print(
        "summary (ms; worker breach = share over 100 ms, e2e breach = share over 150 ms; "
        "depth = mean pipeline depth; sim p99 = the model alone as shipped on the phase's "
        "arrivals at its speed around the phase; ratio = send->stamp p99 / sim p99; start = "
        "the same against the model at its speed at the start; hist = the worker histogram's "
        "p99 / sim p99)"
    )
    print(
        f"  {'config':<16} {'load':>5} {'rate/s':>7} {'depth':>6} {'reused':>6} | "
        f"{'worker p50':>10} {'p95':>6} {'p99':>6} {'breach':>7} | "
        f"{'e2e p50':>8} {'p95':>6} {'p99':>6} {'breach':>7} | {'stamp p99':>9} {'sim p99':>7} "
        f"{'ratio':>5} {'start':>5} {'hist':>5}"
    )
    for p in phases:
        h, e = p.worker, p.e2e
        stamp_p99 = _metrics.percentiles(p.send_to_stamp)[2]
        print(
            f"  {p.config:<16} {p.load:5.0%} {p.rate:7.2f} {p.depth:6.2f} {p.reused:6.0f} | "
            f"{fmt_ms(h.quantile(0.5)):>10} {fmt_ms(h.quantile(0.95)):>6} "
            f"{fmt_ms(h.quantile(0.99)):>6} {h.share_above(BUDGET_SECONDS):7.1%} | "
            f"{fmt_ms(e.quantile(0.5)):>8} {fmt_ms(e.quantile(0.95)):>6} "
            f"{fmt_ms(e.quantile(0.99)):>6} {e.share_above(TARGET_E2E_P99):7.1%} | "
            + f"{fmt_ms(stamp_p99):>9} "
            + (
                f"{fmt_ms(p.simulated_p99):>7} {stamp_p99 / p.simulated_p99:5.2f} "
                f"{stamp_p99 / p.simulated_p99_at_start:5.2f} "
                f"{h.quantile(0.99) / p.simulated_p99:5.2f}"
                if p.simulated_p99 and p.simulated_p99_at_start
                else f"{'-':>7} {'-':>5} {'-':>5} {'-':>5}"
            )
        )
    if TARGET_LOAD not in loads:
        print(f"TARGET: no phase at {TARGET_LOAD:.0%} load (see --loads)")
    for p in phases:
        if p.load != TARGET_LOAD:
            continue
        p99, e2e_p99 = p.worker.quantile(0.99), p.e2e.quantile(0.99)
        breaches = p.worker.share_above(BUDGET_SECONDS)
        met = p99 <= TARGET_P99 and e2e_p99 <= TARGET_E2E_P99 and breaches < TARGET_BREACHES
        print(
            f"TARGET at 50 % [{p.config}]: worker p99 {fmt_ms(p99).strip()} ms (<= 100), "
            f"e2e p99 {fmt_ms(e2e_p99).strip()} ms (<= 150), breaches {breaches:.1%} (< 1 %): "
            f"{'met' if met else 'NOT met'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[6:]),
    )
    parser.add_argument(
        "--quick", action="store_true", help="60 traces per phase, 80-trace max-rate backlog"
    )
    parser.add_argument(
        "--config",
        action="append",
        type=parse_config,
        metavar="NAME:KEY=VALUE,...",
        help="a worker configuration (repeatable; default 'default:', the shipped settings)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="setting for every worker, under each configuration's own (repeatable)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="reference max rate for the paced loads (default: measured, first config)",
    )
    parser.add_argument("--loads", default="0.25,0.5,0.8", help="fractions of the max rate")
    parser.add_argument("--per-phase", type=int, default=None, help="traces per phase (2000)")
    parser.add_argument("--max-rate-records", type=int, default=None, help="max-rate backlog (240)")
    parser.add_argument("--arrivals", choices=("poisson", "even"), default="poisson")
    parser.add_argument(
        "--sim-repeats", type=int, default=None, help="model timings per text (3; 1 --quick)"
    )
    parser.add_argument(
        "--no-simulation", action="store_true", help="skip the model-alone simulation"
    )
    parser.add_argument(
        "--others-cpus",
        type=_machine.cpu_list,
        metavar="LIST",
        help="CPUs for the broker and this process, e.g. 2,3 (default: anywhere)",
    )
    parser.add_argument(
        "--broker",
        choices=("embedded", "kafka"),
        default="embedded",
        help="the broker started for the run: the embedded one, or Apache Kafka (Java, Maven)",
    )
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help=(
            "a running broker instead of the embedded one, e.g. Apache Kafka from "
            "docker-compose.yml (localhost:9092); its CPU is not measured"
        ),
    )
    parser.add_argument(
        "--repeat-texts",
        action="store_true",
        help="keep the 50 example texts repeating (the worker then reuses their vectors)",
    )
    args = parser.parse_args()
    try:
        common = _worker.parse_env(args.env)
    except ValueError as exc:
        parser.error(str(exc))
    args.loads = [float(x) for x in args.loads.split(",")]
    args.per_phase = args.per_phase or (60 if args.quick else 2000)
    args.max_rate_records = args.max_rate_records or (80 if args.quick else 240)
    args.sim_repeats = args.sim_repeats or (1 if args.quick else 3)
    chosen = args.config or [("default", {})]
    if len({name for name, _ in chosen}) != len(chosen):
        parser.error("configuration names must differ")
    configs = []
    for name, env in chosen:
        settings = {**common, **env}
        cpus = settings.pop("CPUS", None)
        try:
            where = None if cpus is None else _machine.cpu_list(cpus)
        except ValueError as exc:
            parser.error(f"{name}: CPUS={cpus}: {exc}")
        configs.append(Config(name, settings, cpus=where))
    if args.others_cpus is not None:
        os.sched_setaffinity(0, args.others_cpus)  # the broker, started later, inherits them

    print(_machine.machine_line())
    print(
        f"latency under load: {args.per_phase} traces per phase, loads {args.loads}, "
        f"{'repeating' if args.repeat_texts else 'unique'} texts, load average "
        f"{_machine.load_average()}; configurations:"
    )
    for config in configs:
        where = "" if config.cpus is None else f" (CPUs {sorted(config.cpus)})"
        print(f"  {config.name}: {_worker.env_text(config.env)}{where}")
    if args.others_cpus is not None:
        print(f"  broker and load generator on CPUs {sorted(args.others_cpus)}")
    phases = asyncio.run(run(args, configs))
    print_summary(phases, args.loads)
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
