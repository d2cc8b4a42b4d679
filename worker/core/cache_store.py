"""The novelty cache's entries as kept in Kafka, so that a partition's new owner reads its
cache back instead of embedding it again (:mod:`worker.stream.partitions`).

An entry is one scored trace's grid row (the float32 values the cache holds, bit for bit),
keyed by what that row is a pure function of: the embedding text's digest (the key the cache
already reuses rows by) and a tag of the embedder (model file, tokenizer, their settings and
this format). So an entry is valid for any record with that text scored by that embedder,
whichever partition or offset it came from. A restore recomputes each trace's key from the
input log, takes only entries of its own tag whose row is sound (:func:`is_grid_row`), and
re-embeds every trace it found none for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from worker.core.cache import FloatArray, is_grid_row
from worker.core.records import SourceRecord

FORMAT = 1
TAG_BYTES = 8
# Key and value bytes of one entry of a 384-dimension row, and Kafka's record framing.
ENTRY_BYTES = TAG_BYTES + 16 + 384 * 4 + 70


def embedder_tag(identity: str) -> bytes:
    """What an entry's key starts with: a digest of the embedder's identity and the format."""
    return hashlib.blake2b(f"{FORMAT}|{identity}".encode(), digest_size=TAG_BYTES).digest()


def entry(tag: bytes, text_key: bytes, row: FloatArray) -> tuple[bytes, bytes]:
    """(key, value) of one entry: the row's float32 values, little-endian."""
    return tag + text_key, row.astype("<f4").tobytes()


def stored_rows(
    records: Iterable[SourceRecord], tag: bytes, dimensions: int
) -> dict[bytes, FloatArray]:
    """The sound rows of ``tag`` among records read from the store, by text key."""
    rows: dict[bytes, FloatArray] = {}
    for record in records:
        key, value = record.key, record.value
        if not key or not key.startswith(tag) or value is None or len(value) != dimensions * 4:
            continue
        row = np.frombuffer(value, dtype="<f4").astype(np.float32)
        if is_grid_row(row, dimensions):
            rows[key[TAG_BYTES:]] = row
    return rows


@dataclass(frozen=True, slots=True)
class StoreTopic:
    """The cache store's topic: input partition p's entries go to its partition p modulo its
    partition count (created with the input's count, so one to one)."""

    name: str
    partitions: int

    def partition_of(self, input_partition: int) -> int:
        return input_partition % self.partitions
