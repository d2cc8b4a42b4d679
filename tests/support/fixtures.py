"""The tests' fixtures, registered by ``tests/conftest.py``: one Kafka broker for the whole
test session, unique topic names, and settings isolated from the environment.

Which broker, in order:
1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (an existing cluster; probed first).
2. A Kafka container through testcontainers, if it is installed and a Docker engine answers.
3. The embedded Kafka-compatible broker (``worker.dev.embedded_broker``), on a free loopback port.

``KP_TEST_BROKER=embedded`` or ``=docker`` skips the detection and picks one of the last two.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from worker.dev.embedded_broker import EmbeddedBroker

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


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a running Kafka-protocol broker shared by every broker test."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        wait_for_kafka(configured, timeout=READY_TIMEOUT_SECONDS)
        yield configured
        return

    choice = os.environ.get("KP_TEST_BROKER", "").lower()
    if choice == "docker" or (choice != "embedded" and _docker_usable()):
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE) as kafka:
            bootstrap = kafka.get_bootstrap_server()
            wait_for_kafka(bootstrap, timeout=READY_TIMEOUT_SECONDS)
            yield bootstrap
        return

    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


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
