"""A stand-in for the embedding model in tests of the stream: deterministic, and fast."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from worker.embedding.protocol import RunTiming


class HashEmbedder:
    """Unit vectors from a text's digest: equal texts are equal, different texts nearly
    orthogonal. Counts the texts it embeds (``embedded``)."""

    model_id = "hash"
    identity = "hash v1"
    dimensions = 384
    embedded = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.embedded += len(texts)
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).normal(size=self.dimensions))
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dimensions)
        return out / np.linalg.norm(out, axis=1, keepdims=True).clip(1e-12)

    def submit(self, texts: Sequence[str], timing: RunTiming | None = None) -> Future[np.ndarray]:
        future: Future[np.ndarray] = Future()
        future.set_result(self.embed(texts))
        return future

    def close(self) -> None:
        pass
