"""A worker reaches its broker over TLS (KP_SECURITY_PROTOCOL=SSL, KP_SSL_CAFILE), on every
supported Python, with a CA as many Kafka clusters have: basic constraints not marked
critical, which Kafka's own clients accept and Python 3.13's default context refuses.

The broker is the embedded one behind a TLS-terminating proxy that it advertises, so every
client, the test's own included, connects with TLS.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from worker.dev.process import WorkerProcess, free_loopback_port
from worker.io.kafka import client_config
from worker.settings import load_settings

from support.fixtures import dedicated_broker
from support.tcp_proxy import TcpProxy
from support.tls import make_broker_certificates
from support.traces import make_trace
from support.workers import worker_topics


async def _score_one(config: dict[str, object], input_topic: str, outputs: list[str]) -> str:
    """Publish one trace and return the topic its output arrived in."""
    producer = AIOKafkaProducer(**config)
    await producer.start()
    try:
        await producer.send_and_wait(input_topic, orjson.dumps(make_trace()), key=b"tls")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(*outputs, **config, auto_offset_reset="earliest")
    await consumer.start()
    try:
        async with asyncio.timeout(60):
            message = await consumer.getone()
    finally:
        await consumer.stop()
    return str(message.topic)


@pytest.mark.broker
def test_the_worker_scores_over_tls_with_a_ca_kafka_clients_accept(tmp_path: Path) -> None:
    certificates = make_broker_certificates(tmp_path)
    proxy_port = free_loopback_port()
    with (
        dedicated_broker(advertised_port=proxy_port) as broker,
        TcpProxy(broker.port, proxy_port, tls=certificates.server_context()),
    ):
        bootstrap = f"127.0.0.1:{proxy_port}"
        env, outputs = worker_topics(
            f"tls-{uuid.uuid4().hex[:8]}",
            partitions=1,
            KP_SECURITY_PROTOCOL="SSL",
            KP_SSL_CAFILE=str(certificates.ca),
        )
        worker = WorkerProcess(bootstrap, **env).start()
        try:
            worker.wait_ready(timeout=60)
            settings = load_settings(
                kafka_bootstrap_servers=bootstrap,
                security_protocol="SSL",
                ssl_cafile=certificates.ca,
            )
            topic = asyncio.run(
                _score_one(client_config(settings), env["KP_INPUT_TOPIC"], list(outputs))
            )
            assert outputs[topic] in ("accepted", "rejected")
            worker.signal(signal.SIGTERM)
            assert worker.process is not None
            assert worker.process.wait(60) == 0, worker.tail()
        finally:
            worker.stop()
