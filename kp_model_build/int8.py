"""Derive the int8 engine from the packaged model, offline (``kp-scorer model build --int8``).

The packaged model stores int8 weights but computes in fp32: onnxruntime dequantises the
weights at load (``Cast`` + ``Mul`` by a per-column scale). Dynamic quantization makes the
MatMuls themselves run in integer arithmetic: 1.43x the texts/s of one run and 1.47x of two
on an EPYC CPU, at 12 accept/reject flips in 3,000 traces, all within 0.0053 of the 0.75
threshold (``python bench/int8_engine.py``, bench/RESULTS.md), the price of quantizing each
activation tensor to uint8 on the fly.

The uint8 scale is taken over the whole input tensor, so a derived model's vector for a
text depends on the other texts in its run and on their padding: the worker loads such a
model only with one text per run (``KP_EMBED_BATCH_SIZE=1``, the default).

Derivation, deterministic: the exact rewrites of :mod:`worker.embedding.streamline`, then
onnxruntime's own constant folding turns the ``Cast``/``Mul`` (or ``DequantizeLinear``) of
each constant int8 weight into the fp32 initializer it computes at load, then
``onnxruntime.quantization.quantize_dynamic`` with per-channel weights. Per-channel
re-quantization of those weights gives back exactly the packaged int8 values and scales, so
the only new error is activation rounding.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import onnxruntime as ort

from kp_model_build import QuantizeError
from worker.embedding.config import CPU_PROVIDERS
from worker.embedding.session import SessionFactory
from worker.embedding.streamline import streamline
from worker.logs import one_line

if TYPE_CHECKING:
    import onnx

# Bump when the derivation changes in a way that changes the bytes for the same inputs.
RECIPE_VERSION = 2

# The recipe names the derivation in the sidecar and the model id; `--int8` takes its name.
DEFAULT_RECIPE = "dynamic-per-channel"
RECIPES: dict[str, str] = {
    DEFAULT_RECIPE: "every weight MatMul int8 (per-channel weights, uint8 activations)",
}


def derive_bytes(source: Path) -> bytes:
    """The serialised int8 engine of ``source``: fold the weights, then quantize."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        model = onnx.load(str(source))
    except Exception as exc:
        raise QuantizeError(f"source model {source} cannot be parsed: {one_line(exc)}") from None
    with tempfile.TemporaryDirectory(prefix="kp-int8-") as scratch:
        model = folded(model, source, Path(scratch) / "folded.onnx")
        if not weight_matmuls(model):
            raise QuantizeError(f"source model {source} has no MatMul with constant weights")
        out = Path(scratch) / "model.onnx"
        logging.getLogger().addFilter(_not_a_quantizer_notice)
        try:
            quantize_dynamic(
                model,
                out,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                reduce_range=False,
                weight_type=QuantType.QInt8,
                extra_options={"WeightSymmetric": True},
            )
        except Exception as exc:
            raise QuantizeError(f"quantizing {source} to int8 failed: {one_line(exc)}") from None
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


def weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """The names of the MatMuls with a constant 2-D weight, the ones quantized, in graph
    order."""
    shapes = {init.name: len(init.dims) for init in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and shapes.get(node.input[1]) == 2
    ]


def _not_a_quantizer_notice(record: logging.LogRecord) -> bool:
    """quantize_dynamic warns on the root logger that pre-processing was not run; it is not
    wanted here (it would rewrite the graph) and the notice is noise in worker logs."""
    return "onnxruntime" not in record.pathname or record.levelno >= logging.ERROR
