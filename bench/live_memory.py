"""Resident memory of a live worker whose 16 partitions' novelty caches are full.

    python bench/live_memory.py [--env KEY=VALUE ...]

Starts the embedded broker and one `kp-scorer worker` (shipped settings unless --env says
otherwise) on an input topic of 16 partitions, then produces 1,250 traces to each partition
(examples/traces.jsonl with unique ids; its 50 texts repeat, so most vectors are reused and
the caches fill in seconds rather than the minutes 16,000 model runs would take). Once every
output is acknowledged it reads the worker's `kp_cache_entries` and its VmRSS / VmHWM, and
prints them against the 450 MB target for a worker with 16 full caches. Memory is in MB
(10^6 bytes) for the target and MiB beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import _corpus
import _machine
import _metrics
import _worker

from worker.dev.embedded_broker import EmbeddedBroker

PARTITIONS = 16
PER_PARTITION = 1250  # more than the default cache capacity (1,000 vectors) in each
TARGET_MB = 450.0


def mb(kib: float) -> str:
    return f"{kib * 1024 / 1e6:.0f} MB ({kib / 1024:.0f} MiB)"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    env = _worker.parse_env(args.env)
    print(_machine.machine_line())
    broker = EmbeddedBroker()
    broker.start()
    topics = _worker.Topics(f"bench-mem-{uuid.uuid4().hex[:8]}")
    worker_env = {**topics.worker_env(), "KP_INPUT_PARTITIONS": str(PARTITIONS), **env}
    worker = _worker.Worker(broker.bootstrap_servers, **{**broker.worker_settings, **worker_env})
    try:
        await _worker.create_topics(broker.bootstrap_servers, topics, input_partitions=PARTITIONS)
        worker.start()
        await worker.wait_serving()
        await asyncio.to_thread(worker.wait_ready)  # model loaded and partitions assigned
        ready = _machine.proc_status_kib(worker.pid or 0, "VmRSS")
        started = time.monotonic()
        records = _corpus.corpus(PARTITIONS * PER_PARTITION, "mem", unique_texts=False)
        sent = len(
            await _worker.produce_burst(
                broker.bootstrap_servers, topics.input, records, spread_over=PARTITIONS
            )
        )
        await _worker.OutputCount(worker).wait_for(sent, timeout=900)
        seconds = time.monotonic() - started
        await asyncio.sleep(0.5)
        samples = _metrics.scrape(await asyncio.to_thread(worker.metrics_text))
        rss = _machine.proc_status_kib(worker.pid or 0, "VmRSS")
        peak = _machine.proc_status_kib(worker.pid or 0, "VmHWM")
    finally:
        worker.cleanup()
        broker.stop()
    entries = sorted(
        int(value) for (name, _), value in samples.items() if name == "kp_cache_entries"
    )
    settings = _worker.env_text(env)
    print(
        f"live worker ({settings}): {sent} traces on {PARTITIONS} partitions scored in "
        f"{seconds:.1f} s; load average {_machine.load_average()}"
    )
    print(
        f"  cache entries per partition: {len(entries)} partitions, "
        f"min {min(entries, default=0)}, max {max(entries, default=0)}"
    )
    print(
        f"  RSS when ready, before any record {mb(ready)}; with the caches full {mb(rss)}; "
        f"peak {mb(peak)}"
    )
    full = len(entries) == PARTITIONS and min(entries) >= 1000
    verdict = "met" if rss * 1024 / 1e6 <= TARGET_MB else "NOT met"
    print(
        f"RSS with {PARTITIONS} full caches: {mb(rss)}, target <= {TARGET_MB:.0f} MB: {verdict}"
        + ("" if full else " (caches NOT all full: see the entries above)")
    )


if __name__ == "__main__":
    asyncio.run(main())
