"""The worker's CPU a trace beside the floor under it: the Kafka clients alone, and the worker
without its model.

    python bench/client_floor.py [--rates 5.5,11] [--records 600] [--cpu 1] [--others-cpus 0]
                                 [--subjects clients,no model,clients+model,worker,...]

(the librdkafka subjects need confluent-kafka, one of the test dependencies)

Apache Kafka (one node, started on loopback as the tests start it) and this process (the load
generator) run on --others-cpus; each subject runs alone on --cpu, one after another, on its
own 4-partition topics, fed the same Poisson arrivals of bench corpus records (unique texts)
at each of --rates records/s:

- ``clients``: aiokafka alone, as the worker configures it: a consumer of the input
  (read_committed, the worker's fetch wait), and for each record a copy of its value
  published to an output topic (acks=all, idempotent, linger 0) and awaited, offsets
  committed every second: the least any aiokafka worker does per record;
- ``clients+model``: the same, each record's text embedded before its value is published,
  records side by side as in the worker: the least any aiokafka worker with this model does
  per record;
- ``clients+pipeline``: the worker's own pipeline (``StreamScorer`` with the scorer, the
  publisher and the cache store as ``kp-scorer worker`` builds them) fed by a bare aiokafka
  consumer configured as ``clients``: the worker's pipeline without its group consumer
  (acknowledgements, commits of published records only) and the rest of its process;
- ``no model``: ``kp-scorer worker`` with a model file that does not load (novelty 0.5, no
  model runs): the process, its group consumer, the pipeline, the metrics and publishing,
  without the model;
- ``worker``: ``kp-scorer worker`` as shipped;
- ``librdkafka`` and ``librdkafka+model``: ``clients`` and ``clients+model`` on
  confluent-kafka's clients (librdkafka, in C) instead of aiokafka, configured alike: how much
  of the floor is the client library's.

Per subject and rate: its CPU ms a record (utime + stime over the phase, from sending the
first record to the last output's arrival), each thread's, and that against the model's
CPU a text alone (the embedder as shipped in this process, one text at a time, on --cpu,
the mean of a measurement just before and one just after the phase). The worker's target
is 1.1x the model's: ``clients+model`` shows how close to the model alone any worker on
these clients can come, and ``no model`` what the worker adds to the clients.

And per phase, from each record's sending to its output's timestamp (set by the subject's
producer as it sends the output): p50/p95/p99, and p99 against the model alone simulated on
the same send times (``bench/budget_floor.py``'s fluid model of the embedder as shipped on
--cpu, as ``bench/latency_under_load.py`` simulates it), measured before each rate's phases
and run at the model's speed around the phase (the model alone's CPU a text just before and
after it, against just after that measurement): the machine's speed drifts by 5-10 % over a
rate's phases. The ratio at the speed when the rate's phases began is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _corpus
import _machine
import _metrics
import _worker
import latency_under_load
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.apache_kafka import ApacheKafka

from worker.core.output import output_topics
from worker.core.records import SourceRecord
from worker.core.scorer import build_scorer
from worker.core.trace import parse_trace
from worker.io.kafka import PartitionLogReader, ensure_topics, source_record, stop_all
from worker.io.publisher import Publisher
from worker.settings import Settings, load_settings
from worker.stream.observer import MetricsObserver
from worker.stream.processor import StreamScorer

COMMIT_SECONDS = 1.0  # the worker's KP_COMMIT_INTERVAL_SECONDS default
MODEL_SUBJECTS = {
    "clients+model",
    "clients+pipeline",
    "librdkafka+model",
    "librdkafka+pipeline",
    "worker",
}  # those that run the model
SIMULATED_TEXTS = 50  # the example texts the model alone is simulated with (record i: text i % 50)


def floor_consumer(bootstrap: str, group: str, settings: Settings) -> AIOKafkaConsumer:
    """A group consumer configured as the worker's (read_committed, its fetch wait and size),
    which commits only when told."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        fetch_max_bytes=settings.fetch_max_bytes,
    )


async def consume(consumer: AIOKafkaConsumer, take: Callable[[Any], Awaitable[None]]) -> None:
    """Hand each record fetched to ``take``, and commit the positions fetched every second (a
    bench needs no more), until cancelled."""
    last_commit = time.monotonic()
    while True:
        batches = await consumer.getmany(timeout_ms=1000)
        for records in batches.values():
            for record in records:
                await take(record)
        if time.monotonic() - last_commit >= COMMIT_SECONDS:
            await consumer.commit()
            last_commit = time.monotonic()


def floor_embedder(settings: Settings) -> Any:
    """The embedder as shipped, for the floors that run the model."""
    from worker.embedding import EmbedderConfig, load_embedder

    embedder, why = load_embedder(EmbedderConfig.from_settings(settings))
    if embedder is None:
        raise SystemExit(f"the model did not load: {why}")
    return embedder


async def clients(bootstrap: str, source: str, output: str, group: str, model: bool) -> None:
    """The ``clients`` subject: consume, publish each value and await its ack, commit; with
    ``model``, each record's text is embedded first (the model as shipped)."""
    settings = Settings()
    embedder = floor_embedder(settings) if model else None
    consumer = floor_consumer(bootstrap, group, settings)
    consumer.subscribe([source])
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0
    )
    await producer.start()
    await consumer.start()
    print("ready", flush=True)

    async def publish(record: Any) -> None:
        """The record's text embedded (in arrival order, on the model's thread), then a copy
        published and its ack awaited: records run side by side, as in the worker."""
        if embedder is not None:
            text = parse_trace(record.value).embedding_text()
            await asyncio.wrap_future(embedder.submit([text]))
        source = [
            ("kp-source-partition", str(record.partition).encode()),
            ("kp-source-offset", str(record.offset).encode()),
        ]
        await (await producer.send(output, record.value, key=record.key, headers=source))

    running: set[asyncio.Task[None]] = set()

    async def take(record: Any) -> None:
        task = asyncio.ensure_future(publish(record))
        running.add(task)
        task.add_done_callback(running.discard)

    try:
        await consume(consumer, take)
    finally:
        await consumer.stop()
        await producer.stop()


def librdkafka_consumer(bootstrap: str, group: str, settings: Settings) -> Any:
    """``floor_consumer`` on confluent-kafka (librdkafka)."""
    from confluent_kafka import Consumer

    return Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "fetch.wait.max.ms": settings.fetch_max_wait_ms,
        "fetch.max.bytes": settings.fetch_max_bytes,
    })  # fmt: skip


def librdkafka_producer(bootstrap: str) -> Any:
    """A producer on confluent-kafka configured as the worker's (acks=all, idempotent,
    linger 0)."""
    from confluent_kafka import Producer

    return Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": 0,
    })  # fmt: skip


def librdkafka_consume(
    consumer: Any, take: Callable[[list[Any]], None], tick: Callable[[], None] = lambda: None
) -> None:
    """``consume`` on confluent-kafka: each batch fetched (a record, then what else is already
    there) to ``take``, ``tick`` after every wait, and the positions fetched committed every
    second, until the process ends."""
    last_commit = time.monotonic()
    while True:
        record = consumer.poll(0.1)
        if record is not None:
            batch = [record, *consumer.consume(num_messages=500, timeout=0)]
            take([r for r in batch if r.error() is None])
        tick()
        if time.monotonic() - last_commit >= COMMIT_SECONDS:
            if consumer.assignment():
                consumer.commit(asynchronous=True)
            last_commit = time.monotonic()


def librdkafka(bootstrap: str, source: str, output: str, group: str, model: bool) -> None:
    """The ``librdkafka`` subjects: ``clients`` and ``clients+model`` on confluent-kafka's
    clients (librdkafka, C) instead of aiokafka, configured alike (read_committed, the worker's
    fetch wait, acks=all, idempotent, linger 0, offsets committed every second). A record's
    text is embedded on the model's thread, which then hands its copy to the producer
    (thread-safe); this thread waits for records and serves the producer's acks."""
    settings = Settings()
    embedder = floor_embedder(settings) if model else None
    consumer = librdkafka_consumer(bootstrap, group, settings)
    producer = librdkafka_producer(bootstrap)
    consumer.subscribe([source])
    while not consumer.assignment():
        consumer.poll(0.1)
    print("ready", flush=True)

    def publish(record: Any) -> None:
        source = [
            ("kp-source-partition", str(record.partition()).encode()),
            ("kp-source-offset", str(record.offset()).encode()),
        ]
        producer.produce(output, record.value(), key=record.key(), headers=source)

    def take(record: Any) -> None:
        if embedder is None:
            publish(record)
            return
        text = parse_trace(record.value()).embedding_text()
        embedder.submit([text]).add_done_callback(lambda _: publish(record))

    def take_all(batch: list[Any]) -> None:
        for record in batch:
            take(record)

    librdkafka_consume(consumer, take_all, tick=lambda: producer.poll(0))


async def pipeline(bootstrap: str) -> None:
    """The ``clients+pipeline`` subject: the worker's own pipeline as shipped (decode, embed,
    novelty in offset order, score, publish each output with its cache entry, metrics) on the
    worker's settings, fed by a bare aiokafka consumer instead of the worker's group consumer.
    Offsets: the positions fetched, every second."""
    settings = load_settings()
    _, store = await ensure_topics(settings, list(output_topics(settings).values()))
    observer = MetricsObserver(settings.latency_budget_seconds)
    publisher = Publisher(settings, observer=observer, store=store)
    reader = PartitionLogReader(settings, group_id=settings.group_id)
    await publisher.start()
    await reader.start()
    stream = StreamScorer(
        build_scorer(settings), reader, publisher, settings.max_in_flight_records,
        observer=observer, store=store,
    )  # fmt: skip

    class Assigned(ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: Any) -> None:
            stream.partitions.forget([(tp.topic, tp.partition) for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            stream.assigned(sorted((tp.topic, tp.partition) for tp in assigned))

    consumer = floor_consumer(bootstrap, settings.group_id, settings)
    consumer.subscribe([settings.input_topic], listener=Assigned())
    await consumer.start()
    print("ready", flush=True)

    async def take(record: Any) -> None:
        await stream.submit([source_record(record)], [time.monotonic()], [None])

    try:
        await consume(consumer, take)
    finally:
        await consumer.stop()
        await stream.stop()
        await stop_all(reader, publisher)


class LibrdkafkaPublisher:
    """The worker's ``RoutedPublisher`` on confluent-kafka's producer, as the ``Publisher`` is
    configured (acks=all, idempotent, linger 0): each output and its cache entry handed over at
    once, then their acks awaited. A bench's: no retries, no refusals replaced."""

    def __init__(self, bootstrap: str, settings: Settings, store: Any) -> None:
        import threading

        self._producer = librdkafka_producer(bootstrap)
        self._topics = output_topics(settings)
        self._store = store
        # acks come back on the thread that polls the producer, which wakes at each one; it
        # runs as long as the subject's process
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while True:
            self._producer.poll(0.5)

    async def publish(self, routed: Any) -> None:
        loop = asyncio.get_running_loop()
        acks: list[asyncio.Future[None]] = []

        def produce(topic: str, value: Any, key: Any, **extra: Any) -> None:
            ack = loop.create_future()

            def delivered(error: Any, _message: Any) -> None:
                loop.call_soon_threadsafe(
                    ack.set_exception if error else ack.set_result,
                    RuntimeError(str(error)) if error else None,
                )

            self._producer.produce(topic, value, key=key, on_delivery=delivered, **extra)
            acks.append(ack)

        for record in routed:
            produce(self._topics[record.decision], record.value, record.key,
                    headers=list(record.headers))  # fmt: skip
        for record in routed:
            if self._store is not None and record.cache_entry is not None:
                key, value = record.cache_entry
                partition = self._store.partition_of(record.source.partition)
                produce(self._store.name, value, key, partition=partition)
        await asyncio.gather(*acks)


async def librdkafka_pipeline(bootstrap: str) -> None:
    """The ``librdkafka+pipeline`` subject: ``clients+pipeline`` with confluent-kafka's
    consumer and producer (librdkafka) in place of aiokafka's. The consumer waits for records
    on a thread of its own and hands each batch to the event loop; offsets: the positions
    fetched, every second."""
    import threading

    settings = load_settings()
    _, store = await ensure_topics(settings, list(output_topics(settings).values()))
    observer = MetricsObserver(settings.latency_budget_seconds)
    publisher = LibrdkafkaPublisher(bootstrap, settings, store)
    reader = PartitionLogReader(settings, group_id=settings.group_id)  # restores only
    await reader.start()
    stream = StreamScorer(
        build_scorer(settings), reader, publisher, settings.max_in_flight_records,
        observer=observer, store=store,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    assigned = threading.Event()

    def on_assign(_consumer: Any, partitions: Any) -> None:
        tps = sorted((tp.topic, tp.partition) for tp in partitions)
        loop.call_soon_threadsafe(stream.assigned, tps)
        assigned.set()

    consumer = librdkafka_consumer(bootstrap, settings.group_id, settings)
    consumer.subscribe([settings.input_topic], on_assign=on_assign)
    batches: asyncio.Queue[list[Any]] = asyncio.Queue()

    def hand_over(batch: list[Any]) -> None:
        loop.call_soon_threadsafe(batches.put_nowait, batch)

    async def feed() -> None:
        """Each record to the pipeline in the order fetched, as ``clients+pipeline`` does."""
        while True:
            batch = await batches.get()
            now = time.monotonic()
            for record in batch:
                source = SourceRecord(
                    topic=record.topic(), partition=record.partition(), offset=record.offset(),
                    timestamp_ms=record.timestamp()[1], key=record.key(), value=record.value(),
                    headers=tuple((k, v) for k, v in record.headers() or ()),
                )  # fmt: skip
                await stream.submit([source], [now], [None])

    threading.Thread(target=librdkafka_consume, args=(consumer, hand_over), daemon=True).start()
    await asyncio.to_thread(assigned.wait)
    print("ready", flush=True)
    await feed()  # until terminated


async def wait_outputs(bootstrap: str, topics: _worker.Topics, count: int, timeout: float) -> None:
    """Until the output topics hold ``count`` records (their end offsets, four times a second:
    the outputs themselves are read only after the phase, as in the latency bench)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(t, p) for t in topics.outputs for p in range(_worker.PARTITIONS)
        ]
        deadline = time.monotonic() + timeout
        while sum((await consumer.end_offsets(partitions)).values()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} outputs expected in {timeout:.0f} s")
            await asyncio.sleep(0.25)
    finally:
        await consumer.stop()


def start_subject(name: str, bootstrap: str, topics: _worker.Topics) -> tuple[object, int]:
    """The subject's process, started and ready; (handle, pid)."""
    if name.startswith(("clients", "librdkafka")):
        # the dead-letter topic, where an output names its source in headers, as the worker's do
        output = next(t for t, decision in topics.outputs.items() if decision == "dead_letter")
        process = subprocess.Popen(
            [sys.executable, __file__, "--role", name, "--bootstrap", bootstrap,
             "--input", topics.input, "--output", output, "--group", f"{topics.prefix}-g"],
            stdout=subprocess.PIPE, text=True,
            env={**os.environ, **topics.worker_env(), "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        )  # fmt: skip
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the clients subject did not start")
        return process, process.pid
    env = {} if name == "worker" else {"KP_MODEL_PATH": "/etc/hostname"}  # not a model
    worker = _worker.Worker(bootstrap, **{**topics.worker_env(), **env})
    worker.start()
    asyncio.run(worker.wait_serving())
    worker.wait_ready()
    assert worker.pid is not None
    return worker, worker.pid


def stop_subject(handle: object) -> None:
    if isinstance(handle, subprocess.Popen):
        handle.terminate()
        handle.wait(30)
    else:
        handle.cleanup()  # type: ignore[attr-defined]


def phase(
    bootstrap: str, name: str, rate: float, count: int, seed: int, cpu: set[int]
) -> dict[str, Any]:
    config = latency_under_load.Config(
        name, {}, _worker.Topics(f"bench-floor-{uuid.uuid4().hex[:8]}")
    )
    asyncio.run(_worker.create_topics(bootstrap, config.topics))
    records = _corpus.corpus(count, f"floor-{uuid.uuid4().hex[:6]}")
    with _machine.pinned(cpu):
        handle, pid = start_subject(name, bootstrap, config.topics)
    try:
        time.sleep(3.0)
        cpu_before, threads_before = _machine.cpu_seconds(pid), _machine.thread_schedstats(pid)
        started = time.monotonic()
        sent, _ = asyncio.run(
            latency_under_load.paced(bootstrap, config, records, rate, "poisson", seed)
        )
        asyncio.run(wait_outputs(bootstrap, config.topics, count, 120 + count / rate))
        wall = time.monotonic() - started
        used = _machine.cpu_seconds(pid) - cpu_before
        threads_after = _machine.thread_schedstats(pid)
        threads = _machine.thread_ms_per_item(threads_before, threads_after, pid, count)
        # the busiest thread but the event loop: the model's, in a subject that runs it
        deltas = _machine.thread_deltas(threads_before, threads_after)
        busiest = max((on for tid, (on, _) in deltas.items() if tid != pid), default=0.0)
    finally:
        stop_subject(handle)
    outputs = asyncio.run(latency_under_load.read_outputs(bootstrap, config, sent))
    latency = [o.timestamp - s.sent_at for o, s in zip(outputs, sent, strict=True)]
    return {
        "ms": used * 1000 / count,
        "beyond model": (used - busiest) * 1000 / count,
        "cores": used / wall,
        "threads": threads,
        "sent": sent,
        "latency": latency,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rates", default="5.5,11")
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--cpu", type=_machine.cpu_list, default={1})
    parser.add_argument("--others-cpus", type=_machine.cpu_list, default={0})
    parser.add_argument("--subjects", default="clients,no model,clients+model,worker")
    for internal in ("--role", "--bootstrap", "--input", "--output", "--group"):
        parser.add_argument(internal, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "librdkafka+pipeline":
        asyncio.run(librdkafka_pipeline(args.bootstrap))
        return
    if args.role == "clients+pipeline":
        asyncio.run(pipeline(args.bootstrap))
        return
    if args.role in ("librdkafka", "librdkafka+model"):
        model = args.role == "librdkafka+model"
        librdkafka(args.bootstrap, args.input, args.output, args.group, model)
        return
    if args.role is not None:
        model = args.role == "clients+model"
        asyncio.run(clients(args.bootstrap, args.input, args.output, args.group, model))
        return
    print(_machine.machine_line())
    os.sched_setaffinity(0, args.others_cpus)  # the broker, started next, inherits them
    model = latency_under_load.model_reference(args.cpu)
    broker = ApacheKafka()
    broker.start()
    try:
        for seed, rate in enumerate(float(r) for r in args.rates.split(",")):
            with _machine.pinned(args.cpu):
                engine = latency_under_load.measure_model(SIMULATED_TEXTS, repeats=3)
            at_start = model(latency_under_load.MODEL_TEXTS)  # the engine's speed, in its units
            for name in args.subjects.split(","):
                before = model(latency_under_load.MODEL_TEXTS)
                result = phase(broker.bootstrap_servers, name, rate, args.records, seed, args.cpu)
                alone = (before + model(latency_under_load.MODEL_TEXTS)) / 2
                print(
                    f"{rate:5.1f}/s {name:13s} {result['ms']:6.2f} CPU ms a record, "
                    f"{result['ms'] / alone:.3f}x the model's {alone:.1f} (before and after), "
                    f"{result['cores']:.3f} cores; by thread: {result['threads']}",
                    flush=True,
                )
                if name in MODEL_SUBJECTS:
                    print(
                        f"{'':22s}beyond the model's thread: {result['beyond model']:.2f} "
                        "CPU ms a record",
                        flush=True,
                    )
                p50, p95, p99 = _metrics.percentiles(result["latency"])
                simulated = latency_under_load.simulated_p99(
                    engine, result["sent"], alone / at_start
                )
                from_start = latency_under_load.simulated_p99(engine, result["sent"])
                print(
                    f"{'':22s}send->stamp p50/p95/p99 {p50 * 1000:.1f} / {p95 * 1000:.1f} / "
                    f"{p99 * 1000:.1f} ms; p99 / the model alone simulated on the same arrivals "
                    f"at its speed around the phase ({simulated * 1000:.1f} ms) = "
                    f"{p99 / simulated:.2f} (at its speed when the rate's phases began: "
                    f"{p99 / from_start:.2f})",
                    flush=True,
                )
    finally:
        broker.stop()
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
