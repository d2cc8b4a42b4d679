"""Loading the embedder: verify the model file, open it, smoke-test it.

When the model cannot be loaded, :func:`load_embedder` says why instead of failing, so the
worker can keep scoring with novelty 0.5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from worker.embedding.config import EmbedderConfig
from worker.embedding.encoder import Encoder, load_tokenizer
from worker.embedding.files import (
    INT8,
    file_sha256,
    model_id,
    resolve_model,
    verified_sha256,
)
from worker.embedding.pool import OnnxEmbedder
from worker.embedding.protocol import DIMENSIONS, EmbedderUnavailable
from worker.embedding.session import SessionFactory, streamlined_model
from worker.logs import one_line
from worker.memory import release_freed_memory

_REQUIRED_INPUTS = ("input_ids", "attention_mask")


def load_embedder(config: EmbedderConfig) -> tuple[OnnxEmbedder | None, str | None]:
    """(embedder, None) or (None, reason). Raises EmbedderUnavailable instead when
    ``config.required``.

    Without a model path the packaged model is used and checked against its published hash;
    an operator-supplied model is checked against its given sha256, else against its
    sidecar's (a built model), so pointing at an fp32 export does not also demand its hash.
    """
    try:
        return open_embedder(config), None
    except EmbedderUnavailable as exc:
        if config.required:
            raise
        return None, str(exc)


def open_embedder(config: EmbedderConfig) -> OnnxEmbedder:
    """Verify, load and smoke-test the model ``config`` describes; raise EmbedderUnavailable
    saying why not. An int8 model (one its sidecar says is) loads only with one text a run.

    The smoke test runs one `max_tokens`-long input, so a model that cannot take that
    length, or that does not produce 384-d hidden states, fails here rather than on the
    first long trace.
    """
    if min(config.batch_size, config.threads, config.concurrency) < 1 or config.max_tokens < 2:
        raise EmbedderUnavailable(
            f"invalid embedder options: batch_size={config.batch_size}, "
            f"max_tokens={config.max_tokens}, intra_op_threads={config.threads}, "
            f"concurrency={config.concurrency}"
        )
    model_path, expected_sha256, built_id, engine = resolve_model(config)
    if engine == INT8 and config.batch_size != 1:
        raise EmbedderUnavailable(
            f"model {model_path} is an int8 model (its sidecar says so) and needs "
            f"KP_EMBED_BATCH_SIZE=1, got {config.batch_size}: its activation scale spans a "
            "whole run, so a batched text's vector would depend on the others in its batch"
        )
    actual_sha256 = verified_sha256(model_path, expected_sha256)
    tokenizer, pad_id = load_tokenizer(Path(config.tokenizer_path), config.max_tokens)
    model = _open_model(model_path, SessionFactory(config.threads, config.providers))
    encoder = Encoder(tokenizer, pad_id, config.max_tokens, [i.name for i in model.get_inputs()])
    _check_vocabulary(model, encoder, max(max(tokenizer.get_vocab().values()), pad_id), config)
    embedder = OnnxEmbedder(
        model=model,
        encoder=encoder,
        model_id=built_id or model_id(model_path, actual_sha256),
        identity=(
            f"model={actual_sha256} tokenizer="
            f"{file_sha256(Path(config.tokenizer_path), 'tokenizer', EmbedderUnavailable)} "
            f"max_tokens={config.max_tokens} batch={config.batch_size} "
            f"threads={config.threads} providers={','.join(config.providers)}"
        ),
        batch_size=config.batch_size,
        concurrency=config.concurrency,
    )
    _smoke_test(embedder, model_path, config.max_tokens)
    # Loading turns the packaged int8 weights into float32 constants; trimming the freed
    # temporaries took 35 MiB off a loaded embedder's resident size (bench/RESULTS.md).
    release_freed_memory()
    return embedder


def _check_vocabulary(
    model: ort.InferenceSession, encoder: Encoder, top_id: int, config: EmbedderConfig
) -> None:
    """Refuse a tokenizer with ids the model has no embedding for (another model's): it
    would load, then fail on the first text holding one, and the worker stops on such a
    record at every restart."""
    ids = np.array([[top_id]], dtype=np.int64)
    try:
        model.run(None, encoder.model_inputs(ids, np.ones_like(ids)))
    except Exception as exc:
        raise EmbedderUnavailable(
            f"tokenizer {config.tokenizer_path} has token ids up to {top_id}, which the model "
            f"cannot embed (another model's tokenizer?): {one_line(exc)}"
        ) from None


def _smoke_test(embedder: OnnxEmbedder, model_path: Path, max_tokens: int) -> None:
    """Fail at load, not mid-stream, when the model cannot embed a full-length text."""
    try:
        vectors = embedder.embed(["x " * max_tokens])
    except Exception as exc:
        raise EmbedderUnavailable(
            f"model {model_path} failed on a {max_tokens}-token input: {one_line(exc)}"
        ) from exc
    if vectors.shape != (1, DIMENSIONS) or not np.isfinite(vectors).all():
        raise EmbedderUnavailable(
            f"model {model_path} does not produce finite {DIMENSIONS}-d vectors "
            f"(got shape {vectors.shape})"
        )


def _open_model(model_path: Path, sessions: SessionFactory) -> ort.InferenceSession:
    """The model, streamlined, in a session of ``sessions``, with the inputs the encoder
    feeds."""
    try:
        session = sessions.open(streamlined_model(model_path))
    except Exception as exc:
        raise EmbedderUnavailable(
            f"model {model_path} cannot be loaded by onnxruntime: {one_line(exc)}"
        ) from None
    inputs = {i.name for i in session.get_inputs()}
    missing = [name for name in _REQUIRED_INPUTS if name not in inputs]
    if missing:
        raise EmbedderUnavailable(
            f"model {model_path} lacks inputs {missing} (has {sorted(inputs)}); "
            "expected a BERT-style sentence encoder"
        )
    return session
