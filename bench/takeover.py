"""Takeover of partitions with full novelty caches: first new record scored after assignment.

    python bench/takeover.py [--broker embedded|kafka] [--traces-per-partition 1000]
                             [--new-per-partition 2] [--without-store]

One broker (the embedded one, or Apache Kafka with --broker kafka, started on loopback as the
tests start it); one input topic of 4 partitions holding --traces-per-partition traces each
(bench/_corpus.py's corpus, unique texts: every trace costs one model run), spread
round-robin. A first worker scores them all (the bench waits until it has had every output
acknowledged, by its /metrics once a second) and is stopped with SIGTERM (exit code 0
required): its group's committed offsets are then at the ends of the partitions, and each
partition's novelty cache, the last KP_CACHE_CAPACITY (1,000) traces, is full. Then, per
case, --new-per-partition new traces wait in the input before the measured worker starts:

  cold      a worker of a new group on fresh topics holding only such new traces (no committed
            offsets: nothing to rebuild);
  store     a new worker of the first group, same settings: it restores the caches from the
            store topic (KP_CACHE_STORE_TOPIC, `<prefix>.novelty-cache`);
  no store  with --without-store only: the same with KP_CACHE_STORE_TOPIC= (the caches are
            embedded again; minutes).

The figure is the time from the worker's "partitions assigned" log line (its `ts`, UTC ms) to
the first new record scored, i.e. the earliest CreateTime of the new records' outputs (set by
the worker's producer when it publishes; ms); both are wall-clock times of this machine. Per
partition: the time to its first new output and its "rebuilt novelty cache" line (restored,
embedded, seconds, and when it was logged after the assignment). The worker's RSS (VmRSS,
and VmHWM: its peak) is read after its new outputs are acknowledged. While a worker runs this
process only reads its /metrics once a second; outputs are read after.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import _corpus
import _machine
import _worker

from worker.dev.embedded_broker import EmbeddedBroker

# Apache Kafka is started by the tests' launcher (tests/support/apache_kafka.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.apache_kafka import ApacheKafka

PARTITIONS = _worker.PARTITIONS


@dataclass
class Case:
    name: str
    assigned_at: float  # the "partitions assigned" line's ts, seconds since the epoch
    assignments: int  # "partitions assigned" lines with partitions in the worker's log
    first: float  # the earliest new output's CreateTime
    per_partition: dict[int, float]  # partition -> its earliest new output's CreateTime
    rebuilds: dict[int, dict[str, object]] = field(default_factory=dict)
    rss_mib: float = 0.0
    hwm_mib: float = 0.0
    exit_code: int | None = None
    load_average: str = ""

    @property
    def seconds(self) -> float:
        return self.first - self.assigned_at


def log_time(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


async def read_outputs(
    bootstrap: str, topics: _worker.Topics, sent: list[_worker.Sent]
) -> list[_worker.Output]:
    collector = _worker.OutputCollector(bootstrap, topics)
    await collector.start()
    try:
        return await collector.wait_for([(s.partition, s.offset) for s in sent], timeout=60)
    finally:
        await collector.stop()


def wait_acked(worker: _worker.Worker, count: int, timeout: float) -> asyncio.Future[None]:
    def still_running() -> None:
        if not worker.alive():
            raise RuntimeError(f"worker exited:\n{worker.tail()}")

    return asyncio.ensure_future(
        _worker.OutputCount(worker).wait_for(count, timeout, still_short=still_running)
    )


async def measure(
    name: str, bootstrap: str, topics: _worker.Topics, env: dict[str, str], new: int, timeout: float
) -> Case:
    """``new`` traces a partition into ``topics``' input, then a worker with ``env``."""
    records = _corpus.corpus(new * PARTITIONS, f"{name}-{uuid.uuid4().hex[:6]}")
    sent = await _worker.produce_burst(bootstrap, topics.input, records, spread_over=PARTITIONS)
    load_average = _machine.load_average()
    worker = _worker.Worker(bootstrap, **env)
    worker.start()
    try:
        await worker.wait_serving()
        await wait_acked(worker, len(sent), timeout)
        rss = _machine.proc_status_kib(worker.pid or 0, "VmRSS") / 1024
        hwm = _machine.proc_status_kib(worker.pid or 0, "VmHWM") / 1024
        outputs = await read_outputs(bootstrap, topics, sent)
        events = worker.events()
        exit_code = worker.stop(60)
    finally:
        worker.cleanup()
    assigned = [
        e for e in events if e.get("event") == "partitions assigned" and e.get("partitions")
    ]
    per_partition: dict[int, float] = {}
    for output in outputs:
        partition = output.source[0]
        per_partition[partition] = min(
            per_partition.get(partition, output.timestamp), output.timestamp
        )
    case = Case(
        name=name,
        assigned_at=log_time(assigned[0]),
        assignments=len(assigned),
        first=min(per_partition.values()),
        per_partition=per_partition,
        rss_mib=rss,
        hwm_mib=hwm,
        exit_code=exit_code,
        load_average=load_average,
    )
    for event in events:
        if event.get("event") == "rebuilt novelty cache":
            case.rebuilds[int(event["partition"])] = {**event, "at": log_time(event)}  # type: ignore[call-overload]
    return case


def print_case(case: Case) -> None:
    print(
        f"[{case.name}] first new record scored {case.seconds:.2f} s after the assignment "
        f"(output CreateTime - 'partitions assigned' ts); RSS {case.rss_mib:.0f} MiB "
        f"(peak {case.hwm_mib:.0f}); exit code {case.exit_code}; "
        f"{case.assignments} assignment(s); load average before {case.load_average}",
        flush=True,
    )
    for partition in sorted(case.per_partition):
        after = case.per_partition[partition] - case.assigned_at
        line = f"    partition {partition}: first new output +{after:.2f} s"
        rebuild = case.rebuilds.get(partition)
        if rebuild is not None:
            line += (
                f"; rebuilt {rebuild['records']} (restored {rebuild['restored']}, embedded "
                f"{rebuild['embedded']}) in {rebuild['seconds']} s, logged "
                f"+{float(rebuild['at']) - case.assigned_at:.2f} s"  # type: ignore[arg-type]
            )
        else:
            line += "; no rebuild"
        print(line, flush=True)


async def run(args: argparse.Namespace) -> list[Case]:
    broker: EmbeddedBroker | ApacheKafka = (
        ApacheKafka() if args.broker == "kafka" else EmbeddedBroker()
    )
    await asyncio.to_thread(broker.start)  # it runs its own event loop to probe the broker
    bootstrap = broker.bootstrap_servers
    extra = broker.worker_settings if isinstance(broker, EmbeddedBroker) else {}
    cases: list[Case] = []
    try:
        tag = uuid.uuid4().hex[:6]
        topics = _worker.Topics(f"takeover-{tag}")
        await _worker.create_topics(bootstrap, topics)
        env = {**topics.worker_env(), **extra}
        total = args.traces_per_partition * PARTITIONS
        backlog = _corpus.corpus(total, f"backlog-{tag}")
        began = time.monotonic()
        await _worker.produce_burst(bootstrap, topics.input, backlog, spread_over=PARTITIONS)
        first = _worker.Worker(bootstrap, **env)
        first.start()
        try:
            await first.wait_serving()
            await wait_acked(first, total, timeout=120 + total)
            code = first.stop(60)
        finally:
            first.cleanup()
        print(
            f"first worker: {total} traces scored and acknowledged "
            f"{time.monotonic() - began:.0f} s after the backlog was produced; "
            f"SIGTERM -> exit code {code}; load average {_machine.load_average()}",
            flush=True,
        )
        if code != 0:
            raise RuntimeError(f"the first worker exited with {code}")

        cold_topics = _worker.Topics(f"takeover-cold-{tag}")
        await _worker.create_topics(bootstrap, cold_topics)
        cold_env = {**cold_topics.worker_env(), **extra}
        cases.append(await measure("cold", bootstrap, cold_topics, cold_env, args.new, 300))
        print_case(cases[-1])
        cases.append(await measure("store", bootstrap, topics, env, args.new, 600))
        print_case(cases[-1])
        if args.without_store:
            no_store = {**env, "KP_CACHE_STORE_TOPIC": ""}
            cases.append(await measure("no store", bootstrap, topics, no_store, args.new, 900))
            print_case(cases[-1])
    finally:
        broker.stop()
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[4:]),
    )
    parser.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    parser.add_argument("--traces-per-partition", type=int, default=1000)
    parser.add_argument(
        "--new-per-partition", dest="new", type=int, default=2, help="new traces a case (2)"
    )
    parser.add_argument(
        "--without-store",
        action="store_true",
        help="also a takeover with KP_CACHE_STORE_TOPIC= (re-embedding: minutes)",
    )
    args = parser.parse_args()
    print(_machine.machine_line())
    print(
        f"takeover on {args.broker}: {PARTITIONS} partitions x {args.traces_per_partition} "
        f"traces, {args.new} new a partition per case; load average {_machine.load_average()}",
        flush=True,
    )
    cases = asyncio.run(run(args))
    by_name = {case.name: case for case in cases}
    cold = by_name["cold"]
    for name in ("store", "no store"):
        if name in by_name:
            case = by_name[name]
            verdict = (
                f"target <= +2 s: {'met' if case.seconds - cold.seconds <= 2 else 'NOT met'}"
                if name == "store"
                else "the caches embedded again, as before the store"
            )
            print(
                f"RESULT [{name}] takeover {case.seconds:.2f} s, cold {cold.seconds:.2f} s, "
                f"takeover - cold {case.seconds - cold.seconds:+.2f} s ({verdict})"
            )
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
