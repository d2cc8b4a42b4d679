"""The few settings the embedder reads, taken from the worker's settings in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from worker.settings import DEFAULT_TOKENIZER_PATH

if TYPE_CHECKING:
    from worker.settings import Settings

CPU_PROVIDERS = ("CPUExecutionProvider",)


@dataclass(frozen=True, slots=True)
class EmbedderConfig:
    """Which model to load, how to check it and how to run it.

    ``model_path`` None is the packaged model, checked against its published sha256; an
    operator's model is checked against ``model_sha256``, else its sidecar's hash if any.
    """

    model_path: Path | None = None
    model_sha256: str | None = None
    tokenizer_path: Path = DEFAULT_TOKENIZER_PATH
    max_tokens: int = 256
    threads: int = 1  # intra-op threads of each run
    concurrency: int = 1  # runs side by side, each on its own thread
    batch_size: int = 1
    providers: tuple[str, ...] = CPU_PROVIDERS
    required: bool = False  # raise instead of falling back to novelty 0.5

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbedderConfig:
        """The embedder's part of the worker's settings."""
        return cls(
            model_path=settings.model_path,
            model_sha256=settings.model_sha256,
            tokenizer_path=settings.tokenizer_path,
            max_tokens=settings.embed_max_tokens,
            threads=settings.embed_threads,
            concurrency=settings.resolved_embed_concurrency,
            batch_size=settings.embed_batch_size,
            providers=settings.embed_provider_names,
            required=settings.embedder_required,
        )
