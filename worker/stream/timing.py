"""Where one record's time goes: its stages, from its timestamp to its output's acknowledgement.

The pipeline stamps ``time.monotonic()`` at each boundary (the model thread stamps its own,
:class:`~worker.embedding.protocol.RunTiming`); the stages are the differences, so waiting
and work add up to the record's latency:

- ``fetch``: the record's timestamp to the worker's receipt (producer, broker, consumer);
- ``decode_wait``: receipt to the start of decoding (a free pipeline slot, the partition's
  rebuild, the event loop);
- ``decode``: decoding and validation;
- ``embed_wait``: waiting for a model thread (or for an identical text's run in flight);
- ``tokenize``, ``embed``: the model thread's tokenizing, then its model run;
- ``order_wait``: the vector's hand-back to the event loop and the wait for the partition's
  earlier records (novelty goes in offset order);
- ``novelty``, ``score``: novelty against the partition's cache, then scoring and routing;
- ``publish``: publishing to the broker's acknowledgement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from worker.core.output import HEADER_PREFIX
from worker.embedding.protocol import RunTiming

# In pipeline order. Every published record is observed in each of them (0 where a record
# skipped the step), except ``fetch``, which needs a record timestamp.
STAGES = (
    "fetch",
    "decode_wait",
    "decode",
    "embed_wait",
    "tokenize",
    "embed",
    "order_wait",
    "novelty",
    "score",
    "publish",
)
# KP_TIMING_HEADER: the stages up to publishing, in milliseconds, on every output.
TIMING_HEADER = f"{HEADER_PREFIX}timing-ms"


@dataclass(slots=True)
class RecordTiming:
    """One record's stamps (``time.monotonic()``; 0 until reached) and measured seconds."""

    received: float  # the worker received it
    received_wall: float  # the same moment on the wall clock (``time.time()``)
    timestamp_ms: int  # the record's own timestamp; 0, or Kafka's -1, when it has none
    decoding: float = 0.0
    decoded: float = 0.0
    run: RunTiming = field(default_factory=RunTiming)  # its own model run, if it had one
    vector: float = 0.0  # the event loop has its vector (or knows it needs none)
    ordered: float = 0.0  # the partition's earlier records are scored: novelty may start
    novelty: float = 0.0  # seconds
    score: float = 0.0  # seconds
    publishing: float = 0.0
    acked: float = 0.0

    @classmethod
    def received_at(cls, received: float, timestamp_ms: int) -> RecordTiming:
        """``received`` on the monotonic clock; its wall time is read off the clocks now."""
        return cls(received, time.time() - (time.monotonic() - received), timestamp_ms)

    def before_publish(self) -> list[tuple[str, float]]:
        """Each stage up to publishing, in seconds, in pipeline order."""
        run = self.run
        ran = run.finished > 0.0
        embedded = run.finished if ran else self.vector
        stages: list[tuple[str, float]] = []
        if self.timestamp_ms > 0:  # a producer clock running fast makes it 0, as below
            stages.append(("fetch", self.received_wall - self.timestamp_ms / 1000))
        stages += [
            ("decode_wait", self.decoding - self.received),
            ("decode", self.decoded - self.decoding),
            ("embed_wait", (run.started if ran else self.vector) - self.decoded),
            ("tokenize", run.tokenized - run.started if ran else 0.0),
            ("embed", run.finished - run.tokenized if ran else 0.0),
            ("order_wait", self.ordered - embedded),
            ("novelty", self.novelty),
            ("score", self.score),
        ]
        return [(stage, max(0.0, seconds)) for stage, seconds in stages]

    @property
    def latency(self) -> float:
        """Receipt to the broker's acknowledgement of the output, in seconds."""
        return self.acked - self.received

    def stages(self) -> list[tuple[str, float]]:
        """Every stage, in seconds, in pipeline order (once the output is acknowledged)."""
        return [*self.before_publish(), ("publish", max(0.0, self.acked - self.publishing))]

    def header(self) -> tuple[str, bytes]:
        """The ``kp-timing-ms`` header: the stages up to publishing, in milliseconds."""
        millis = {stage: round(seconds * 1000, 2) for stage, seconds in self.before_publish()}
        return TIMING_HEADER, orjson.dumps(millis)
