"""Per-trace latency of one worker under paced load: p50/p95/p99 and the 100 ms budget.

    python bench/latency_under_load.py [--quick] [--config B,W,E,C ...] [--batch-max B]
                                       [--within S] [--embed-batch E] [--chunk C]
                                       [--fetch-max-wait-ms M]
                                       [--rate R] [--loads 0.25,0.5,0.8] [--per-phase N]
                                       [--arrivals poisson|even] [--threads T]

First the worker's max rate is measured as in bench/worker_throughput.py (a backlog burst,
first to last output timestamp), then a paced producer sends at 25 %, 50 % and 80 % of it,
one phase per load, each --per-phase traces (default 160), draining between phases.
Arrivals are Poisson by default (exponential gaps, fixed seed: bursts happen, as in a real
fleet) or evenly spaced with --arrivals even. Records are sent one at a time (linger 0).

Per phase, two views of latency:
- worker: deltas of its kp_trace_latency_seconds histogram (receipt by the worker -> broker
  ack of the output); the breach share (> 0.1 s) is exact (0.1 is a bucket boundary),
  quantiles are interpolated inside buckets as Prometheus' histogram_quantile does;
- end to end: producer send time -> output record timestamp (CreateTime, stamped by the
  worker's producer when it sends, so the output's ack is not included; 1 ms resolution),
  and -> the moment this process fetched the output (includes the ack and a <= 10 ms fetch
  wait). Outputs are matched to inputs by the source partition/offset in their value.

Batching strategies: --config B,W,E,C (repeatable) runs one worker per config, each with
KP_BATCH_MAX_RECORDS=B, KP_BATCH_WITHIN_SECONDS=W, KP_EMBED_BATCH_SIZE=E and
KP_SCORE_CHUNK_RECORDS=C (defaults 0.02, 1, 1), on its own topics, all started up front
(idle workers cost next to nothing);
every load level runs each config in turn (rotating the order), at the same absolute rates
(the first config's max rate, or --rate), so before/after comparisons share one run.

--fetch-max-wait-ms M starts the workers through bench/_common.py's launcher, which changes
only the 1500 ms fetch long-poll faust hard-codes: the embedded broker answers a fetch only
when that wait runs out, so as shipped records wait up to ~0.75 s before the worker sees them
(Apache Kafka answers as soon as data is there). The worker histogram does not see that wait;
the end-to-end figures do. --probe-fetch-wait measures just that, with a bare consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field

import _common as c
import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from worker.embedded_broker import EmbeddedBroker

WARMUP_RECORDS = 24
TARGET_LOAD = 0.5
TARGET_P99 = 0.1
TARGET_BREACHES = 0.01


@dataclass
class Config:
    batch_max: int
    within: float
    embed_batch: int
    chunk: int
    topics: c.Topics = field(default_factory=lambda: c.Topics(f"bench-lat-{uuid.uuid4().hex[:8]}"))
    worker: c.Worker | None = None
    collector: c.OutputCollector | None = None
    max_rate: float = 0.0

    @property
    def name(self) -> str:
        return f"take {self.batch_max}/{self.within:g}s/embed {self.embed_batch}/chunk {self.chunk}"


@dataclass
class Phase:
    config: str
    load: float
    rate: float
    sent: int
    achieved_rate: float
    worker: c.Histogram
    breaches_counter: float
    e2e_stamp: list[float]
    e2e_fetched: list[float]
    mean_batch: float
    embed_ms_per_batch: float
    publish_ms_per_batch: float
    worker_cores: float
    load_average: str


def parse_config(text: str) -> tuple[int, float, int, int]:
    """``B[,W[,E[,C]]]``: KP_BATCH_MAX_RECORDS, KP_BATCH_WITHIN_SECONDS, KP_EMBED_BATCH_SIZE,
    KP_SCORE_CHUNK_RECORDS."""
    parts = text.split(",")
    batch = int(parts[0])
    within = float(parts[1]) if len(parts) > 1 else 0.02
    embed = int(parts[2]) if len(parts) > 2 else 1
    chunk = int(parts[3]) if len(parts) > 3 else 1
    return batch, within, embed, chunk


async def paced(
    bootstrap: str, config: Config, records: list[c.Record], rate: float, arrivals: str, seed: int
) -> tuple[list[c.Sent], float]:
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
    sent = [c.Sent(m.partition, m.offset, t) for m, t in zip(results, times, strict=True)]
    return sent, (len(records) - 1) / elapsed if elapsed > 0 else 0.0


async def measure_max_rate(bootstrap: str, config: Config, count: int) -> float:
    assert config.collector is not None
    records = c.corpus(count, f"max-{uuid.uuid4().hex[:6]}")
    sent = await c.produce_burst(bootstrap, config.topics.input, records)
    produced = time.time()
    outputs = await config.collector.wait_for(
        [(s.partition, s.offset) for s in sent], timeout=60 + count
    )
    rate, _, _ = c.output_rate(outputs, produced)
    return rate


async def run_phase(
    bootstrap: str, config: Config, load: float, rate: float, args: argparse.Namespace, seed: int
) -> Phase:
    assert config.worker is not None and config.collector is not None
    records = c.corpus(args.per_phase, f"p{seed}-{uuid.uuid4().hex[:6]}")
    before = c.scrape(await asyncio.to_thread(config.worker.metrics_text))
    cpu_before, wall_before = c.cpu_seconds(config.worker.pid), time.monotonic()
    load_average = c.load_average()
    sent, achieved = await paced(bootstrap, config, records, rate, args.arrivals, seed)
    outputs = await config.collector.wait_for(
        [(s.partition, s.offset) for s in sent], timeout=60 + args.per_phase
    )
    cores = (c.cpu_seconds(config.worker.pid) - cpu_before) / (time.monotonic() - wall_before)
    await asyncio.sleep(0.5)  # metrics are observed right after the broker's acks
    diff = c.delta(c.scrape(await asyncio.to_thread(config.worker.metrics_text)), before)
    batches = c.value(diff, "kp_batch_size_count")

    def per_batch(stage: str) -> float:
        count = c.value(diff, "kp_stage_latency_seconds_count", stage=stage)
        return c.value(diff, "kp_stage_latency_seconds_sum", stage=stage) / count if count else 0.0

    return Phase(
        config=config.name,
        load=load,
        rate=rate,
        sent=len(sent),
        achieved_rate=achieved,
        worker=c.histogram(diff, "kp_trace_latency_seconds"),
        breaches_counter=c.value(diff, "kp_budget_breaches_total"),
        e2e_stamp=[o.timestamp - s.sent_at for o, s in zip(outputs, sent, strict=True)],
        e2e_fetched=[o.received_at - s.sent_at for o, s in zip(outputs, sent, strict=True)],
        mean_batch=c.value(diff, "kp_batch_size_sum") / batches if batches else 0.0,
        embed_ms_per_batch=per_batch("embed") * 1000,
        publish_ms_per_batch=per_batch("publish") * 1000,
        worker_cores=cores,
        load_average=load_average,
    )


async def run(args: argparse.Namespace, configs: list[Config]) -> list[Phase]:
    broker = EmbeddedBroker()
    broker.start()
    bootstrap = broker.bootstrap_servers
    phases: list[Phase] = []
    try:
        for config in configs:
            await c.create_topics(bootstrap, config.topics)
            config.worker = c.Worker(
                bootstrap,
                args.fetch_max_wait_ms,
                **config.topics.worker_env(),
                KP_EMBED_BATCH_SIZE=str(config.embed_batch),
                KP_EMBED_THREADS=str(args.threads),
                KP_BATCH_MAX_RECORDS=str(config.batch_max),
                KP_BATCH_WITHIN_SECONDS=str(config.within),
                KP_SCORE_CHUNK_RECORDS=str(config.chunk),
            ).start()
        for config in configs:
            assert config.worker is not None
            await config.worker.wait_serving()
            config.collector = c.OutputCollector(bootstrap, config.topics)
            await config.collector.start()
            warm = await c.produce_burst(
                bootstrap, config.topics.input, c.corpus(WARMUP_RECORDS, "warm")
            )
            await config.collector.wait_for([(s.partition, s.offset) for s in warm], 180)
        for config in configs:
            config.max_rate = await measure_max_rate(bootstrap, config, args.max_rate_records)
            print(
                f"max rate [{config.name}]: {config.max_rate:.1f} traces/s "
                f"({args.max_rate_records}-record backlog; load average {c.load_average()})",
                flush=True,
            )
        reference = args.rate or configs[0].max_rate
        print(f"paced rates are fractions of {reference:.1f} traces/s ({args.arrivals} arrivals)")
        seed = 0
        for level, load in enumerate(args.loads):
            shift = level % len(configs)
            for config in configs[shift:] + configs[:shift]:
                seed += 1
                phase = await run_phase(bootstrap, config, load, load * reference, args, seed)
                phases.append(phase)
                print_phase(phase)
    finally:
        for config in configs:
            if config.collector is not None:
                await config.collector.stop()
            if config.worker is not None:
                config.worker.cleanup()
        broker.stop()
    return phases


async def probe_fetch_wait(waits: tuple[int, ...] = (1500, 500, 100, 20)) -> None:
    """How long a consumer with each fetch_max_wait_ms takes to see a record on this broker
    (one record every 0.37 s, 20 per setting): the 1500 ms row is what faust uses."""
    broker = EmbeddedBroker()
    broker.start()
    topics = c.Topics(f"bench-probe-{uuid.uuid4().hex[:8]}")
    try:
        await c.create_topics(broker.bootstrap_servers, topics)
        for wait in waits:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=broker.bootstrap_servers,
                fetch_max_wait_ms=wait,
                enable_auto_commit=False,
            )
            await consumer.start()
            partitions = [TopicPartition(topics.input, p) for p in range(c.PARTITIONS)]
            consumer.assign(partitions)
            await consumer.seek_to_end(*partitions)
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0)
            await producer.start()
            seen: list[float] = []

            async def consume(consumer: AIOKafkaConsumer = consumer, seen: list[float] = seen):
                while True:
                    batches = await consumer.getmany(timeout_ms=5000)
                    now = time.time()
                    seen += [now - m.timestamp / 1000 for ms in batches.values() for m in ms]

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.5)
            for i in range(20):
                await producer.send(
                    topics.input, b"x", key=str(i).encode(), timestamp_ms=int(time.time() * 1000)
                )
                await asyncio.sleep(0.37)
            await asyncio.sleep(2 * wait / 1000 + 0.5)
            task.cancel()
            await producer.stop()
            await consumer.stop()
            p50, p95, _ = c.percentiles(seen)
            print(
                f"  fetch_max_wait_ms {wait:5d}: {len(seen)} records, produce->fetched p50 "
                f"{p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(seen) * 1000:.0f} ms"
            )
    finally:
        broker.stop()


def print_phase(phase: Phase) -> None:
    h = phase.worker
    e2e = c.percentiles(phase.e2e_stamp)
    fetched = c.percentiles(phase.e2e_fetched)
    breach_e2e = float(np.mean(np.array(phase.e2e_stamp) > c.BUDGET_SECONDS))
    print(
        f"[{phase.config}] load {phase.load:.0%}: {phase.sent} traces at {phase.rate:.2f}/s "
        f"(achieved {phase.achieved_rate:.2f}/s), mean batch {phase.mean_batch:.2f}, "
        f"embed {phase.embed_ms_per_batch:.0f} ms/batch, publish "
        f"{phase.publish_ms_per_batch:.0f} ms/batch, worker {phase.worker_cores:.2f} cores, "
        f"load average {phase.load_average}\n"
        f"    worker histogram   p50/p95/p99 ms {c.fmt_ms(h.quantile(0.5))} "
        f"{c.fmt_ms(h.quantile(0.95))} {c.fmt_ms(h.quantile(0.99))}   breaches "
        f"{h.share_above(c.BUDGET_SECONDS):6.1%} ({phase.breaches_counter:.0f}/{h.count:.0f})\n"
        f"    e2e send->out stamp p50/p95/p99 ms {c.fmt_ms(e2e[0])} {c.fmt_ms(e2e[1])} "
        f"{c.fmt_ms(e2e[2])}   breaches {breach_e2e:6.1%}   send->fetched p50/p95/p99 "
        f"{c.fmt_ms(fetched[0])} {c.fmt_ms(fetched[1])} {c.fmt_ms(fetched[2])}",
        flush=True,
    )


def print_summary(phases: list[Phase]) -> None:
    print("summary (ms; breaches = share of traces over 100 ms)")
    header = (
        f"  {'config':<26} {'load':>5} {'rate/s':>7} {'batch':>6} | {'worker p50':>10} "
        f"{'p95':>6} {'p99':>6} {'breach':>7} | {'e2e p50':>8} {'p95':>6} {'p99':>6} {'breach':>7}"
    )
    print(header)
    for p in phases:
        h = p.worker
        e2e = c.percentiles(p.e2e_stamp)
        breach_e2e = float(np.mean(np.array(p.e2e_stamp) > c.BUDGET_SECONDS))
        print(
            f"  {p.config:<26} {p.load:5.0%} {p.rate:7.2f} {p.mean_batch:6.2f} | "
            f"{c.fmt_ms(h.quantile(0.5)):>10} {c.fmt_ms(h.quantile(0.95)):>6} "
            f"{c.fmt_ms(h.quantile(0.99)):>6} {h.share_above(c.BUDGET_SECONDS):7.1%} | "
            f"{c.fmt_ms(e2e[0]):>8} {c.fmt_ms(e2e[1]):>6} {c.fmt_ms(e2e[2]):>6} {breach_e2e:7.1%}"
        )
    for p in phases:
        if p.load != TARGET_LOAD:
            continue
        h = p.worker
        p99, breaches = h.quantile(0.99), h.share_above(c.BUDGET_SECONDS)
        met = p99 <= TARGET_P99 and breaches < TARGET_BREACHES
        print(
            f"TARGET at 50 % [{p.config}]: worker p99 {c.fmt_ms(p99).strip()} ms (<= 100), "
            f"breaches {breaches:.1%} (< 1 %): {'met' if met else 'NOT met'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases and max-rate run")
    parser.add_argument(
        "--config",
        action="append",
        type=parse_config,
        help="B[,W[,E[,C]]]: take size, take wait s, embed batch, score chunk (repeatable)",
    )
    parser.add_argument("--batch-max", type=int, default=8, help="KP_BATCH_MAX_RECORDS")
    parser.add_argument("--within", type=float, default=0.02, help="KP_BATCH_WITHIN_SECONDS")
    parser.add_argument("--embed-batch", type=int, default=1, help="KP_EMBED_BATCH_SIZE")
    parser.add_argument("--chunk", type=int, default=1, help="KP_SCORE_CHUNK_RECORDS")
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=None,
        help="bench-only override of faust's 1500 ms consumer fetch wait (default: as shipped)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="reference max rate for the paced loads (default: measured, first config)",
    )
    parser.add_argument("--loads", default="0.25,0.5,0.8")
    parser.add_argument("--per-phase", type=int, default=None, help="traces per phase")
    parser.add_argument("--max-rate-records", type=int, default=None)
    parser.add_argument("--arrivals", choices=("poisson", "even"), default="poisson")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--probe-fetch-wait",
        action="store_true",
        help="only measure how the broker answers fetch long-polls (see the docstring)",
    )
    args = parser.parse_args()
    if args.probe_fetch_wait:
        print(f"fetch long-poll on the embedded broker; load average {c.load_average()}")
        asyncio.run(probe_fetch_wait())
        return
    args.loads = [float(x) for x in args.loads.split(",")]
    args.per_phase = args.per_phase or (100 if args.quick else 160)
    args.max_rate_records = args.max_rate_records or (160 if args.quick else 240)
    chosen = args.config or [(args.batch_max, args.within, args.embed_batch, args.chunk)]
    configs = [Config(*config) for config in chosen]

    print(c.machine_line())
    print(
        f"latency under load: configs {[cfg.name for cfg in configs]}, faust fetch wait "
        f"{args.fetch_max_wait_ms or 'as shipped (1500)'} ms, intra-op threads "
        f"{args.threads}, {args.per_phase} traces per phase, loads {args.loads}, "
        f"load average {c.load_average()}"
    )
    phases = asyncio.run(run(args, configs))
    print_summary(phases)
    print(f"load average at end {c.load_average()}")


if __name__ == "__main__":
    main()
