"""What the scorer needs from an embedder, and the one error loading one can raise.

The scorer, the stream worker and the CLI see an embedder only through :class:`Embedder`:
its vectors, its background runs, the statistics it reports and how to stop it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

DIMENSIONS = 384
FloatArray = npt.NDArray[np.float32]


@dataclass(slots=True)
class RunTiming:
    """When a submitted run reached each step (``time.monotonic``; 0 until it did): what
    separates waiting for a model thread from tokenizing and from the model's own run."""

    started: float = 0.0  # a model thread took the run
    tokenized: float = 0.0
    finished: float = 0.0  # the vectors are ready


class Embedder(Protocol):
    """Texts to unit vectors; a text's vector never depends on the texts run beside it."""

    model_id: str
    # Everything a vector's bits depend on (model and tokenizer digests, their settings): a
    # stored vector is reused only by an embedder of the same identity.
    identity: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Unit vectors [len(texts), dimensions], in the order given."""
        ...

    def submit(self, texts: Sequence[str], timing: RunTiming | None = None) -> Future[FloatArray]:
        """``embed`` started in the background (on the embedder's own threads); ``timing``,
        when given, is stamped as the run goes."""
        ...

    def close(self) -> None:
        """Let the embedding threads finish their current run and exit."""
        ...


class EmbedderUnavailable(Exception):
    """Model could not be loaded; str() is the human reason."""
