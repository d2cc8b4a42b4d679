"""The sentence model cut at its encoder layers, so one text's tokens can run on several cores.

On CPU one onnxruntime run uses one core well: a lone 256-token text takes ~90 ms on one
thread, while the other core idles. Intra-op threads would split it, but every run would
then pay for them, and on a backlog two concurrent single-threaded runs are faster. This
module splits only the runs that have the cores to themselves.

Each encoder layer mixes tokens only through attention, whose scores read every token's
keys and values; everything else works token by token. So the optimised graph onnxruntime
builds for the model is cut into stages: the embeddings (with the first layer's keys and
values), then one stage per layer that maps its tokens' hidden states, plus the keys and
values of all tokens, to the next layer's hidden states, keys and values for those tokens.
A stage can run on all tokens at once, or on slices of the tokens on several threads, the
keys and values joined between layers.

The stages are cut from the graph onnxruntime optimised (its fused kernels included) and run
without further optimisation, so every token meets the same kernels on the same numbers as
in one whole run: the vectors are bit-identical. Building checks that on a probe, split and
whole, against the whole model, and gives the whole model back when anything differs or
the graph is not a recognisable encoder (an int8 engine's activation scale spans the whole
tensor, for instance, so its stages cannot be split).
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from worker.core.errors import one_line
from worker.core.streamline import GraphIndex

if TYPE_CHECKING:
    import onnx

FloatArray = npt.NDArray[np.float32]
Feeds = dict[str, np.ndarray]

# Slices keep at least this many tokens: a 64-token text in two slices took 0.71 of its
# whole time (bench/model_runs.py); shorter slices were not measured.
MIN_TOKENS_PER_SLICE = 32
# Long enough for the 3 slices the check runs; odd, and no other dimension of the model.
_PROBE_TOKENS = 3 * MIN_TOKENS_PER_SLICE + 7
_TOKEN_AXIS = 1  # of the inputs [batch, tokens] and the hidden states [batch, tokens, width]


class StagingUnavailable(Exception):
    """The model cannot be cut into exact stages; str() says why."""


@dataclass(frozen=True, slots=True)
class _LayerCut:
    """The tensors one encoder layer's attention reads, by name in the optimised graph."""

    hidden: str  # the layer's input hidden states
    keys: str  # every token's keys, as the attention scores read them
    values: str  # every token's values, as the attention output reads them
    mask: str  # what is added to the attention scores


@dataclass(frozen=True, slots=True)
class _Stage:
    session: ort.InferenceSession
    inputs: tuple[str, ...]  # cut tensors first, then the model inputs it reads shapes from
    outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Port:
    """A model input or output by name: the part of onnxruntime's NodeArg the embedder reads
    (a NodeArg would keep the whole model's session, and its weights, alive)."""

    name: str


@dataclass(frozen=True, slots=True)
class _Axes:
    """Where the token axis lies in the tensors that cross between stages."""

    keys: int
    values: int
    mask: int | None  # None: the mask is the same for every query token (broadcast)


class StagedEncoder:
    """The model as stages; `run` is a drop-in for `InferenceSession.run` with one output.

    Thread-safe like a session: each stage is an onnxruntime session, and a stage's
    sessions keep its share of the weights, once.
    """

    def __init__(
        self,
        embeddings: _Stage,
        layers: Sequence[_Stage],
        cuts: Sequence[_LayerCut],
        axes: _Axes,
        model_inputs: Sequence[str],
        output: str,
    ) -> None:
        self._embeddings = embeddings
        self._layers = tuple(layers)
        self._cuts = tuple(cuts)
        self._axes = axes
        self._model_inputs = [Port(name) for name in model_inputs]
        self._output = Port(output)

    def get_inputs(self) -> list[Port]:
        return list(self._model_inputs)

    def get_outputs(self) -> list[Port]:
        return [self._output]

    def run(self, output_names: Sequence[str] | None, feeds: Feeds) -> list[FloatArray]:
        """The model's output for `feeds`, all tokens at once on the calling thread."""
        return [self.run_split(feeds, None, lambda: 1)]

    def run_split(
        self,
        feeds: Feeds,
        helpers: Executor | None,
        slices_now: Callable[[], int],
    ) -> FloatArray:
        """The model's output for `feeds`, its tokens in slices run side by side.

        Before each layer `slices_now()` says how many slices the cores allow now (1: whole,
        when another run holds them); the tokens are cut again when that changes, so a run
        that started beside another splits once it is alone, and a split run joins its
        slices when another starts. Slice 0 runs on the calling thread, the others on
        `helpers`.
        """
        tokens = next(iter(feeds.values())).shape[_TOKEN_AXIS]
        most = most_slices(tokens) if helpers else 1
        first = self._embeddings.session.run(list(self._embeddings.outputs), feeds)
        hiddens, keys, values = [first[0]], first[-2], first[-1]
        masks = dict(zip(self._embeddings.outputs[1:-2], first[1:-2], strict=True))
        spans: list[tuple[int, int] | None] = [None]
        for stage, cut in zip(self._layers, self._cuts, strict=True):
            wanted = max(1, min(slices_now(), most))
            if wanted != len(spans):
                joined = _joined(hiddens, _TOKEN_AXIS)
                spans = _spans(tokens, wanted)
                hiddens = [
                    joined if span is None else joined[:, span[0] : span[1]] for span in spans
                ]
            run = functools.partial(self._run_stage, stage, keys, values, masks[cut.mask], feeds)
            pending = []
            if helpers is not None:
                parts = zip(hiddens[1:], spans[1:], strict=True)
                pending = [helpers.submit(run, part, span) for part, span in parts]
            outs = [run(hiddens[0], spans[0]), *(future.result() for future in pending)]
            hiddens = [out[0] for out in outs]
            if len(stage.outputs) > 1:  # not the last layer: the next one's keys and values
                keys = _joined([out[1] for out in outs], self._axes.keys)
                values = _joined([out[2] for out in outs], self._axes.values)
        return _joined(hiddens, _TOKEN_AXIS)

    def _run_stage(
        self,
        stage: _Stage,
        keys: FloatArray,
        values: FloatArray,
        mask: FloatArray,
        feeds: Feeds,
        hidden: FloatArray,
        span: tuple[int, int] | None,
    ) -> list[FloatArray]:
        if span is not None and self._axes.mask is not None:
            mask = _take(mask, self._axes.mask, span)
        stage_feeds: Feeds = dict(zip(stage.inputs[:4], (hidden, keys, values, mask), strict=True))
        for name in stage.inputs[4:]:  # read for their shape only
            stage_feeds[name] = feeds[name] if span is None else feeds[name][:, span[0] : span[1]]
        return stage.session.run(list(stage.outputs), stage_feeds)


def most_slices(tokens: int) -> int:
    """How many slices a text of `tokens` tokens may be cut into (MIN_TOKENS_PER_SLICE each)."""
    return max(1, tokens // MIN_TOKENS_PER_SLICE)


def _spans(tokens: int, slices: int) -> list[tuple[int, int] | None]:
    """Token ranges of `slices` near-equal slices; [None] for one (all tokens, no cut)."""
    if slices == 1:
        return [None]
    return list(itertools.pairwise(round(tokens * i / slices) for i in range(slices + 1)))


def _joined(parts: list[FloatArray], axis: int) -> FloatArray:
    """The slices' outputs as one tensor; a whole run's as it is (no copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def _take(array: np.ndarray, axis: int, span: tuple[int, int]) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(*span)
    return array[tuple(index)]


def staged_encoder(
    model: str | bytes,
    options: Callable[[], ort.SessionOptions],
    output_name: str,
    probe_token_ids: Sequence[int],
) -> tuple[ort.InferenceSession | StagedEncoder, str | None]:
    """(the staged encoder, None), or (the whole model's session, why it is not staged).

    The stages produce `output_name` (the model's first output when it has none of that
    name). `options` makes the session options every session here uses. The whole model is
    loaded first to let onnxruntime optimise it; its output on a probe (`probe_token_ids`,
    cycled to length) is the reference that the stages must match bit for bit, run whole
    and split. It is let go before the stages are built, so the weights are held once
    more at most while loading.
    """
    with tempfile.TemporaryDirectory(prefix="kp-stages-") as folder:
        optimised_path = Path(folder) / "optimised.onnx"
        whole_options = options()
        whole_options.optimized_model_filepath = str(optimised_path)
        whole = ort.InferenceSession(model, sess_options=whole_options, providers=_PROVIDERS)
        outputs = [o.name for o in whole.get_outputs()]
        output_name = output_name if output_name in outputs else outputs[0]
        input_names = [i.name for i in whole.get_inputs()]
        try:
            probes = _probe_feeds(input_names, probe_token_ids)
            expected = [whole.run([output_name], feeds)[0] for feeds in probes]
        except Exception as exc:  # the embedder's own smoke test will say what is wrong
            return whole, f"the whole model failed on the probe: {one_line(exc)}"
        del whole
        try:
            staged = _build(optimised_path, options, output_name, input_names, probes[0])
            reason = _difference(staged, probes, expected)
        except StagingUnavailable as exc:
            reason = str(exc)
        except Exception as exc:  # any other failure to cut leaves the whole model
            reason = f"cutting the model failed: {one_line(exc)}"
    if reason is None:
        return staged, None
    return ort.InferenceSession(model, sess_options=options(), providers=_PROVIDERS), reason


_PROVIDERS = ["CPUExecutionProvider"]


def _difference(
    staged: StagedEncoder, probes: list[Feeds], expected: list[FloatArray]
) -> str | None:
    """None when the stages give the whole model's bits on every probe, whole and split."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2, thread_name_prefix="kp-stage-check") as helpers:
        for feeds, reference in zip(probes, expected, strict=True):
            for slices in (1, 2, 3):
                got = staged.run_split(feeds, helpers, lambda slices=slices: slices)
                if got.shape != reference.shape or not np.array_equal(got, reference):
                    return f"the stages differ from the whole model ({slices} slices)"
    return None


def _probe_feeds(input_names: Sequence[str], token_ids: Sequence[int]) -> list[Feeds]:
    """One text alone and a padded batch of two: the shapes the embedder feeds."""
    ids = np.resize(np.asarray(token_ids, dtype=np.int64), _PROBE_TOKENS)
    batch = np.stack([ids, np.roll(ids, 5)])
    batch_mask = np.ones_like(batch)
    batch_mask[1, -9:] = 0
    batch[1, -9:] = 0
    probes = []
    for input_ids, mask in (
        (ids[None, :], np.ones((1, _PROBE_TOKENS), np.int64)),
        (batch, batch_mask),
    ):
        feeds: Feeds = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        probes.append(feeds)
    return probes


def _build(
    optimised_path: Path,
    options: Callable[[], ort.SessionOptions],
    output_name: str,
    input_names: Sequence[str],
    probe: Feeds,
) -> StagedEncoder:
    import onnx

    graph_model = onnx.load(str(optimised_path))
    index = GraphIndex(graph_model.graph)
    cuts = _find_cuts(graph_model.graph, index)
    # One stage's bytes at a time: each session takes its share of the weights as it loads.
    stages = [
        _Stage(_session(model_bytes, options), inputs, outputs)
        for model_bytes, inputs, outputs in _plan_stages(graph_model, index, cuts, output_name)
    ]
    del graph_model, index
    return StagedEncoder(
        stages[0], stages[1:], cuts, _token_axes(stages[0], cuts, probe), input_names, output_name
    )


def _session(model_bytes: bytes, options: Callable[[], ort.SessionOptions]) -> ort.InferenceSession:
    stage_options = options()
    # The graph is already optimised: optimising a stage again could fuse differently.
    stage_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model_bytes, sess_options=stage_options, providers=_PROVIDERS)


def _token_axes(embeddings: _Stage, cuts: Sequence[_LayerCut], probe: Feeds) -> _Axes:
    """The token axis of the keys, values and mask, read from their shapes on the probe."""
    tokens = probe["input_ids"].shape[_TOKEN_AXIS]
    produced = embeddings.session.run(list(embeddings.outputs), probe)
    shapes = {name: out.shape for name, out in zip(embeddings.outputs, produced, strict=True)}

    def only_token_axis(name: str) -> int:
        shape = shapes[name]
        matches = [axis - len(shape) for axis, size in enumerate(shape) if size == tokens]
        if len(matches) != 1:
            raise StagingUnavailable(f"{name} (shape {shape}) has no single token axis")
        return matches[0]

    if len(shapes[cuts[0].hidden]) != 3 or shapes[cuts[0].hidden][_TOKEN_AXIS] != tokens:
        raise StagingUnavailable("the hidden states are not [batch, tokens, width]")
    mask_shape = shapes[cuts[0].mask]
    if (
        len(mask_shape) < 2
        or mask_shape[-1] not in (1, tokens)
        or mask_shape[-2] not in (1, tokens)
    ):
        raise StagingUnavailable(
            f"the attention mask's shape {mask_shape} is not [.., queries, keys]"
        )
    return _Axes(
        keys=only_token_axis(cuts[0].keys),
        values=only_token_axis(cuts[0].values),
        mask=-2 if mask_shape[-2] == tokens else None,
    )


def _find_cuts(graph: onnx.GraphProto, index: GraphIndex) -> list[_LayerCut]:
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
        cuts.append(_LayerCut(hidden, score_product.input[1], readers[0].input[1], mask))
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


def _plan_stages(
    model: onnx.ModelProto, index: GraphIndex, cuts: Sequence[_LayerCut], output_name: str
) -> Iterator[tuple[bytes, tuple[str, ...], tuple[str, ...]]]:
    """(model bytes, inputs, outputs) of the embeddings stage, then of one stage per layer."""
    model_inputs = [i.name for i in model.graph.input]
    extract = functools.partial(_extract, model, index)
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
) -> tuple[bytes, tuple[str, ...], tuple[str, ...]]:
    """The nodes computing `outputs` from `inputs` as a model of their own.

    Model inputs in `shapes_only` may be read, but only by Shape nodes: a layer stage gets
    them sliced like its tokens, which is only right for their shape.
    """
    from onnx import TensorProto, helper

    graph = model.graph
    producer, initializers = index.producer, index.initializers
    order = {id(node): position for position, node in enumerate(graph.node)}
    declared = {i.name: i for i in graph.input}
    wanted, seen = list(outputs), set(inputs)
    nodes: dict[int, onnx.NodeProto] = {}
    used_initializers: list[str] = []
    read_for_shape: list[str] = []
    while wanted:
        name = wanted.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in initializers:
            used_initializers.append(name)
        elif name in declared:
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
    stage_inputs = (*inputs, *sorted(read_for_shape))
    sorted_nodes = sorted(nodes.values(), key=lambda node: order[id(node)])
    stage_graph = helper.make_graph(
        sorted_nodes,
        "stage",
        [
            declared[name]
            if name in declared
            else helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
            for name in stage_inputs
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        initializer=[initializers[name] for name in used_initializers],
    )
    stage_model = helper.make_model(
        stage_graph, opset_imports=model.opset_import, ir_version=model.ir_version
    )
    return stage_model.SerializeToString(), stage_inputs, tuple(outputs)


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)
