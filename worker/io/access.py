"""Why Kafka refuses the worker, in words that name what to change: the broker's certificate is
not trusted (``KP_SSL_CAFILE``), the SASL credentials are refused (``KP_SASL_*``), or the user
lacks a permission, an ACL (a :class:`~worker.stream.permissions.Refusal`).

aiokafka reports the first two only as "Unable to bootstrap from [...]", the reason left in a
line of its own log; :func:`connection_refusal` asks the first bootstrap server once more to
find it. Authorization errors carry the topic or group refused, not the operation: which one
it was depends on the request, and the caller says (:func:`refusals`).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

from worker.io.kafka import client_config
from worker.logs import error_line
from worker.settings import Settings
from worker.stream.permissions import Refusal

AUTHORIZATION_ERRORS = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)
DIAGNOSE_SECONDS = 10.0


def refused_names(exc: BaseException) -> list[str]:
    """The topics or group an authorization error names: aiokafka gives one name, or a set of
    topic names, as the error's argument."""
    names: list[str] = []
    for arg in exc.args:
        if isinstance(arg, str):
            names.append(arg)
        elif isinstance(arg, set | frozenset | list | tuple):
            names += sorted(str(name) for name in arg)
    return names


def refusals(exc: BaseException, topic_operation: str) -> list[Refusal]:
    """The permissions an authorization error says were refused: ``topic_operation`` (Read for
    a consumer, Write for a producer) on the topics it names, Read on the group it names."""
    if isinstance(exc, GroupAuthorizationFailedError):
        return [Refusal("Read", "group", name) for name in refused_names(exc)]
    if isinstance(exc, TopicAuthorizationFailedError):
        return [Refusal(topic_operation, "topic", name) for name in refused_names(exc)]
    return []


@dataclass(frozen=True)
class ConnectionRefusal:
    """The broker (or its certificate) refused the connection itself."""

    problem: str  # what is wrong, for the log line
    error: str  # the broker's or the TLS library's own words
    check: str  # the settings to look at

    def __str__(self) -> str:
        return f"{self.problem}: {self.error} (check {self.check})"


async def connection_refusal(
    settings: Settings, timeout: float = DIAGNOSE_SECONDS
) -> ConnectionRefusal | None:
    """Why the first bootstrap server refuses a connection from these settings: its TLS
    certificate is not trusted, or SASL refused the mechanism or the credentials. None when
    it accepts one, or cannot be reached at all (an outage is no refusal)."""
    host, _, port = settings.kafka_bootstrap_servers.split(",")[0].strip().rpartition(":")
    config = client_config(settings)
    config.pop("bootstrap_servers")
    try:
        async with asyncio.timeout(timeout):
            connection = await create_conn(
                host.strip("[]"), int(port), request_timeout_ms=int(timeout * 1000), **config
            )
    except ssl.SSLCertVerificationError as exc:
        return ConnectionRefusal(
            "the broker's TLS certificate is not trusted",
            str(exc.verify_message or exc.reason or exc),
            "KP_SSL_CAFILE: it must hold the CA that signed the broker's certificate",
        )
    except SaslAuthenticationFailed as exc:
        return ConnectionRefusal(
            f"Kafka refused the SASL credentials of user {settings.sasl_username!r}",
            str(exc),
            "KP_SASL_USERNAME, KP_SASL_PASSWORD and KP_SASL_MECHANISM",
        )
    except UnsupportedSaslMechanismError as exc:
        return ConnectionRefusal(
            f"Kafka does not offer SASL mechanism {settings.sasl_mechanism}",
            error_line(exc),
            "KP_SASL_MECHANISM",
        )
    except (OSError, KafkaError, TimeoutError):
        return None
    connection.close(reason="diagnosed")
    return None


def topic_refusal(settings: Settings, topic: str) -> Refusal:
    """What the worker needs on a topic it may neither see nor create: Read on the input, Write
    on an output, or else Create for the worker to create it."""
    operation = "Read" if topic == settings.input_topic else "Write"
    return Refusal(operation, "topic", topic, "or Create, for the worker to create it")
