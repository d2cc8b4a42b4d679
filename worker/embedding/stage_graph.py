"""Where the sentence model is cut into stages, and the one model that holds them as branches.

:mod:`worker.embedding.stages` runs the stages; this module reads the optimised graph: it
finds each encoder layer's attention inputs, extracts the nodes between two cuts, and joins
the whole model and every stage into one model whose branch a run picks by an input.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from worker.embedding.streamline import GraphIndex

if TYPE_CHECKING:
    import onnx


class StagingUnavailable(Exception):
    """The model cannot be cut into exact stages; str() says why."""


@dataclass(frozen=True, slots=True)
class LayerCut:
    """The tensors one encoder layer's attention reads, by name in the optimised graph."""

    hidden: str  # the layer's input hidden states
    keys: str  # every token's keys, as the attention scores read them
    values: str  # every token's values, as the attention output reads them
    mask: str  # what is added to the attention scores


def find_cuts(graph: onnx.GraphProto, index: GraphIndex) -> list[LayerCut]:
    """Each attention's inputs, in layer order: Softmax(scores + mask) @ values, where the
    scores multiply queries made from the layer's hidden states by every token's keys."""
    producer, consumers = index.producer, index.consumers
    cuts = []
    for softmax in (n for n in graph.node if n.op_type == "Softmax"):
        if _attribute(softmax, "axis", -1) != -1:
            raise StagingUnavailable("an attention softmax is not over its last axis")
        scores_plus_mask = producer.get(softmax.input[0])
        if scores_plus_mask is None or scores_plus_mask.op_type != "Add":
            raise StagingUnavailable("an attention softmax does not follow scores + mask")
        scores = [
            producer[name]
            for name in scores_plus_mask.input
            if name in producer and producer[name].op_type in ("MatMul", "FusedMatMul")
        ]
        if len(scores) != 1:
            raise StagingUnavailable("attention scores are not one product of queries and keys")
        (score_product,) = scores
        mask = next(name for name in scores_plus_mask.input if name != score_product.output[0])
        if score_product.op_type == "FusedMatMul" and (
            _attribute(score_product, "transA", 0) or _attribute(score_product, "transBatchA", 0)
        ):
            raise StagingUnavailable("attention scores transpose their queries")
        readers = consumers.get(softmax.output[0], [])
        if (
            len(readers) != 1
            or readers[0].op_type != "MatMul"
            or readers[0].input[0] != softmax.output[0]
        ):
            raise StagingUnavailable("attention weights are not multiplied by values")
        hidden = _projected_from(producer, score_product.input[0])
        cuts.append(LayerCut(hidden, score_product.input[1], readers[0].input[1], mask))
    if not cuts:
        raise StagingUnavailable("the model has no attention softmax")
    return cuts


_TOKENWISE_RESHAPING = frozenset({"Reshape", "Transpose", "Add", "Mul", "Div"})


def _projected_from(producer: dict[str, onnx.NodeProto], queries: str) -> str:
    """The hidden states the queries are projected from (MatMul, bias, reshaping)."""
    name = queries
    for _ in range(16):
        node = producer.get(name)
        if node is None:
            break
        if node.op_type == "MatMul":
            return node.input[0]
        if node.op_type not in _TOKENWISE_RESHAPING:
            break
        name = node.input[0]
    raise StagingUnavailable("the attention queries are not a projection of hidden states")


@dataclass(frozen=True, slots=True)
class _Part:
    """The nodes that compute `outputs` from `inputs`, in graph order."""

    nodes: tuple[onnx.NodeProto, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def plan_stages(
    model: onnx.ModelProto, index: GraphIndex, cuts: Sequence[LayerCut], output_name: str
) -> Iterator[_Part]:
    """The whole model, the embeddings stage, then one stage per layer."""
    model_inputs = [i.name for i in model.graph.input]
    extract = functools.partial(_extract, model, index)
    yield extract(model_inputs, (output_name,), shapes_only=())
    masks = tuple(dict.fromkeys(cut.mask for cut in cuts))
    first_outputs = (cuts[0].hidden, *masks, cuts[0].keys, cuts[0].values)
    yield extract(model_inputs, first_outputs, shapes_only=())
    for layer, cut in enumerate(cuts):
        if layer + 1 < len(cuts):
            after = cuts[layer + 1]
            outputs: tuple[str, ...] = (after.hidden, after.keys, after.values)
        else:
            outputs = (output_name,)
        cut_inputs = (cut.hidden, cut.keys, cut.values, cut.mask)
        yield extract(cut_inputs, outputs, shapes_only=model_inputs)


def _extract(
    model: onnx.ModelProto,
    index: GraphIndex,
    inputs: Sequence[str],
    outputs: Sequence[str],
    *,
    shapes_only: Sequence[str],
) -> _Part:
    """The nodes computing `outputs` from `inputs`.

    Model inputs in `shapes_only` may be read, but only by Shape nodes: a layer stage gets
    them sliced like its tokens, which is only right for their shape.
    """
    graph = model.graph
    producer, initializers = index.producer, index.initializers
    order = {id(node): position for position, node in enumerate(graph.node)}
    declared = {i.name for i in graph.input}
    wanted, seen = list(outputs), set(inputs)
    nodes: dict[int, onnx.NodeProto] = {}
    read_for_shape: list[str] = []
    while wanted:
        name = wanted.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in initializers:
            continue
        if name in declared:
            if name not in shapes_only:
                raise StagingUnavailable(f"a layer reads the model input {name}")
            read_for_shape.append(name)
        elif name in producer:
            node = producer[name]
            nodes[id(node)] = node
            wanted.extend(node.input)
        else:
            raise StagingUnavailable(f"nothing in the model produces {name}")
    for node in nodes.values():
        if node.op_type != "Shape" and any(name in read_for_shape for name in node.input):
            raise StagingUnavailable(f"a layer reads {node.input[0]} beyond its shape")
    sorted_nodes = sorted(nodes.values(), key=lambda node: order[id(node)])
    return _Part(tuple(sorted_nodes), (*inputs, *sorted(read_for_shape)), tuple(outputs))


BRANCH_INPUT = "kp_stage"  # which branch a run takes
_EMPTY = np.zeros(0, np.float32)  # what a branch not taken returns


def branched(
    model: onnx.ModelProto, parts: Sequence[_Part]
) -> tuple[bytes, list[tuple[tuple[str, ...], tuple[str, ...]]]]:
    """One model holding every part as a branch taken when its number is fed as `BRANCH_INPUT`;
    and, for each part, the model's names for its inputs and outputs.

    The branches read the weights from the one graph around them, so one session holds
    them once, packed once, whichever branch runs. A branch not taken returns empty
    tensors without reading its inputs; every input but `BRANCH_INPUT` has an empty default, so a
    run feeds only its own branch's. `model` itself is rewritten into that model.
    """
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    declared = {i.name: i for i in graph.input}
    model_inputs = tuple(declared)
    graph_inputs = [helper.make_tensor_value_info(BRANCH_INPUT, TensorProto.INT64, [])]
    defaults: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    graph_outputs: list[onnx.ValueInfoProto] = []
    names: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    def add_input(name: str, like: str | None) -> None:
        """`name` as an input with an empty default, typed like the model input `like`
        (a float tensor when None)."""
        if like is None:
            elem_type, rank = TensorProto.FLOAT, 1
        else:
            spec = declared[like].type.tensor_type
            elem_type, rank = spec.elem_type, len(spec.shape.dim)
        graph_inputs.append(helper.make_tensor_value_info(name, elem_type, None))
        empty = np.zeros((0,) * rank, helper.tensor_dtype_to_np_dtype(elem_type))
        defaults.append(numpy_helper.from_array(empty, name))

    for name in model_inputs:
        add_input(name, like=name)
    for number, part in enumerate(parts):
        prefix = f"{number}:"
        own_inputs = part.inputs != model_inputs  # a layer's: cut tensors, sliced inputs
        renamed = {name: prefix + name for name in part.inputs} if own_inputs else {}
        for name in renamed:
            add_input(renamed[name], like=name if name in declared else None)
        taken = helper.make_graph(
            _prefixed(part.nodes, prefix, renamed),
            f"stage{number}",
            [],
            [
                helper.make_tensor_value_info(prefix + n, TensorProto.FLOAT, None)
                for n in part.outputs
            ],
        )
        empties = [f"{prefix}empty{j}" for j in range(len(part.outputs))]
        not_taken = helper.make_graph(
            [
                helper.make_node("Constant", [], [name], value=numpy_helper.from_array(_EMPTY))
                for name in empties
            ],
            f"skip{number}",
            [],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in empties],
        )
        number_name, chosen = f"{prefix}number", f"{prefix}chosen"
        fetched = tuple(f"stage{number}/{name}" for name in part.outputs)
        nodes += [
            helper.make_node(
                "Constant",
                [],
                [number_name],
                value=numpy_helper.from_array(np.array(number, np.int64)),
            ),
            helper.make_node("Equal", [BRANCH_INPUT, number_name], [chosen]),
            helper.make_node(
                "If", [chosen], list(fetched), then_branch=taken, else_branch=not_taken
            ),
        ]
        graph_outputs += [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in fetched
        ]
        names.append((tuple(renamed.get(name, name) for name in part.inputs), fetched))
    # The graph becomes the branched one in place: a copy would hold the weights twice.
    for field, items in (
        (graph.node, nodes),
        (graph.input, graph_inputs),
        (graph.output, graph_outputs),
        (graph.value_info, []),  # the names it typed now live inside the branches
    ):
        del field[:]
        field.extend(items)
    graph.initializer.extend(defaults)
    graph.name = "stages"
    return model.SerializeToString(), names


def _prefixed(
    nodes: Sequence[onnx.NodeProto], prefix: str, renamed: dict[str, str]
) -> list[onnx.NodeProto]:
    """Copies of `nodes` whose own tensors and names carry `prefix`, their inputs renamed
    by `renamed`: a branch of its own beside the others, reading the same weights."""
    produced = {out for node in nodes for out in node.output if out}
    copies = []
    for node in nodes:
        copy = type(node)()
        copy.CopyFrom(node)
        if copy.name:
            copy.name = prefix + copy.name
        for position, name in enumerate(copy.input):
            if name in produced:
                copy.input[position] = prefix + name
            elif name in renamed:
                copy.input[position] = renamed[name]
        for position, name in enumerate(copy.output):
            if name:
                copy.output[position] = prefix + name
        copies.append(copy)
    return copies


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)
