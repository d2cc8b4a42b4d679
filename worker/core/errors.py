"""Every way an input record can fail to be scored, one class per kind, in one place.

``kind`` is the stable name in dead-letter headers and the ``kp_dead_letters_total`` metric;
``reason`` is the one-line explanation a producer can act on.
"""

from __future__ import annotations

from typing import ClassVar

_SNIPPET_CHARS = 60


def snippet(value: object) -> str:
    """A value as a reason quotes it: short enough for one log line or header."""
    text = repr(value)
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."


class TraceError(Exception):
    """Input that cannot be scored: ``kind`` is stable (metrics, headers), ``reason`` for people."""

    kind: ClassVar[str] = "invalid"
    # Said by the decoder or the schema check, of the input record itself.
    from_input: ClassVar[bool] = True

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EmptyMessageError(TraceError):
    kind = "empty"


class TooLargeError(TraceError):
    kind = "too_large"


class FramingError(TraceError):
    """A value whose Schema Registry framing is missing (``KP_INPUT_FRAMING=confluent``),
    cut short, or wraps no document."""

    kind = "framing"


class EncodingError(TraceError):
    kind = "invalid_encoding"


class InvalidJsonError(TraceError):
    kind = "invalid_json"


class DuplicateKeyError(TraceError):
    kind = "duplicate_key"


class NotAnObjectError(TraceError):
    kind = "not_object"


class SchemaViolationError(TraceError):
    kind = "schema"


class IntegerOutOfRangeError(TraceError):
    """An integer beyond 64 bits: the decoder would read it as a float, and the trace would be
    published with another number than the one written."""

    kind = "integer_out_of_range"


class UnreadableRecordError(TraceError):
    """A record whose batch the Kafka client could not read (a header name that is not UTF-8,
    a batch its codec cannot decode): its bytes never reached the scorer."""

    kind = "unreadable"
    from_input = False


class InternalScoringError(TraceError):
    """A valid trace that the scorer failed on: dead-lettered rather than lost."""

    kind = "internal"
    from_input = False


class OutputTooLargeError(TraceError):
    """A valid trace whose scored output would exceed the publish limit."""

    kind = "output_too_large"
    from_input = False


# Every kind a dead letter can carry, each class's once, in the order the classes are defined
# above (``__subclasses__`` keeps it): the dead-letter schema and the docs list them so.
ERROR_KINDS: tuple[str, ...] = tuple(cls.kind for cls in TraceError.__subclasses__())
# What the decoder and schema check can say about an input record.
INPUT_ERROR_KINDS: tuple[str, ...] = tuple(
    cls.kind for cls in TraceError.__subclasses__() if cls.from_input
)
