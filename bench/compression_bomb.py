"""Peak resident memory of a worker fed a decompression bomb: one record whose value is
N MiB of one repeated byte, in one gzip batch (about 1/1000 of that on the wire).

    python bench/compression_bomb.py [--mib 1024] [--codec gzip] [--env KEY=VALUE ...]

The worker bounds what one fetch brings (``Settings.fetch_max_bytes``), but Kafka returns a
first batch whole whatever the bound, and the broker's ``message.max.bytes`` limits a batch
compressed, not decompressed. The worker decompresses a batch no further than
``KP_MAX_BATCH_BYTES`` (64 MiB; ``worker/io/unreadable.py``): a larger one is dead-lettered as
``unreadable``, record by record. Starts the embedded broker and one `kp-scorer worker`
(shipped settings unless --env says otherwise), produces the bomb and then one ordinary
trace, waits until the bomb is dead-lettered and the trace scored, and prints the worker's
resident memory before (VmRSS, and its peak so far, VmHWM) and its peak after (VmHWM). The
Deployment's memory limit (deploy/k8s/deployment.yaml) is sized from this figure.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
import zlib

import _corpus
import _machine
import _worker
import orjson
from aiokafka import AIOKafkaProducer

from worker.dev.embedded_broker import EmbeddedBroker

MIB = 1 << 20


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def gzip_size(value_mib: int) -> int:
    """Bytes of the value gzipped at level 9 (as aiokafka compresses), streamed."""
    compressor, chunk, size = zlib.compressobj(9, zlib.DEFLATED, 31), b"x" * MIB, 0
    for _ in range(value_mib):
        size += len(compressor.compress(chunk))
    return size + len(compressor.flush())


async def produce(bootstrap: str, topic: str, value_mib: int, codec: str) -> list[tuple[int, int]]:
    """The bomb (its own batch), then one ordinary trace; (partition, offset) of each."""
    size = value_mib * MIB
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=codec,
        max_request_size=size + MIB,
        request_timeout_ms=300_000,
        acks="all",
    )
    await producer.start()
    try:
        bomb = await producer.send_and_wait(topic, b"x" * size, key=b"bomb", partition=0)
        trace = orjson.loads(_corpus.EXAMPLES.read_bytes().splitlines()[0])
        ordinary = await producer.send_and_wait(
            topic, orjson.dumps(trace), key=b"after-bomb", partition=0
        )
    finally:
        await producer.stop()
    return [(bomb.partition, bomb.offset), (ordinary.partition, ordinary.offset)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="the value's size in MiB")
    parser.add_argument("--codec", choices=("gzip", "snappy", "lz4", "zstd"), default="gzip")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    env = _worker.parse_env(args.env)
    print(_machine.machine_line())
    print(f"settings: {_worker.env_text(env)}")
    compressed = f"of {gzip_size(args.mib):,} bytes" if args.codec == "gzip" else ""
    print(f"bomb: {args.mib} MiB of b'x' in one {args.codec} batch {compressed}")
    topics = _worker.Topics(f"bench-bomb-{uuid.uuid4().hex[:8]}")
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        worker = _worker.Worker(
            bootstrap,
            **{
                **topics.worker_env(),
                **broker.worker_settings,
                "KP_INPUT_PARTITIONS": "1",
                **env,
            },
        )
        collector = _worker.OutputCollector(bootstrap, topics)
        try:
            await _worker.create_topics(bootstrap, topics, input_partitions=1)
            worker.start()
            await worker.wait_serving()
            await asyncio.to_thread(worker.wait_ready)
            pid = worker.pid or 0
            rss, hwm = (
                _machine.proc_status_kib(pid, "VmRSS"),
                _machine.proc_status_kib(pid, "VmHWM"),
            )
            print(f"worker ready: VmRSS {mib(rss)}, peak so far (VmHWM) {mib(hwm)}")
            started = time.monotonic()
            sources = await produce(bootstrap, topics.input, args.mib, args.codec)
            produced = time.monotonic() - started
            await collector.start()
            bomb, ordinary = await collector.wait_for(sources, timeout=600)
            took = time.monotonic() - started
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.tail()}")
            peak = _machine.proc_status_kib(pid, "VmHWM")
            after = _machine.proc_status_kib(pid, "VmRSS")
            print(f"produced in {produced:.1f} s; both outputs {took:.1f} s after it was sent")
            print(f"bomb -> {bomb.decision}; the trace after it -> {ordinary.decision}")
            print(
                f"worker peak RSS (VmHWM) {mib(peak)} = {peak / (args.mib * 1024):.2f} x the "
                f"bomb's value; {mib(peak - rss)} over its ready RSS; VmRSS afterwards {mib(after)}"
            )
        finally:
            await collector.stop()
            worker.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
