"""A rolling restart of workers with full novelty caches under paced load: lag and latency.

    python bench/rolling_restart.py [--broker embedded|kafka] [--workers 3] [--partitions 12]
                                    [--traces-per-partition 1000] [--cache-capacity 1000]
                                    [--load 0.5] [--rate R] [--modes store,no-store]
                                    [--steady 15] [--tail 15]

Per mode (`store`: the shipped KP_CACHE_STORE_TOPIC, each takeover restores its caches from
it; `no-store`: KP_CACHE_STORE_TOPIC= , each takeover embeds them again), on its own topics
of one broker: an input topic of --partitions partitions holding --traces-per-partition
traces each (unique texts), scored by --workers workers of one group with
KP_CACHE_CAPACITY=--cache-capacity, so that every partition's cache is full when they are
done. The backlog's rate (first to last output CreateTime) is the workers' max rate; the
first mode's rate (or --rate) times --load is the arrival rate of both modes (evenly spaced,
one record at a time, round-robin over the partitions, each stamped with its send time).
With arrivals running: --steady seconds, then the rollout, then --tail seconds, then the
arrivals stop and the bench waits for every output.

The rollout, for each worker in turn: SIGTERM (exit code reported), start its replacement,
wait until the replacement holds partitions and has logged "rebuilt novelty cache" for each
of them since its latest assignment (at most 600 s), next.

Lag, sampled every second: kp_consumer_lag_records summed over the live workers' /metrics
(partitions nobody holds during a rebalance are not in it), and the group's lag from the
broker (end offsets minus committed offsets, every partition). Latency: end to end, output
CreateTime minus the input's send time (its timestamp), for the records sent during the
steady phase, during the rollout (first SIGTERM to the last replacement's rebuilds done)
and during the tail.

On 2 cores the full scale (12 x 1,000 traces, caches of 1,000) takes long: --traces-per-
partition and --cache-capacity scale it down; the figures state the scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import _corpus
import _machine
import _metrics
import _worker
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from worker.dev.embedded_broker import EmbeddedBroker

# Apache Kafka is started by the tests' launcher (tests/support/apache_kafka.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.apache_kafka import ApacheKafka


@dataclass
class Mode:
    name: str
    max_rate: float = 0.0
    lag_samples: list[tuple[float, float, float]] = field(default_factory=list)  # t, metrics, group
    steps: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=dict)
    rollout_seconds: float = 0.0
    rebuilds: list[dict[str, object]] = field(default_factory=list)
    load_average: str = ""


def log_time(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


class Fleet:
    """The group's live workers, replaced one by one; all logs kept until the end."""

    def __init__(self, bootstrap: str, env: dict[str, str], size: int) -> None:
        self.bootstrap, self.env = bootstrap, env
        self.live = [_worker.Worker(bootstrap, **env) for _ in range(size)]
        self.retired: list[_worker.Worker] = []

    def start(self) -> None:
        for worker in self.live:
            worker.start()

    async def acknowledged(self) -> int:
        return sum([await _worker.OutputCount(w).total() for w in self.live])

    def lag(self) -> float:
        total = 0.0
        for worker in list(self.live):
            try:
                samples = _metrics.scrape(worker.metrics_text())
            except OSError:
                continue
            total += sum(v for (n, _), v in samples.items() if n == "kp_consumer_lag_records")
        return total

    async def replace(self, index: int) -> tuple[_worker.Worker, int | None]:
        old = self.live[index]
        code = await asyncio.to_thread(old.stop, 60)
        self.retired.append(old)
        new = _worker.Worker(self.bootstrap, **self.env)
        new.start()
        self.live[index] = new
        return new, code

    def cleanup(self) -> None:
        for worker in self.live + self.retired:
            worker.cleanup()


def rebuilt_since_assignment(worker: _worker.Worker) -> bool:
    """The worker holds partitions and has rebuilt each since it first got partitions (a
    partition it keeps through a later rebalance is not rebuilt again)."""
    events = worker.events()
    assigned = [
        e for e in events if e.get("event") == "partitions assigned" and e.get("partitions")
    ]
    if not assigned:
        return False
    since = log_time(assigned[0])
    done = {
        int(e["partition"])  # type: ignore[call-overload]
        for e in events
        if e.get("event") == "rebuilt novelty cache" and log_time(e) >= since
    }
    return {int(p[1]) for p in assigned[-1]["partitions"]} <= done  # type: ignore[union-attr, index]


class GroupLag:
    """The group's lag from the broker: end offsets minus committed offsets, every partition."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self.group = group
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    async def start(self) -> None:
        await self.admin.start()
        await self.consumer.start()

    async def records(self) -> float:
        # Committed first: offsets committed between the two reads would make it negative.
        committed = await self.admin.list_consumer_group_offsets(self.group, partitions=self.tps)
        ends = await self.consumer.end_offsets(self.tps)
        lag = 0
        for tp in self.tps:
            done = committed.get(tp)
            lag += ends[tp] - (done.offset if done is not None and done.offset >= 0 else 0)
        return float(lag)

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.admin.close()


async def paced(
    bootstrap: str, topic: str, partitions: int, rate: float, stop: asyncio.Event
) -> list[tuple[_worker.Sent, asyncio.Future[object]]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    await producer.start()
    sent: list[tuple[_worker.Sent, asyncio.Future[object]]] = []
    began = time.monotonic()
    try:
        index = 0
        records: list[_corpus.Record] = []
        while not stop.is_set():
            if not records:  # built ahead, a few at a time: the texts are unique
                records = _corpus.corpus(100, f"paced-{uuid.uuid4().hex[:6]}")[::-1]
            record = records.pop()
            wait = began + index / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            at = time.time()
            future = await producer.send(
                topic, value=record.value, key=record.key, partition=index % partitions
            )
            sent.append((_worker.Sent(index % partitions, -1, at), future))
            index += 1
        await asyncio.gather(*(f for _, f in sent))
    finally:
        await producer.stop()
    return sent


async def run_mode(
    name: str, bootstrap: str, extra: dict[str, str], args: argparse.Namespace, rate: float | None
) -> Mode:
    mode = Mode(name)
    topics = _worker.Topics(f"rolling-{name}-{uuid.uuid4().hex[:6]}")
    await _worker.create_topics(bootstrap, topics, input_partitions=args.partitions)
    env = {
        **topics.worker_env(),
        "KP_INPUT_PARTITIONS": str(args.partitions),
        "KP_CACHE_CAPACITY": str(args.cache_capacity),
        **extra,
    }
    if name == "no-store":
        env["KP_CACHE_STORE_TOPIC"] = ""
    group = env["KP_GROUP_ID"]
    fleet = Fleet(bootstrap, env, args.workers)
    try:
        fleet.start()
        for worker in fleet.live:
            await worker.wait_serving()
        total = args.traces_per_partition * args.partitions
        backlog = await _worker.produce_burst(
            bootstrap,
            topics.input,
            _corpus.corpus(total, f"backlog-{uuid.uuid4().hex[:6]}"),
            spread_over=args.partitions,
        )
        deadline = time.monotonic() + 300 + total
        while await fleet.acknowledged() < total:
            if time.monotonic() > deadline:
                raise TimeoutError("backlog not scored")
            await asyncio.sleep(2)
        collector = _worker.OutputCollector(bootstrap, topics)
        await collector.start()
        try:
            outputs = await collector.wait_for([(s.partition, s.offset) for s in backlog], 120)
        finally:
            await collector.stop()
        mode.max_rate, _, span = _worker.output_rate(outputs, backlog[0].sent_at)
        print(
            f"[{name}] backlog: {total} traces by {args.workers} workers, {mode.max_rate:.1f} "
            f"traces/s (first to last output, {span:.0f} s); load average "
            f"{_machine.load_average()}",
            flush=True,
        )
        rate = rate or mode.max_rate * args.load
        mode.load_average = _machine.load_average()
        stop = asyncio.Event()
        producing = asyncio.create_task(paced(bootstrap, topics.input, args.partitions, rate, stop))

        group_lag = GroupLag(bootstrap, group, topics.input, args.partitions)
        await group_lag.start()
        await group_lag.records()  # the first answer came negative (-1088), before metadata

        async def sample() -> None:
            while True:
                metrics_lag = await asyncio.to_thread(fleet.lag)
                committed = await group_lag.records()
                mode.lag_samples.append((time.time(), metrics_lag, committed))
                await asyncio.sleep(1)

        sampling = asyncio.create_task(sample())
        phases: dict[str, tuple[float, float]] = {}
        began = time.time()
        await asyncio.sleep(args.steady)
        phases["steady"] = (began, time.time())
        rollout_began = time.time()
        for index in range(args.workers):
            step_began = time.time()
            new, code = await fleet.replace(index)
            deadline = time.monotonic() + 600
            while not rebuilt_since_assignment(new) and time.monotonic() < deadline:
                if not new.alive():
                    raise RuntimeError(f"replacement exited:\n{new.tail()}")
                await asyncio.sleep(1)
            step = (
                f"worker {index}: SIGTERM exit code {code}; replacement ready "
                f"{time.time() - step_began:.1f} s after the SIGTERM"
            )
            mode.steps.append(step)
            print(f"[{name}] {step}", flush=True)
            if code != 0:  # why, while its log is still there
                print(fleet.retired[-1].tail(20), flush=True)
        rollout_ended = time.time()
        mode.rollout_seconds = rollout_ended - rollout_began
        phases["rollout"] = (rollout_began, rollout_ended)
        await asyncio.sleep(args.tail)
        phases["tail"] = (rollout_ended, time.time())
        stop.set()
        sent = await producing
        offsets = [(s, f.result()) for s, f in sent]
        await asyncio.sleep(2)
        collector = _worker.OutputCollector(bootstrap, topics)
        await collector.start()
        try:
            sources = [(m.partition, m.offset) for _, m in offsets]  # type: ignore[attr-defined]
            outputs = await collector.wait_for(sources, 600)
        finally:
            await collector.stop()
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
        await group_lag.stop()
        for phase, (start, end) in phases.items():
            mode.latency[phase] = [
                o.timestamp - s.sent_at
                for (s, _), o in zip(offsets, outputs, strict=True)
                if start <= s.sent_at < end
            ]
        mode.lag_samples = [x for x in mode.lag_samples if x[0] >= began]
        for worker in fleet.live + fleet.retired:
            mode.rebuilds += [
                e
                for e in worker.events()
                if e.get("event") == "rebuilt novelty cache" and log_time(e) >= rollout_began
            ]
        print(
            f"[{name}] arrivals {rate:.1f} traces/s, {len(sent)} sent; "
            f"duplicates {collector.duplicates}",
            flush=True,
        )
    finally:
        fleet.cleanup()
    return mode


def print_mode(mode: Mode) -> None:
    rollout = [x for x in mode.lag_samples]
    peak_metrics = max((x[1] for x in rollout), default=float("nan"))
    peak_group = max((x[2] for x in rollout), default=float("nan"))
    print(
        f"[{mode.name}] rollout {mode.rollout_seconds:.1f} s; lag peak {peak_metrics:.0f} records "
        f"(kp_consumer_lag_records summed), {peak_group:.0f} (group's committed offsets); "
        f"load average before {mode.load_average}"
    )
    for phase, values in mode.latency.items():
        p50, p99 = _metrics.percentiles(values, (50, 99))
        print(
            f"    {phase}: {len(values)} traces, end to end p50 {p50 * 1000:.0f} ms, p99 "
            f"{p99 * 1000:.0f} ms, max {max(values, default=float('nan')) * 1000:.0f} ms"
        )
    restored = sum(int(e["restored"]) for e in mode.rebuilds)  # type: ignore[call-overload]
    embedded = sum(int(e["embedded"]) for e in mode.rebuilds)  # type: ignore[call-overload]
    seconds = [float(e["seconds"]) for e in mode.rebuilds]  # type: ignore[arg-type]
    print(
        f"    rebuilds during the rollout: {len(mode.rebuilds)}, restored {restored}, embedded "
        f"{embedded}, seconds each {min(seconds, default=0):.2f}-{max(seconds, default=0):.2f}"
    )
    print(
        "    lag every second (metrics/group): "
        + " ".join(f"{m:.0f}/{g:.0f}" for _, m, g in mode.lag_samples)
    )


async def run(args: argparse.Namespace) -> list[Mode]:
    broker: EmbeddedBroker | ApacheKafka = (
        ApacheKafka() if args.broker == "kafka" else EmbeddedBroker()
    )
    await asyncio.to_thread(broker.start)  # it runs its own event loop to probe the broker
    extra = broker.worker_settings if isinstance(broker, EmbeddedBroker) else {}
    modes: list[Mode] = []
    rate = args.rate
    try:
        for name in args.modes:
            mode = await run_mode(name, broker.bootstrap_servers, extra, args, rate)
            rate = rate or mode.max_rate * args.load
            modes.append(mode)
            print_mode(mode)
    finally:
        broker.stop()
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[6:]),
    )
    parser.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--traces-per-partition", type=int, default=1000)
    parser.add_argument("--cache-capacity", type=int, default=1000)
    parser.add_argument("--load", type=float, default=0.5, help="of the first mode's max rate")
    parser.add_argument("--rate", type=float, default=None, help="arrivals/s (default: measured)")
    parser.add_argument("--modes", default="store,no-store")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds before the rollout")
    parser.add_argument("--tail", type=float, default=15.0, help="seconds after the rollout")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    if not set(args.modes) <= {"store", "no-store"}:
        parser.error("--modes: store and/or no-store")
    if args.traces_per_partition < args.cache_capacity:
        parser.error("--traces-per-partition below --cache-capacity: caches would not be full")
    print(_machine.machine_line())
    print(
        f"rolling restart on {args.broker}: {args.workers} workers, {args.partitions} partitions "
        f"x {args.traces_per_partition} traces, caches of {args.cache_capacity}, load "
        f"{args.load:.0%}; load average {_machine.load_average()}",
        flush=True,
    )
    asyncio.run(run(args))
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
