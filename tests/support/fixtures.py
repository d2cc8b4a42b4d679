"""The tests' fixtures, registered by ``tests/conftest.py``: one Kafka broker for the whole
test session, unique topic names, and settings isolated from the environment.

Which broker, in order:
1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (an existing cluster; probed first).
2. A Kafka container through testcontainers, if it is installed and a Docker engine answers.
3. Apache Kafka as a JVM process (``support.apache_kafka``), where Java and Maven are installed.
4. The embedded Kafka-compatible broker (``worker.dev.embedded_broker``), on a free loopback port.

``KAFKA_TEST_BROKER=docker``, ``=kafka`` or ``=embedded`` skips the detection and picks one of
the last three. The embedded broker's smoke tier (the demo's broker) takes
``embedded_bootstrap``, which is always that broker.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator

import pytest

from worker.dev.embedded_broker import EmbeddedBroker

from support.apache_kafka import ApacheKafka
from support.broker_probe import wait_for_kafka

KAFKA_IMAGE = os.environ.get("KP_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.6.1")
READY_TIMEOUT_SECONDS = 30.0
MAX_XDIST_WORKERS = 3


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many xdist workers ``-n auto`` (in pyproject's addopts) starts.

    One more than the cores, up to three: each starts its own session broker, and the broker
    tests start worker processes of their own, but they spend much of their time waiting on
    those (two workers kept 1.3 of 2 cores busy, for 5:08 wall; three kept 1.6 busy, for
    3:59, and four 1.8, for 3:47). None (the tests run in this process) with ``-s``, whose
    point is to watch the output, or when slow soaks may be selected: they time recoveries
    and memory, and want the machine to themselves.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides this, as it does xdist's own default.
    """
    configured = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if configured:
        return int(configured)
    if config.option.capture == "no" or "not slow" not in (config.option.markexpr or ""):
        return 0
    return max(1, min(MAX_XDIST_WORKERS, len(os.sched_getaffinity(0)) + 1))


# The demo's 20 ms keeps its latency low on the embedded broker, which holds a fetch of several
# partitions for the whole wait; an idle worker and the broker then poll at 0.094 core between
# them, at 100 ms at 0.026. The tests' workers are mostly idle, waiting on their test: with 100
# ms the embedded-broker suite took 496 and 531 CPU seconds (5:46, 6:06), with 20 ms 574 and 591
# (6:19, 6:24; 2 cores, 2026-11-30). The demo's own test runs the demo, with its 20 ms.
EMBEDDED_TEST_FETCH_WAIT_MS = "100"


def pytest_configure(config: pytest.Config) -> None:
    """Workers the tests start on the embedded broker take its settings
    (``EmbeddedBroker.worker_settings``) but a fetch wait of 100 ms; a setting the environment
    gives wins."""
    if chosen_broker() == "embedded":
        wait = {"KP_FETCH_MAX_WAIT_MS": EMBEDDED_TEST_FETCH_WAIT_MS}
        for name, value in {**EmbeddedBroker.worker_settings, **wait}.items():
            os.environ.setdefault(name, value)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a running Kafka-protocol broker shared by every broker test."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        wait_for_kafka(configured, timeout=READY_TIMEOUT_SECONDS)
        yield configured
        return

    choice = chosen_broker()
    if choice == "docker":
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE) as kafka:
            bootstrap = kafka.get_bootstrap_server()
            wait_for_kafka(bootstrap, timeout=READY_TIMEOUT_SECONDS)
            yield bootstrap
    elif choice == "kafka":
        with ApacheKafka() as cluster:
            yield cluster.bootstrap_servers
    else:
        with EmbeddedBroker() as broker:
            yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def embedded_bootstrap() -> Iterator[str]:
    """The embedded broker (the demo's), whichever broker the other tests run against."""
    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


def dedicated_broker(
    port: int | None = None, advertised_port: int | None = None
) -> ApacheKafka | EmbeddedBroker:
    """A broker of a test's own (one it stops or puts a proxy in front of): Apache Kafka
    wherever the session's broker is not the embedded one and Java is installed. Use it as a
    context manager; it has ``port``, ``bootstrap_servers`` and ``stop()``."""
    if chosen_broker() != "embedded" and shutil.which("java") and shutil.which("mvn"):
        return ApacheKafka(port=port, advertised_port=advertised_port)
    return EmbeddedBroker(port=port, advertised_port=advertised_port)


def chosen_broker() -> str:
    """Which broker ``kafka_bootstrap`` starts: "docker", "kafka" or "embedded" (or "external"
    when KAFKA_BOOTSTRAP_SERVERS names one)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external"
    choice = os.environ.get("KAFKA_TEST_BROKER", "").lower()
    if choice in ("docker", "kafka", "embedded"):
        return choice
    if _docker_usable():
        return "docker"
    if shutil.which("java") and shutil.which("mvn"):
        return "kafka"
    return "embedded"


@pytest.fixture
def new_topic_name() -> Callable[[str], str]:
    """Returns a factory of topic names unique to this run: ``t-<8 hex>`` or ``<prefix>-<8 hex>``.

    Every test gets fresh topics, so tests sharing the session broker never see each
    other's records.
    """

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def isolated_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No KP_* settings from the environment; the CLI's logging setup is undone afterwards."""
    for name in list(os.environ):
        if name.upper().startswith("KP_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _docker_usable() -> bool:
    """testcontainers is installed and a Docker engine answers a ping (quickly)."""
    if importlib.util.find_spec("testcontainers") is None:
        return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no socket, permission denied, engine down: all mean "not usable"
        return False
