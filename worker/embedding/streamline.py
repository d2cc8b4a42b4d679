"""Exact rewrites of the sentence model's graph, applied when the embedder loads it.

Each rewrite leaves every output bit-identical for every input the embedder feeds (the tests
compare vectors bit for bit against the model as shipped) and only removes work or memory:

- **Softmax NaN guards.** The exporter wraps each attention softmax in
  ``Where(IsNaN(p), 0, p)``, for rows whose every key is masked. The embedder never feeds
  such a row (every text has at least its [CLS] and [SEP] tokens, never masked), and the
  scores are finite, so the guard returns ``p`` unchanged; evaluating it over the
  heads x tokens x tokens tensor took 7 % of a 256-token run.
- **Embedding tables dequantized after the lookup.** The packaged model stores its token
  and position tables as int8 with a scale per row and computes ``Gather(Cast(q) * s, ids)``;
  onnxruntime folds the whole 30,522 x 384 table to float32 at load (45 MiB resident).
  ``Cast(Gather(q, ids)) * Gather(s, ids)`` multiplies the same two float32 numbers for
  every element it returns, so it gives the same bits from the 11 MiB int8 table.

Rewrites match exact patterns only; a graph without them (an fp32 export, another
exporter) is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True, slots=True)
class Streamlined:
    """What :func:`streamline` changed (both zero: the graph is untouched)."""

    nan_guards_removed: int
    tables_gathered_first: int

    @property
    def changed(self) -> bool:
        return bool(self.nan_guards_removed or self.tables_gathered_first)


def streamline(model: onnx.ModelProto) -> Streamlined:
    """Apply the exact rewrites to ``model`` in place; say what was changed.

    A graph with subgraphs (If, Loop, Scan) is left alone: their nodes read outer names
    that a rewrite here would not see.
    """
    if any(
        attribute.g.node or attribute.graphs
        for node in model.graph.node
        for attribute in node.attribute
    ):
        return Streamlined(0, 0)
    guards = _remove_softmax_nan_guards(model.graph)
    tables = _gather_before_dequantizing(model.graph)
    if guards or tables:
        _drop_unused(model.graph)
    return Streamlined(guards, tables)


class GraphIndex:
    """Producer, consumers and constants of one graph, read once before a rewrite or a cut."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {out.name for out in graph.output}
        self.initializers = {init.name: init for init in graph.initializer}
        self.constants: dict[str, np.ndarray] = {
            node.output[0]: numpy_helper.to_array(node.attribute[0].t)
            for node in graph.node
            if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]
        }
        self._numpy_helper = numpy_helper

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return self._numpy_helper.to_array(self.initializers[name])
        return self.constants.get(name)

    def made_by(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None


def _remove_softmax_nan_guards(graph: onnx.GraphProto) -> int:
    """``Where(IsNaN(p), 0, p)`` over a Softmax output ``p`` -> ``p``."""
    view = GraphIndex(graph)
    replaced: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "Where" or len(node.input) != 3 or node.output[0] in view.outputs:
            continue
        condition, fill, probabilities = node.input
        is_nan = view.made_by(condition, "IsNaN")
        zero = view.constant(fill)
        if (
            is_nan is not None
            and is_nan.input[0] == probabilities
            and view.made_by(probabilities, "Softmax") is not None
            and zero is not None
            and zero.size == 1
            and float(zero.reshape(())) == 0.0
        ):
            replaced[node.output[0]] = probabilities
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in replaced:
                node.input[index] = replaced[name]
    return len(replaced)


def _gather_before_dequantizing(graph: onnx.GraphProto) -> int:
    """``Gather(Cast(q) * s, ids)`` with a per-row or per-column scale -> the lookup first."""
    import onnx
    from onnx import helper

    view = GraphIndex(graph)
    rewritten = 0
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        replacement = _gathered_first(view, node) if node.op_type == "Gather" else None
        if replacement is None:
            nodes.append(node)
            continue
        quantized, scale, per_row = replacement
        ids, out = node.input[1], node.output[0]
        nodes.append(helper.make_node("Gather", [quantized, ids], [f"{out}/q"], axis=0))
        nodes.append(
            helper.make_node("Cast", [f"{out}/q"], [f"{out}/f"], to=onnx.TensorProto.FLOAT)
        )
        if per_row:
            nodes.append(helper.make_node("Gather", [scale, ids], [f"{out}/scale"], axis=0))
            scale = f"{out}/scale"
        nodes.append(helper.make_node("Mul", [f"{out}/f", scale], [out]))
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def _gathered_first(view: GraphIndex, gather: onnx.NodeProto) -> tuple[str, str, bool] | None:
    """(int8 table, scale, scale is per row) when ``gather`` looks rows up in a table that
    is dequantized only for this lookup; None otherwise."""
    import onnx

    axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
    table = gather.input[0]
    mul = view.made_by(table, "Mul")
    if axis != 0 or mul is None or table in view.outputs or len(view.consumers.get(table, [])) != 1:
        return None
    for cast_input, scale in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        cast = view.made_by(cast_input, "Cast")
        if cast is None or len(view.consumers.get(cast_input, [])) != 1:
            continue
        quantized = view.initializers.get(cast.input[0])
        to = next((a.i for a in cast.attribute if a.name == "to"), None)
        scales = view.constant(scale)
        if (
            quantized is None
            or quantized.data_type not in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
            or to != onnx.TensorProto.FLOAT
            or len(quantized.dims) != 2
            or scales is None
            or scales.dtype != np.float32
            or scale not in view.initializers
        ):
            continue
        rows, columns = quantized.dims
        if scales.shape == (rows, 1):
            return cast.input[0], scale, True
        if scales.shape in ((), (1,), (columns,), (1, columns)):
            return cast.input[0], scale, False
    return None


def _drop_unused(graph: onnx.GraphProto) -> None:
    """Remove nodes whose outputs nothing reads, then initializers nothing reads."""
    wanted = {out.name for out in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(out in wanted for out in node.output):
            kept.append(node)
            wanted.update(name for name in node.input if name)
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(reversed(kept))
    initializers = [init for init in graph.initializer if init.name in wanted]
    if len(initializers) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(initializers)
