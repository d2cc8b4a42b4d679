"""CPU of a worker with nothing to do, and of its broker, per configuration.

    python bench/idle_cpu.py [--broker kafka|embedded] [--seconds 60]
                             [--config NAME:KEY=VALUE,... ...]

One broker (Apache Kafka by default, started on loopback as the tests start it), then per
configuration, one after another: a `kp-scorer worker` on its own 4-partition topics, ready
and assigned, then idle for --seconds while this process reads the worker's and the broker's
CPU seconds from /proc. Nothing else runs meanwhile, so the broker's share is the worker's
fetches (and the broker's own housekeeping: the first line measures it with no worker).
Default configurations: the shipped settings, and `KP_FETCH_MAX_WAIT_MS=20`.

With --other-topics N, the broker first gets N other topics of 4 partitions each, as a
production cluster holds: a worker's idle CPU must not grow with them. With --standby, the
input topic has one partition and two workers share the group: the one measured is the standby,
the one the group assigned none. The worker is the one of the directory the bench is run from
(`cd <tree> && python <this file>` measures that tree's worker).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import _machine
import _worker

from worker.dev.embedded_broker import EmbeddedBroker

# Apache Kafka is started by the tests' launcher (tests/support/apache_kafka.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.apache_kafka import ApacheKafka
from support.kafka_helpers import create_topics

SETTLE_SECONDS = 5.0
READY_SECONDS = 120.0  # a broker busy with thousands of new topics answers a join slowly
OTHER_TOPICS_STEP = 250  # topics created a request
OTHER_TOPICS_SETTLE_SECONDS = 15.0  # the broker's own work after creating them


def measure(pids: list[int | None], seconds: float) -> list[float]:
    """Cores each process used over ``seconds``."""
    before = [_machine.cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    after = [_machine.cpu_seconds(pid) for pid in pids]
    return [(b - a) / seconds for a, b in zip(before, after, strict=True)]


def standby(workers: list[_worker.Worker]) -> _worker.Worker:
    """The worker whose latest assignment is empty, once the other's names the partition."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        latest = [
            [e["partitions"] for e in worker.events() if e.get("event") == "partitions assigned"]
            for worker in workers
        ]
        if all(latest) and sorted(bool(assigned[-1]) for assigned in latest) == [False, True]:
            return next(w for w, assigned in zip(workers, latest, strict=True) if not assigned[-1])
        time.sleep(0.5)
    raise SystemExit(f"no worker became the standby within {READY_SECONDS:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--broker", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--config", action="append", metavar="NAME:KEY=VALUE,...")
    parser.add_argument("--other-topics", type=int, default=0)
    parser.add_argument("--standby", action="store_true")
    args = parser.parse_args()
    configs = []
    for text in args.config or ["shipped:", "wait20:KP_FETCH_MAX_WAIT_MS=20"]:
        name, _, items = text.partition(":")
        configs.append((name, _worker.parse_env(item for item in items.split(",") if item)))
    print(_machine.machine_line())
    broker = ApacheKafka() if args.broker == "kafka" else EmbeddedBroker()
    broker.start()
    try:
        if args.other_topics:
            for first in range(0, args.other_topics, OTHER_TOPICS_STEP):
                names = range(first, min(first + OTHER_TOPICS_STEP, args.other_topics))
                create_topics(broker.bootstrap_servers, [f"other-{i:05d}" for i in names], 4)
            time.sleep(OTHER_TOPICS_SETTLE_SECONDS)
            print(f"{args.other_topics} other topics of 4 partitions")
        (quiet,) = measure([broker.pid], args.seconds)
        print(f"broker alone: {quiet:.4f} cores over {args.seconds:g} s")
        for name, env in configs:
            topics = _worker.Topics(f"bench-idle-{uuid.uuid4().hex[:8]}")
            inputs = 1 if args.standby else _worker.PARTITIONS
            asyncio.run(_worker.create_topics(broker.bootstrap_servers, topics, inputs))
            every = {**topics.worker_env(), "KP_INPUT_PARTITIONS": str(inputs), **env}
            workers = [
                _worker.Worker(broker.bootstrap_servers, **every)
                for _ in range(2 if args.standby else 1)
            ]
            try:
                for started in workers:
                    started.start()
                    asyncio.run(started.wait_serving())
                worker = standby(workers) if args.standby else workers[0].wait_ready(READY_SECONDS)
                time.sleep(SETTLE_SECONDS)
                used_worker, used_broker = measure([worker.pid, broker.pid], args.seconds)
            finally:
                for started in workers:
                    started.stop()
            print(
                f"{name}{' standby' if args.standby else ''} ({_worker.env_text(env)}): "
                f"worker {used_worker:.4f} cores, broker "
                f"{used_broker:.4f} ({used_broker - quiet:+.4f} over the broker alone), "
                f"over {args.seconds:g} s idle"
            )
    finally:
        broker.stop()
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
