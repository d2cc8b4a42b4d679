"""Derive an int8-compute model from the packaged one, offline (``kp-scorer model build``).

The packaged model stores int8 weights but computes in fp32: onnxruntime dequantises the
weights at load (``Cast`` + ``Mul`` by a per-column scale). Dynamic quantization makes the
MatMuls themselves run in integer arithmetic (1.43x the texts/s of one run on an EPYC CPU:
``python bench/int8_engine.py``, bench/RESULTS.md), at the price of quantizing each
activation tensor to uint8 on the fly.

The uint8 scale is taken over the whole input tensor, so a derived model's vector for a
text depends on the other texts in its run and on their padding: the worker loads such a
model only with one text per run (``KP_EMBED_BATCH_SIZE=1``, the default).

Derivation, deterministic: fold the ``Cast``/``Mul`` (or ``DequantizeLinear``) of each
constant int8 weight into an fp32 initializer (bit-exact: the same float32 product
onnxruntime computes), then ``onnxruntime.quantization.quantize_dynamic`` with per-channel
weights. Per-channel re-quantization of those weights gives back exactly the packaged int8
values and scales, so the only new error is activation rounding; a recipe chooses which
MatMuls keep fp32 activations to bound it.

The ``smooth-*`` recipe first moves the activations' outlier channels into the weights
(:mod:`worker.embedding.build.smooth`).
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.embedding.build import QuantizeError
from worker.embedding.build.smooth import calibrate_absmax, smooth
from worker.embedding.streamline import GraphIndex, attribute, drop_unused
from worker.logs import one_line

if TYPE_CHECKING:
    import onnx

# Bump when the derivation changes in a way that changes the bytes for the same inputs.
RECIPE_VERSION = 1


@dataclass(frozen=True, slots=True)
class Recipe:
    """Which weight MatMuls are quantized: all of them but those whose role (in every layer)
    ``keep_roles`` keeps in fp32."""

    name: str
    summary: str
    keep_roles: frozenset[str] = frozenset()
    # SmoothQuant migration strength (0..1) for the quantized MatMuls; None: no smoothing.
    smooth_alpha: float | None = None
    # "uint8" runs the saturation-free uint8 x uint8 kernel; "int8" the faster uint8 x int8.
    weights: str = "int8"

    @property
    def calibrated(self) -> bool:
        return self.smooth_alpha is not None


# The fastest and the most faithful recipe of the fidelity table (bench/RESULTS.md, "int8
# engine as default": 12 and 2 accept/reject flips on 3,000 traces, `bench/int8_engine.py`).
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "dynamic-per-channel",
            "every weight MatMul int8 (per-channel weights, uint8 activations)",
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


def derive_bytes(source: Path, recipe: Recipe) -> bytes:
    """The serialised derived model: fold the weights, smooth, then quantize."""
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
    excluded = [name for name, role in matmuls if role in recipe.keep_roles]
    if len(excluded) == len(matmuls):
        raise QuantizeError(f"recipe {recipe.name} keeps every MatMul in fp32")
    if recipe.smooth_alpha is not None:
        quantized = {name for name, _ in matmuls} - set(excluded)
        absmax = calibrate_absmax(model, quantized)
        smooth(model, quantized, absmax, recipe.smooth_alpha)
    with tempfile.TemporaryDirectory(prefix="kp-int8-") as scratch:
        out = Path(scratch) / "model.onnx"
        logging.getLogger().addFilter(_not_a_quantizer_notice)
        try:
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
        finally:
            logging.getLogger().removeFilter(_not_a_quantizer_notice)
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
    view = GraphIndex(graph)
    inits = view.initializers

    def feeds_only_matmul_weights(name: str) -> bool:
        users = view.consumers.get(name, [])
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
            axis = attribute(node, "axis", 1)
            values = array(source).astype(np.float32)
            if len(node.input) > 2 and node.input[2]:
                values = values - _along(array(node.input[2]).astype(np.float32), axis, values)
            folded[node.output[0]] = values * _along(array(node.input[1]), axis, values)
            dropped.add(id(node))
        elif node.op_type == "Cast" and attribute(node, "to") == onnx.TensorProto.FLOAT:
            users = view.consumers.get(node.output[0], [])
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
    graph.initializer.extend(
        numpy_helper.from_array(values.astype(np.float32), name) for name, values in folded.items()
    )
    drop_unused(graph)
    return len(folded)


def weight_matmuls(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node name, role) of each MatMul with a constant 2-D weight, in graph order.

    Roles of a BERT block: ``qkv`` (three MatMuls sharing one input), ``attn_out`` (the other
    square one), ``ffn_up`` (widening) and ``ffn_down`` (narrowing).
    """
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    nodes = [
        node
        for node in model.graph.node
        if node.op_type == "MatMul" and len(shapes.get(node.input[1], ())) == 2
    ]
    sharing = Counter(node.input[0] for node in nodes)
    found = []
    for node in nodes:
        rows, cols = shapes[node.input[1]]
        if rows > cols:
            role = "ffn_down"
        elif cols > rows:
            role = "ffn_up"
        else:
            role = "qkv" if sharing[node.input[0]] > 1 else "attn_out"
        found.append((node.name, role))
    return found


# -- helpers -----------------------------------------------------------------------------------


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise QuantizeError(
            "the onnx package is not installed; it is needed to derive the int8 model"
        ) from None
    return onnx


def _along(values: np.ndarray, axis: int, like: np.ndarray) -> np.ndarray:
    """A per-axis (1-D) quantization parameter shaped to broadcast along `axis` of `like`."""
    if values.ndim != 1 or like.ndim < 2:
        return values
    shape = [1] * like.ndim
    shape[axis] = values.shape[0]
    return values.reshape(shape)


def _not_a_quantizer_notice(record: logging.LogRecord) -> bool:
    """quantize_dynamic warns on the root logger that pre-processing was not run; it is not
    wanted here (it would rewrite the graph) and the notice is noise in worker logs."""
    return "onnxruntime" not in record.pathname or record.levelno >= logging.ERROR
