"""Apache Kafka, the broker users run, as plain JVM processes on loopback ports (KRaft, no
ZooKeeper, no Docker): one combined broker+controller node, or a cluster of three.

The jars are Apache Kafka's own, from Maven Central, at the version pinned in
``tests/support/kafka/pom.xml``; the first use copies them into a cache folder
(``KAFKA_JARS_CACHE``, default ``~/.cache/kp-scorer/kafka``) and later uses take the cache without
asking the network. Each node's data lives in a temporary folder removed on :meth:`stop`.

By hand, a broker that runs until Ctrl-C and prints its bootstrap address::

    python tests/support/apache_kafka.py            # one node
    python tests/support/apache_kafka.py --nodes 3  # three nodes, replication factor 3
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KAFKA_FILES = Path(__file__).resolve().parent / "kafka"
POM = KAFKA_FILES / "pom.xml"
LOG_CONFIG = KAFKA_FILES / "log4j2.properties"
HEAP = "-Xmx384m"
STOP_SECONDS = 15.0
_READY_MARKER = "Kafka Server started"


class KafkaStartError(RuntimeError):
    """The broker could not be fetched, formatted or started; the message quotes its log."""


def kafka_version() -> str:
    """The pinned Apache Kafka version (``kafka.version`` in the POM)."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise KafkaStartError(f"{POM} names no <kafka.version>")
    return match.group(1)


def kafka_jars() -> Path:
    """The folder of the pinned version's jars, copied from Maven on first use."""
    cache = Path(os.environ.get("KAFKA_JARS_CACHE", Path.home() / ".cache/kp-scorer/kafka"))
    libs = cache / kafka_version() / "libs"
    done = libs / ".complete"
    if done.exists():
        return libs
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise KafkaStartError("Apache Kafka for the tests needs Java 17+ and Maven (mvn)")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
    command = [
        "mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise KafkaStartError(f"fetching Apache Kafka's jars failed:\n{result.stdout[-3000:]}")
    libs.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(libs, ignore_errors=True)
    shutil.move(str(staging), libs)
    done.touch()
    return libs


def _java_command(main_class: str, *args: str) -> list[str]:
    return [
        "java", HEAP, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG_CONFIG}", "-cp", f"{kafka_jars()}/*", main_class, *args,
    ]  # fmt: skip


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class KafkaNode:
    """One combined broker+controller process."""

    node_id: int
    port: int
    controller_port: int
    internal_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    log_offset: int = 0

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", errors="replace")
        return ""


@dataclass(eq=False)
class ApacheKafka:
    """A KRaft cluster of ``nodes`` combined nodes on loopback ports.

    ``broker_config`` adds or replaces server properties on every node (e.g. a listener's
    security settings). Internal topics are replicated to every node, up to three. A single
    node may take a fixed ``port``, and advertise ``advertised_port`` to clients (a proxy in
    front of it).
    """

    nodes: int = 1
    broker_config: Mapping[str, str] = field(default_factory=dict)
    port: int | None = None
    advertised_port: int | None = None
    # More arguments to the storage format, e.g. ``--add-scram`` users.
    format_args: Sequence[str] = ()
    # The listener clients use, and its security protocol (listeners are all on 127.0.0.1).
    client_listener: str = "PLAINTEXT"
    client_protocol: str = "PLAINTEXT"
    # librdkafka settings the readiness check needs beyond the address (credentials, CA).
    admin_config: Mapping[str, str] = field(default_factory=dict)
    members: list[KafkaNode] = field(default_factory=list, init=False)
    _root: Path | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        """The first node's process id (its CPU is the broker's, for one node)."""
        process = self.members[0].process if self.members else None
        return None if process is None else process.pid

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.members)

    def start(self, timeout: float = 90.0) -> ApacheKafka:
        """Format each node's storage, start them together, and return once every broker is
        listed by a Metadata request."""
        self._root = Path(tempfile.mkdtemp(prefix="kp-kafka-"))
        ports = _free_ports(3 * self.nodes)
        if self.port is not None:
            ports[0] = self.port
        self.members = [
            KafkaNode(i + 1, *ports[3 * i : 3 * i + 3], directory=self._root / f"node-{i + 1}")
            for i in range(self.nodes)
        ]
        cluster_id = _cluster_id()
        formats = []
        for node in self.members:
            node.directory.mkdir(parents=True)
            (node.directory / "server.properties").write_text(self._properties(node))
            formats.append(
                subprocess.Popen(
                    _java_command(
                        "kafka.tools.StorageTool",
                        "format",
                        "-t",
                        cluster_id,
                        "-c",
                        str(node.directory / "server.properties"),
                        "--ignore-formatted",
                        *self.format_args,
                    ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        for node, formatting in zip(self.members, formats, strict=True):
            output, _ = formatting.communicate(timeout=timeout)
            if formatting.returncode != 0:
                self.stop()
                raise KafkaStartError(f"formatting node {node.node_id} failed:\n{output.decode()}")
        _running.add(self)
        for node in self.members:
            self.start_node(node.node_id, wait=False)
        self.wait_ready(timeout)
        self.port = self.members[0].port
        return self

    def start_node(self, node_id: int, wait: bool = True, timeout: float = 60.0) -> None:
        """Start (or restart, on the same data) one node."""
        node = self.node(node_id)
        if node.alive():
            return
        node.log_offset = node.log_path.stat().st_size if node.log_path.exists() else 0
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                _java_command("kafka.Kafka", str(node.directory / "server.properties")),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until each node's log says started and a Metadata request lists every broker."""
        deadline = time.monotonic() + timeout
        for node in self.members:
            while _READY_MARKER not in node.log_text():
                if not node.alive():
                    tail = node.log_text()[-3000:]  # before stop() removes the log
                    self.stop()
                    raise KafkaStartError(
                        f"Apache Kafka node {node.node_id} exited during start-up:\n{tail}"
                    )
                if time.monotonic() > deadline:
                    tail = node.log_text()[-3000:]
                    self.stop()
                    raise KafkaStartError(
                        f"node {node.node_id} not started in {timeout:g} s:\n{tail}"
                    )
                time.sleep(0.05)
        while len(self.broker_ids()) < len(self.members):
            if time.monotonic() > deadline:
                raise KafkaStartError(f"Metadata did not list {len(self.members)} brokers")
            time.sleep(0.1)

    def broker_ids(self) -> set[int]:
        """The brokers a Metadata request to any live node lists."""
        from confluent_kafka.admin import AdminClient

        live = ",".join(node.address for node in self.members if node.alive())
        if not live:
            return set()
        admin = AdminClient({"bootstrap.servers": live, **self.admin_config})
        try:
            return set(admin.list_topics(timeout=5).brokers)
        except Exception:  # not answering yet: the caller retries
            return set()

    def node(self, node_id: int) -> KafkaNode:
        return self.members[node_id - 1]

    def kill(self, node_id: int) -> None:
        """SIGKILL one node: a crash."""
        node = self.node(node_id)
        if node.process is not None:
            node.process.kill()
            node.process.wait()

    def stop_node(self, node_id: int, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM one node (a controlled shutdown), SIGKILL after ``timeout`` seconds."""
        node = self.node(node_id)
        if node.process is None:
            return
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
            try:
                node.process.wait(timeout)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
        node.process = None

    def stop(self) -> None:
        """Stop every node and remove the data; safe to call repeatedly."""
        for node in self.members:  # all at once: each waits for the others' shutdown
            if node.alive():
                assert node.process is not None
                node.process.send_signal(signal.SIGTERM)
        for node in self.members:
            self.stop_node(node.node_id)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        _running.discard(self)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _advertised(self, node: KafkaNode) -> int:
        return self.advertised_port if self.advertised_port and node.node_id == 1 else node.port

    def _properties(self, node: KafkaNode) -> str:
        replicas = str(min(3, self.nodes))
        client = self.client_listener
        # A secured client listener gets a plaintext one for the brokers among themselves.
        internal = (
            f"INTERNAL://127.0.0.1:{node.internal_port},"
            if self.client_protocol != "PLAINTEXT"
            else ""
        )
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.members)
        config = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{client}://127.0.0.1:{node.port},{internal}"
            f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"{client}://127.0.0.1:{self._advertised(node)}"
            + (f",INTERNAL://127.0.0.1:{node.internal_port}" if internal else ""),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL" if internal else client,
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{client}:"
            f"{self.client_protocol}" + (",INTERNAL:PLAINTEXT" if internal else ""),
            "log.dirs": str(node.directory / "data"),
            "num.partitions": "4",
            "default.replication.factor": replicas,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": str(min(2, self.nodes)),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": str(min(2, self.nodes)),
            # Tests join and leave groups often: no wait for more members, short sessions.
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # Records keep whatever old timestamps a test gives them: no time retention unless
            # a topic asks for it (retention.ms), and then the cleaner acts within seconds.
            "log.retention.ms": "-1",
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "0",
            **self.broker_config,
        }
        return "".join(f"{key}={value}\n" for key, value in config.items())


def _die_with_parent() -> None:
    """A node is killed when the process that started it dies, even by SIGKILL (a test run
    stopped by its time limit): atexit alone left 400 MB JVMs running for good. (Linux sends
    the signal when the starting *thread* ends: start nodes from a thread that outlives them.)"""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def _cluster_id() -> str:
    """16 random bytes, URL-safe base64 without padding; never starting with '-' (a flag)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# Clusters still running at interpreter exit are stopped: no orphan JVM after a crashed session.
_running: set[ApacheKafka] = set()


@atexit.register
def _stop_all_running() -> None:
    for cluster in list(_running):
        with contextlib.suppress(Exception):
            cluster.stop()


@contextlib.contextmanager
def running_kafka(nodes: int = 1, **broker_config: str) -> Iterator[ApacheKafka]:
    with ApacheKafka(nodes, broker_config) as cluster:
        yield cluster


def main() -> None:
    parser = argparse.ArgumentParser(description="Run Apache Kafka on loopback until Ctrl-C.")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    args = parser.parse_args()
    with ApacheKafka(args.nodes) as cluster:
        print(cluster.bootstrap_servers, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while all(node.alive() for node in cluster.members):
                time.sleep(1)


if __name__ == "__main__":
    main()
