"""Apache Kafka secured as production runs it, for the security tests: the client listener is
SASL_SSL (SCRAM-SHA-512 users, a broker certificate for 127.0.0.1 signed by a test CA), and
ACLs decide (StandardAuthorizer, ``allow.everyone.if.no.acl.found=false``).

Two users are created when the storage is formatted: ``admin`` (a super user, as the plaintext
listeners between brokers and controllers are, whose principal is ``User:ANONYMOUS``) and
``scorer``, which has no permission until a test grants one. The test's own clients (topics,
ACLs, the traces it produces and the outputs it reads back) are the admin's, through librdkafka.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from support.apache_kafka import ApacheKafka
from support.tls import BrokerCertificates, make_broker_certificates

MECHANISM = "SCRAM-SHA-512"
SCORER = "scorer"
REQUEST_SECONDS = 30.0


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW ACL of the scorer user: ``operation`` (Read, Write, Create, Describe) on the
    literal ``resource`` (Topic, Group) ``name``."""

    resource: str
    name: str
    operation: str

    def binding(self, principal: str = f"User:{SCORER}") -> AclBinding:
        return AclBinding(
            ResourceType[self.resource.upper()],
            self.name,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation[self.operation.upper()],
            AclPermissionType.ALLOW,
        )


@dataclass(frozen=True)
class Output:
    """An output record, by where it came from."""

    topic: str
    source: tuple[int, int]  # the input record's (partition, offset)


@dataclass
class SecureKafka:
    """A running single-node Apache Kafka with SASL_SSL and ACLs; see the module docstring."""

    certificates: BrokerCertificates
    admin_password: str = field(default_factory=lambda: f"admin-{uuid.uuid4().hex}")
    scorer_password: str = field(default_factory=lambda: f"scorer-{uuid.uuid4().hex}")
    cluster: ApacheKafka | None = None
    _admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap_servers

    def client_config(self) -> dict[str, str]:
        """librdkafka settings of the admin user."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": "admin",
            "sasl.password": self.admin_password,
            "ssl.ca.location": str(self.certificates.ca),
        }

    def worker_settings(self) -> dict[str, str]:
        """The KP_* security settings of a worker running as the scorer user."""
        return {
            "KP_SECURITY_PROTOCOL": "SASL_SSL",
            "KP_SASL_MECHANISM": MECHANISM,
            "KP_SASL_USERNAME": SCORER,
            "KP_SASL_PASSWORD": self.scorer_password,
            "KP_SSL_CAFILE": str(self.certificates.ca),
        }

    def start(self) -> SecureKafka:
        folder = self.certificates.ca.parent
        keystore = folder / "keystore.pem"  # Kafka's PEM keystore: the key, then the chain
        keystore.write_text(self.certificates.key.read_text() + self.certificates.cert.read_text())
        self.cluster = ApacheKafka(
            broker_config={
                "sasl.enabled.mechanisms": MECHANISM,
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(keystore),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                "super.users": "User:ANONYMOUS;User:admin",
            },
            format_args=[
                "--add-scram",
                f"{MECHANISM}=[name=admin,password={self.admin_password}]",
                "--add-scram",
                f"{MECHANISM}=[name={SCORER},password={self.scorer_password}]",
            ],
            client_listener="SASL_SSL",
            client_protocol="SASL_SSL",
            admin_config=self.client_config(),
        ).start()
        return self

    def stop(self) -> None:
        self._admin = None
        if self.cluster is not None:
            self.cluster.stop()

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self.bootstrap_servers, **self.client_config()}
            )
        return self._admin

    def grant(self, acls: Iterable[Acl]) -> None:
        bindings = [acl.binding() for acl in acls]
        for done in self.admin().create_acls(bindings, request_timeout=REQUEST_SECONDS).values():
            done.result()

    def revoke(self, acls: Iterable[Acl]) -> None:
        filters = [
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            for b in (acl.binding() for acl in acls)
        ]
        for done in self.admin().delete_acls(filters, request_timeout=REQUEST_SECONDS).values():
            done.result()

    def create_topics(self, names: Iterable[str], partitions: int) -> None:
        topics = [NewTopic(name, partitions, 1) for name in names]
        for done in self.admin().create_topics(topics, request_timeout=REQUEST_SECONDS).values():
            done.result()

    def produce(self, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
        """Publish ``values`` in order; their (partition, offset)s."""
        producer = Producer({"bootstrap.servers": self.bootstrap_servers, **self.client_config()})
        placed: list[tuple[int, int]] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                raise KafkaException(error)
            placed.append((message.partition(), message.offset()))

        for index, value in enumerate(values):
            producer.produce(topic, value, key=f"k{index}".encode(), on_delivery=delivered)
        if producer.flush(REQUEST_SECONDS) or len(placed) != len(values):
            raise TimeoutError(f"{len(values) - len(placed)} traces were not acknowledged")
        return placed

    def outputs(
        self, topics: Iterable[str], expected: set[tuple[int, int]], timeout: float = 60.0
    ) -> list[Output]:
        """Every output of ``topics`` (duplicates included) until each expected source has
        one, and a second more to catch any extra."""
        topics = sorted(topics)
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                **self.client_config(),
                "group.id": f"reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        try:
            metadata = consumer.list_topics(timeout=REQUEST_SECONDS)
            consumer.assign(
                [
                    TopicPartition(topic, partition, 0)  # offset 0: from the beginning
                    for topic in topics
                    for partition in metadata.topics[topic].partitions
                ]
            )
            found: list[Output] = []
            deadline, settled = time.monotonic() + timeout, None
            while time.monotonic() < deadline:
                for message in consumer.consume(100, timeout=0.3):
                    if message.error() is None:
                        found.append(Output(message.topic(), _source(message)))
                if expected <= {output.source for output in found}:
                    settled = settled or time.monotonic()
                    if time.monotonic() - settled >= 1.0:
                        return found
            missing = sorted(expected - {output.source for output in found})
            raise TimeoutError(f"no output for the inputs at {missing}")
        finally:
            consumer.close()


def _source(message: Any) -> tuple[int, int]:
    headers = {name: value for name, value in message.headers() or ()}
    if "kp-source-offset" in headers:  # a dead letter
        return int(headers["kp-source-partition"]), int(headers["kp-source-offset"])
    source = orjson.loads(message.value())["source"]
    return int(source["partition"]), int(source["offset"])


def start_secure_kafka(folder: Path) -> SecureKafka:
    """Certificates in ``folder``, then the broker (skips where openssl is missing)."""
    return SecureKafka(make_broker_certificates(folder)).start()
