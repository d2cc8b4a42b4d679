"""CPU of a worker with nothing to do, and of its broker, per configuration.

    python bench/idle_cpu.py [--broker kafka|embedded] [--seconds 60]
                             [--config NAME:KEY=VALUE,... ...]

One broker (Apache Kafka by default, started on loopback as the tests start it), then per
configuration, one after another: a `kp-scorer worker` on its own 4-partition topics, ready
and assigned, then idle for --seconds while this process reads the worker's and the broker's
CPU seconds from /proc. Nothing else runs meanwhile, so the broker's share is the worker's
fetches (and the broker's own housekeeping: the first line measures it with no worker).
Default configurations: the shipped settings, and `KP_FETCH_MAX_WAIT_MS=20`.
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

SETTLE_SECONDS = 5.0


def measure(pids: list[int | None], seconds: float) -> list[float]:
    """Cores each process used over ``seconds``."""
    before = [_machine.cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    after = [_machine.cpu_seconds(pid) for pid in pids]
    return [(b - a) / seconds for a, b in zip(before, after, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--broker", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--config", action="append", metavar="NAME:KEY=VALUE,...")
    args = parser.parse_args()
    configs = []
    for text in args.config or ["shipped:", "wait20:KP_FETCH_MAX_WAIT_MS=20"]:
        name, _, items = text.partition(":")
        configs.append((name, _worker.parse_env(item for item in items.split(",") if item)))
    print(_machine.machine_line())
    broker = ApacheKafka() if args.broker == "kafka" else EmbeddedBroker()
    broker.start()
    try:
        (quiet,) = measure([broker.pid], args.seconds)
        print(f"broker alone: {quiet:.4f} cores over {args.seconds:g} s")
        for name, env in configs:
            topics = _worker.Topics(f"bench-idle-{uuid.uuid4().hex[:8]}")
            asyncio.run(_worker.create_topics(broker.bootstrap_servers, topics))
            worker = _worker.Worker(broker.bootstrap_servers, **{**topics.worker_env(), **env})
            worker.start()
            try:
                asyncio.run(worker.wait_serving())
                worker.wait_ready()
                time.sleep(SETTLE_SECONDS)
                used_worker, used_broker = measure([worker.pid, broker.pid], args.seconds)
            finally:
                worker.stop()
            print(
                f"{name} ({_worker.env_text(env)}): worker {used_worker:.4f} cores, broker "
                f"{used_broker:.4f} ({used_broker - quiet:+.4f} over the broker alone), "
                f"over {args.seconds:g} s idle"
            )
    finally:
        broker.stop()
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
