"""Derive an int8-compute model from the packaged one, offline (``kp-scorer model build``).

The packaged model stores int8 weights but computes in fp32: onnxruntime dequantises the
weights at load (``Cast`` + ``Mul`` by a per-column scale). Dynamic quantization makes the
MatMuls themselves run in integer arithmetic (1.43x the texts/s of one run on an EPYC CPU:
``python bench/int8_engine.py``, bench/RESULTS.md), at the price of quantizing each
activation tensor to uint8 on the fly.

The uint8 scale is taken over the whole input tensor, so a derived model's vector for a
text depends on the other texts in its run and on their padding: the worker loads such a
model only with one text per run (``KP_EMBED_BATCH_SIZE=1``, the default).

Derivation, deterministic: the exact rewrites of :mod:`worker.embedding.streamline`, then
onnxruntime's own constant folding turns the ``Cast``/``Mul`` (or ``DequantizeLinear``) of
each constant int8 weight into the fp32 initializer it computes at load, then
``onnxruntime.quantization.quantize_dynamic`` with per-channel weights. Per-channel
re-quantization of those weights gives back exactly the packaged int8 values and scales, so
the only new error is activation rounding; a recipe chooses which MatMuls keep fp32
activations to bound it.

The ``smooth-*`` recipe first moves the activations' outlier channels into the weights
(:mod:`worker.embedding.build.smooth`).
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnxruntime as ort

from worker.embedding.build import QuantizeError
from worker.embedding.build.smooth import calibrate_absmax, smooth
from worker.embedding.config import CPU_PROVIDERS
from worker.embedding.session import SessionFactory
from worker.embedding.streamline import streamline
from worker.logs import one_line

if TYPE_CHECKING:
    import onnx

# Bump when the derivation changes in a way that changes the bytes for the same inputs.
RECIPE_VERSION = 2


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
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        model = onnx.load(str(source))
    except Exception as exc:
        raise QuantizeError(f"source model {source} cannot be parsed: {one_line(exc)}") from None
    with tempfile.TemporaryDirectory(prefix="kp-int8-") as scratch:
        model = folded(model, source, Path(scratch) / "folded.onnx")
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


def folded(model: onnx.ModelProto, source: Path, scratch_file: Path) -> onnx.ModelProto:
    """``model`` streamlined, then as onnxruntime's basic graph optimisations leave it: each
    weight computed from constants (``Cast(int8 W) * scale``, ``DequantizeLinear``) becomes the
    fp32 initializer onnxruntime computes at load, and quantize_dynamic quantizes only a MatMul
    whose weight is an initializer. Streamlining first keeps the embedding tables int8 (looked
    up, then scaled) rather than folded to float32. ``scratch_file`` receives the result."""
    import onnx

    streamline(model)
    options = SessionFactory().options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # Fold DequantizeLinear weights too (by default kept for quantized-operator fusions).
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.optimized_model_filepath = str(scratch_file)
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=list(CPU_PROVIDERS))
    except Exception as exc:
        raise QuantizeError(f"source model {source} does not load: {one_line(exc)}") from None
    return onnx.load(str(scratch_file))


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


def _not_a_quantizer_notice(record: logging.LogRecord) -> bool:
    """quantize_dynamic warns on the root logger that pre-processing was not run; it is not
    wanted here (it would rewrite the graph) and the notice is noise in worker logs."""
    return "onnxruntime" not in record.pathname or record.levelno >= logging.ERROR
