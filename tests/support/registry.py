"""Records framed exactly as a Confluent Schema Registry serializer frames them.

``confluent_kafka``'s own ``JSONSerializer`` against its in-process mock registry: magic byte
0, the 4-byte big-endian id the registry gave the schema, then the JSON document.
"""

from __future__ import annotations

import warnings
from typing import Any

# The serializer imports the registry's HTTP client, and authlib warns that its httpx
# integration is deprecated; its module adds an "always" filter on import, so it is imported
# first, for the "ignore" below to take precedence.
import authlib.deprecate  # noqa: F401

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
        MockSchemaRegistryClient,
    )
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

# What a producer registers for traces: any JSON object (the scorer checks the real schema).
TRACE_SCHEMA = '{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}'


class Registry:
    """One mock registry and a serializer per topic, as a producing application holds them."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.client = MockSchemaRegistryClient({"url": "mock://kp-scorer-tests"})
            self._serializer = JSONSerializer(
                TRACE_SCHEMA, self.client, to_dict=lambda document, _ctx: document
            )

    def frame(self, document: dict[str, Any], topic: str = "kp.traces.raw") -> bytes:
        """The value a Confluent JSON serializer produces for ``document`` on ``topic``."""
        context = SerializationContext(topic, MessageField.VALUE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = self._serializer(document, context)
        assert value is not None
        return value


def schema_id_of(value: bytes) -> int:
    """The id a framed value carries (bytes 1-4, big-endian)."""
    return int.from_bytes(value[1:5], "big")
