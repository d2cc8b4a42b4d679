"""Derive an int8-compute engine from the packaged model, once, cached by content hash.

The packaged model stores int8 weights but computes in fp32: onnxruntime dequantises the
weights at load (``Cast`` + ``Mul`` by a per-column scale). Dynamic quantization makes the
MatMuls themselves run in integer arithmetic (1.4-2x the texts/s on an AVX2 CPU), at the
price of quantizing each activation tensor to uint8 on the fly.

The uint8 scale is taken over the whole input tensor, so a derived model's vector for a
text depends on the other texts in its run and on their padding: use it with one text per
run (``KP_EMBED_BATCH_SIZE=1``, the default), or replays stop matching the live scores.

Derivation, offline and deterministic: fold the ``Cast``/``Mul`` (or ``DequantizeLinear``)
of each constant int8 weight into an fp32 initializer (bit-exact: the same float32 product
onnxruntime computes), then ``onnxruntime.quantization.quantize_dynamic`` with per-channel
weights. Per-channel re-quantization of those weights gives back exactly the packaged int8
values and scales, so the only new error is activation rounding; a recipe chooses which
MatMuls keep fp32 activations to bound it.

The ``smooth-*`` recipes first move the activations' outlier channels into the weights
(:mod:`worker.embedding.build.smooth`).

The result is cached as ``<cache_dir>/<source sha256[:16]>-<recipe>-v<N>-ort<version>.onnx``
with a JSON sidecar recording what it was derived from and its own sha256. A cached file
is used only when the sidecar matches and the file hashes to what the sidecar says;
otherwise it is derived again. Files are written to a temporary name and renamed, under a
lock file, so concurrent workers never load half a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from worker.embedding.build import QuantizeError
from worker.embedding.build.smooth import calibrate_absmax, smooth
from worker.embedding.files import file_sha256
from worker.embedding.session import SessionFactory
from worker.logs import one_line

if TYPE_CHECKING:
    import onnx

# Bump when the derivation changes in a way that changes the bytes for the same inputs.
RECIPE_VERSION = 1
ROLES = ("qkv", "attn_out", "ffn_up", "ffn_down")
_SIDECAR_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Recipe:
    """Which weight MatMuls are quantized: all of them except the ones kept in fp32.

    ``keep_roles`` keeps a role in every layer, ``keep_layers`` keeps whole layers (negative
    counts from the last), ``keep`` keeps single (layer, role) pairs.
    """

    name: str
    summary: str
    keep_roles: frozenset[str] = frozenset()
    keep_layers: frozenset[int] = frozenset()
    keep: frozenset[tuple[int, str]] = frozenset()
    # SmoothQuant migration strength (0..1) for the quantized MatMuls; None: no smoothing.
    smooth_alpha: float | None = None
    # "uint8" runs the saturation-free uint8 x uint8 kernel; "int8" the faster uint8 x int8.
    weights: str = "int8"

    @property
    def calibrated(self) -> bool:
        return self.smooth_alpha is not None

    def keeps_fp32(self, layer: int, role: str, layers: int) -> bool:
        return (
            role in self.keep_roles
            or layer in self.keep_layers
            or layer - layers in self.keep_layers
            or (layer, role) in self.keep
        )


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "dynamic-per-channel",
            "every weight MatMul int8 (per-channel weights, uint8 activations)",
        ),
        Recipe(
            "dynamic-keep-ffn-down",
            "FFN down-projections (GELU outputs, long-tailed) kept fp32",
            keep_roles=frozenset({"ffn_down"}),
        ),
        Recipe(
            "smooth-keep-ffn-down",
            "outlier channels smoothed (calibrated), uint8 weights, FFN down-projections fp32",
            keep_roles=frozenset({"ffn_down"}),
            smooth_alpha=0.8,
            weights="uint8",
        ),
    )
}
DEFAULT_RECIPE = "dynamic-per-channel"


@dataclass(frozen=True, slots=True)
class DerivedModel:
    """A verified derived model: load ``path`` expecting ``sha256``."""

    path: Path
    sha256: str
    recipe: str
    source_sha256: str
    derived: bool  # True when this call wrote it, False when the cached file was reused


def default_cache_dir() -> Path:
    """``KP_MODEL_CACHE_DIR``'s default (one definition, in the settings)."""
    from worker.settings import default_model_cache_dir

    return default_model_cache_dir()


def derive_int8_model(
    source: Path,
    cache_dir: Path,
    recipe: str = DEFAULT_RECIPE,
    *,
    tokenizer_path: Path | None = None,
) -> DerivedModel:
    """The int8 model for `source` and `recipe`, from the cache or derived now.

    `tokenizer_path` (default: the packaged tokenizer) is read only by calibrated recipes.
    Raises QuantizeError saying why when the source cannot be read, the recipe is unknown,
    the cache directory is not writable, or derivation fails.
    """
    spec = RECIPES.get(recipe)
    if spec is None:
        raise QuantizeError(f"unknown int8 recipe {recipe!r}; known: {', '.join(RECIPES)}")
    source = Path(source)
    cache_dir = Path(cache_dir)
    source_sha256 = file_sha256(source, "source model", QuantizeError)
    key = f"{source_sha256[:16]}-{recipe}-v{RECIPE_VERSION}-ort{ort.__version__}"
    target = cache_dir / f"{key}.onnx"
    sidecar = cache_dir / f"{key}.json"
    expected: dict[str, Any] = {
        "format": _SIDECAR_FORMAT,
        "source_sha256": source_sha256,
        "recipe": recipe,
        "recipe_version": RECIPE_VERSION,
        "onnxruntime": ort.__version__,
    }
    if spec.calibrated:
        tokenizer_path = Path(tokenizer_path or _default_tokenizer_path())
        expected["tokenizer_sha256"] = file_sha256(tokenizer_path, "tokenizer", QuantizeError)
    cached = _verified(target, sidecar, expected)
    if cached is not None:
        return DerivedModel(target, cached, recipe, source_sha256, derived=False)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise QuantizeError(f"int8 cache directory {cache_dir} cannot be created: {exc}") from None
    with _locked(cache_dir / f"{key}.lock"):
        # Another worker may have derived it while this one waited for the lock.
        cached = _verified(target, sidecar, expected)
        if cached is not None:
            return DerivedModel(target, cached, recipe, source_sha256, derived=False)
        data = derive_bytes(source, spec, tokenizer_path=tokenizer_path)
        sha256 = hashlib.sha256(data).hexdigest()
        _check_loads(data, source)
        _write_atomically(target, data)
        record = {**expected, "onnx": _onnx_version(), "sha256": sha256}
        _write_atomically(sidecar, json.dumps(record, indent=1, sort_keys=True).encode())
    return DerivedModel(target, sha256, recipe, source_sha256, derived=True)


def derive_bytes(source: Path, recipe: Recipe, *, tokenizer_path: Path | None = None) -> bytes:
    """The serialised derived model (no caching): fold the weights, smooth, then quantize."""
    onnx = _import_onnx()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        model = onnx.load(str(source))
    except Exception as exc:
        raise QuantizeError(f"source model {source} cannot be parsed: {one_line(exc)}") from None
    fold_weight_dequantization(model)
    matmuls = weight_matmuls(model)
    if not matmuls:
        raise QuantizeError(f"source model {source} has no MatMul with constant weights")
    layers = 1 + max(layer for _, layer, _ in matmuls)
    excluded = [name for name, layer, role in matmuls if recipe.keeps_fp32(layer, role, layers)]
    if len(excluded) == len(matmuls):
        raise QuantizeError(f"recipe {recipe.name} keeps every MatMul in fp32")
    if recipe.smooth_alpha is not None:
        quantized = {name for name, _, _ in matmuls} - set(excluded)
        tokenizer = Path(tokenizer_path or _default_tokenizer_path())
        absmax = calibrate_absmax(model, quantized, tokenizer)
        smooth(model, quantized, absmax, recipe.smooth_alpha)
    with tempfile.TemporaryDirectory(prefix="kp-int8-") as scratch:
        out = Path(scratch) / "model.onnx"
        try:
            with _quiet_quantizer():
                quantize_dynamic(
                    model,
                    out,
                    op_types_to_quantize=["MatMul"],
                    per_channel=True,
                    reduce_range=False,
                    weight_type=QuantType.QUInt8 if recipe.weights == "uint8" else QuantType.QInt8,
                    nodes_to_exclude=excluded,
                    extra_options={"WeightSymmetric": True},
                )
        except Exception as exc:
            raise QuantizeError(
                f"quantizing {source} with recipe {recipe.name} failed: {one_line(exc)}"
            ) from None
        return out.read_bytes()


def fold_weight_dequantization(model: onnx.ModelProto) -> int:
    """Replace ``Cast(int8 W) * scale`` and ``DequantizeLinear(int8 W, scale[, zp])`` feeding
    only MatMul weight inputs by the fp32 initializer they compute; returns how many.

    quantize_dynamic only quantizes a MatMul whose weight is an initializer. The product is
    taken in float32, as onnxruntime takes it, so the folded model computes the same values.
    Embedding tables (feeding Gather) are left as they are.
    """
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def feeds_only_matmul_weights(name: str) -> bool:
        users = consumers.get(name, [])
        return bool(users) and all(u.op_type == "MatMul" and u.input[1] == name for u in users)

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name])

    folded: dict[str, np.ndarray] = {}
    dropped: set[int] = set()
    for node in graph.node:
        source = node.input[0] if node.input else ""
        if source not in inits or inits[source].data_type != onnx.TensorProto.INT8:
            continue
        if node.op_type == "DequantizeLinear":
            if any(n not in inits for n in node.input[1:]) or not feeds_only_matmul_weights(
                node.output[0]
            ):
                continue
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            values = array(source).astype(np.float32)
            if len(node.input) > 2 and node.input[2]:
                values = values - _along(array(node.input[2]).astype(np.float32), axis, values)
            folded[node.output[0]] = values * _along(array(node.input[1]), axis, values)
            dropped.add(id(node))
        elif node.op_type == "Cast" and _cast_to(node) == onnx.TensorProto.FLOAT:
            users = consumers.get(node.output[0], [])
            if len(users) != 1 or users[0].op_type != "Mul":
                continue
            mul = users[0]
            scale = mul.input[1] if mul.input[0] == node.output[0] else mul.input[0]
            if scale not in inits or not feeds_only_matmul_weights(mul.output[0]):
                continue
            folded[mul.output[0]] = array(source).astype(np.float32) * array(scale)
            dropped.update((id(node), id(mul)))
    if not folded:
        return 0
    kept_nodes = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept_inits = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    graph.initializer.extend(
        numpy_helper.from_array(values.astype(np.float32), name) for name, values in folded.items()
    )
    return len(folded)


def weight_matmuls(model: onnx.ModelProto) -> list[tuple[str, int, str]]:
    """(node name, layer, role) of each MatMul with a constant 2-D weight, in graph order.

    Roles of a BERT block: ``qkv`` (three MatMuls sharing one input), ``attn_out`` (the other
    square one), ``ffn_up`` (widening) and ``ffn_down`` (narrowing, which ends a layer).
    """
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    nodes = [
        node
        for node in model.graph.node
        if node.op_type == "MatMul" and len(shapes.get(node.input[1], ())) == 2
    ]
    sharing = Counter(node.input[0] for node in nodes)
    layer = 0
    found = []
    for node in nodes:
        rows, cols = shapes[node.input[1]]
        if rows > cols:
            role = "ffn_down"
        elif cols > rows:
            role = "ffn_up"
        else:
            role = "qkv" if sharing[node.input[0]] > 1 else "attn_out"
        found.append((node.name, layer, role))
        layer += role == "ffn_down"
    return found


# -- cache -------------------------------------------------------------------------------------


def _verified(target: Path, sidecar: Path, expected: dict[str, Any]) -> str | None:
    """The cached file's sha256 when it and its sidecar match what is asked for, else None."""
    try:
        record = json.loads(sidecar.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or any(record.get(k) != v for k, v in expected.items()):
        return None
    try:
        actual = file_sha256(target, "cached int8 model", QuantizeError)
    except QuantizeError:
        return None
    return actual if actual == record.get("sha256") else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so that concurrent workers derive once; none on platforms
    without fcntl (correctness does not depend on it: writes are atomic renames)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux
        yield
        return
    try:
        handle = path.open("a")
    except OSError as exc:
        raise QuantizeError(f"int8 cache directory {path.parent} is not writable: {exc}") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write beside the target, flush to disk, rename over it: readers see old or new, whole."""
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
    except OSError as exc:
        raise QuantizeError(f"cannot write {path}: {exc}") from None


def _check_loads(data: bytes, source: Path) -> None:
    """Refuse to cache a model onnxruntime cannot open: it would be reused on every start."""
    try:
        SessionFactory().open(data)
    except Exception as exc:
        raise QuantizeError(
            f"the int8 model derived from {source} does not load: {one_line(exc)}"
        ) from None


# -- helpers -----------------------------------------------------------------------------------


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise QuantizeError(
            "the onnx package is not installed; it is needed to derive the int8 model"
        ) from None
    return onnx


def _default_tokenizer_path() -> Path:
    from worker.settings import DEFAULT_TOKENIZER_PATH

    return DEFAULT_TOKENIZER_PATH


def _onnx_version() -> str:
    return str(_import_onnx().__version__)


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _along(values: np.ndarray, axis: int, like: np.ndarray) -> np.ndarray:
    """A per-axis (1-D) quantization parameter shaped to broadcast along `axis` of `like`."""
    if values.ndim != 1 or like.ndim < 2:
        return values
    shape = [1] * like.ndim
    shape[axis] = values.shape[0]
    return values.reshape(shape)


class _DropQuantizerNotices(logging.Filter):
    """quantize_dynamic warns on the root logger that pre-processing was not run; it is not
    wanted here (it would rewrite the graph) and the notice is noise in worker logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname or record.levelno >= logging.ERROR


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    root = logging.getLogger()
    notice_filter = _DropQuantizerNotices()
    root.addFilter(notice_filter)
    try:
        yield
    finally:
        root.removeFilter(notice_filter)
