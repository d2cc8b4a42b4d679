"""At-least-once on a real broker: a worker killed while its outputs wait on the broker has
committed none of their offsets, and the next worker publishes every one of them.

The worker reaches the broker through ``tcp_proxy.TcpProxy``, which holds every produce
request (the worker's publishes) while everything else passes: the consumer fetches, the
group commits, the log is read. So the worker scores records whose outputs the broker never
acknowledges, for as long as the test likes; it is then killed (SIGKILL) or stopped (SIGTERM)
in that state. The held publishes are dropped with the dead worker's connections.
"""

from __future__ import annotations

import asyncio
import signal
import time

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from worker.dev.process import LOCAL_GROUP_SETTINGS, WorkerProcess
from worker.io.shutdown import EXIT_DEADLINE

from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.tcp_proxy import PRODUCE, TcpProxy
from support.traces import make_trace
from support.workers import worker_topics

pytestmark = pytest.mark.broker

PARTITIONS = 2
RECORDS = 12
# Long enough for several of the worker's commit intervals to pass while publishes are held.
COMMIT_INTERVALS_WAITED = 5


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    """The group's committed offset of each input partition (None: nothing committed)."""

    async def ask() -> dict[int, int | None]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            return {
                p: await consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)
            }
        finally:
            await consumer.stop()

    return asyncio.run(ask())


def scoring_with_publishes_held(
    proxy: TcpProxy, bootstrap: str, prefix: str, **settings: str
) -> tuple[WorkerProcess, dict[str, str], dict[str, str]]:
    """A worker that has taken the input backlog and waits on the broker for every output."""
    env, outputs = worker_topics(prefix, PARTITIONS, **settings)
    create_topics(bootstrap, [env["KP_INPUT_TOPIC"], *outputs], PARTITIONS)
    produce(
        bootstrap,
        env["KP_INPUT_TOPIC"],
        [
            (f"k{i}", orjson.dumps(make_trace(objective=f"Order {i}")), i % PARTITIONS, None)
            for i in range(RECORDS)
        ],
    )
    proxy.hold(PRODUCE)
    worker = WorkerProcess(bootstrap, **env).start()
    deadline = time.monotonic() + 90
    while proxy.held_requests == 0:
        assert time.monotonic() < deadline, f"the worker never published:\n{worker.tail()}"
        assert worker.alive(), worker.tail()
        time.sleep(0.05)
    commit_interval = float(LOCAL_GROUP_SETTINGS["KP_COMMIT_INTERVAL_SECONDS"])
    time.sleep(COMMIT_INTERVALS_WAITED * commit_interval)
    return worker, env, outputs


def no_commits(offsets: dict[int, int | None]) -> str:
    return (
        f"offsets committed while their outputs waited on the broker: {offsets} "
        "(a crash now loses those records)"
    )


def test_a_kill_while_outputs_wait_on_the_broker_loses_nothing(proxied, new_topic_name) -> None:
    proxy, bootstrap = proxied
    worker, env, outputs = scoring_with_publishes_held(proxy, bootstrap, new_topic_name("alo"))
    try:
        offsets = committed(bootstrap, env["KP_GROUP_ID"], env["KP_INPUT_TOPIC"])
    finally:
        worker.kill()  # between publish and acknowledgement: the broker never answered
        proxy.cut()  # the dead worker's held publishes go with its connections
        proxy.release()
        proxy.restore()
    assert offsets == dict.fromkeys(range(PARTITIONS)), no_commits(offsets)

    expected = {(i % PARTITIONS, i // PARTITIONS) for i in range(RECORDS)}
    with WorkerProcess(bootstrap, **env):
        found = collect_outputs(bootstrap, outputs, expected, timeout=90)
    assert expected <= {(o.source_partition, o.source_offset) for o in found}


def test_a_sigterm_while_outputs_wait_on_the_broker_commits_none_of_them(
    proxied, new_topic_name
) -> None:
    proxy, bootstrap = proxied
    worker, env, _ = scoring_with_publishes_held(
        proxy, bootstrap, new_topic_name("alo"), KP_SHUTDOWN_TIMEOUT_SECONDS="6"
    )
    try:
        worker.signal(signal.SIGTERM)
        assert worker.process is not None
        code = worker.process.wait(30)
    finally:
        worker.kill()
        proxy.cut()
        proxy.release()
        proxy.restore()
    assert code in (0, EXIT_DEADLINE), worker.tail()
    offsets = committed(bootstrap, env["KP_GROUP_ID"], env["KP_INPUT_TOPIC"])
    assert offsets == dict.fromkeys(range(PARTITIONS)), no_commits(offsets)
