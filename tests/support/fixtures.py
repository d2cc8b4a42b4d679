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

import functools
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
from support.paths import TESTS

KAFKA_IMAGE = os.environ.get("KP_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.6.1")
READY_TIMEOUT_SECONDS = 30.0
# The longest test files, longest first: xdist hands whole files to its workers in collection
# order, so these go out first and the last files given out are short ones, which lets the
# workers finish together: on 2 cores, the embedded broker, four workers, the suite took 5:15
# and 5:18 this way, and 5:35 and 5:44 in plain collection order (2026-11-30). Each file's wall
# seconds (the order measured again after the determinism topic shrank): 80 down to 12. Apache
# Kafka's run keeps collection order: 7:56 that day, 8:25 in this one (three workers, one run
# each). A file not named keeps its place after the named ones; the list orders the run, it
# never selects from it.
LONGEST_FILES = (
    "chaos/test_broker_faults.py",
    "broker/test_rescore_broker.py",
    "broker/test_worker_integration.py",
    "broker/test_determinism_restarts.py",
    "broker/test_cache_store_broker.py",
    "broker/test_observability_live.py",
    "chaos/test_at_least_once_broker.py",
    "broker/test_framing_broker.py",
    "broker/test_prometheus_live.py",
    "broker/test_determinism.py",
    "broker/test_poison_pills_broker.py",
    "unit/embedding/test_embedder.py",
    "unit/test_public_api.py",
    "unit/core/test_properties.py",
    "broker/test_determinism_rebalance.py",
    "unit/cli/test_report.py",
    "chaos/test_crash_safety.py",
    "broker/test_clean_stop_log.py",
    "unit/model_build/test_model_build.py",
    "broker/test_scale.py",
    "unit/core/test_duplicate_keys.py",
    "unit/cli/test_first_contact.py",
    "unit/test_config_security.py",
    "unit/cli/test_cli_contract.py",
    "unit/io/test_ops_port.py",
    "unit/test_license_and_backoff.py",
)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many xdist workers ``-n auto`` (in pyproject's addopts) starts.

    Each starts its own session broker, and the broker tests start worker processes of their
    own, but they spend much of their time waiting on those. On the embedded broker two more
    than the cores, up to four: on 2 cores (2026-11-30, the same hour) four workers took 5:35
    and 5:44, three 6:25 and 6:48. A JVM broker per worker (Apache Kafka, a container) costs
    CPU of its own, so one more than the cores there, up to three: four took 9:02 on Apache
    Kafka where three took 8:25. None (the tests run in this process) with ``-s``, whose point
    is to watch the output, or when slow soaks may be selected: they time recoveries and
    memory, and want the machine to themselves.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides this, as it does xdist's own default.
    """
    configured = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if configured:
        return int(configured)
    if config.option.capture == "no" or "not slow" not in (config.option.markexpr or ""):
        return 0
    extra, most = (2, 4) if chosen_broker() == "embedded" else (1, 3)
    return max(1, min(most, len(os.sched_getaffinity(0)) + extra))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On the embedded broker, the files of ``LONGEST_FILES`` first, in its order
    (longest-first scheduling)."""
    if chosen_broker() != "embedded":
        return
    rank = {TESTS / name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


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


@functools.cache
def _docker_usable() -> bool:
    """testcontainers is installed and a Docker engine answers a ping (quickly): asked once a
    process, however many hooks and skip conditions ask which broker runs."""
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
