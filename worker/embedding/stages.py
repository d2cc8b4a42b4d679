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

The whole model and each stage are branches of one onnxruntime model, chosen by an input:
they read the same weights, so one session holds and packs them once. A run that will not
be split (a backlog, a short text) takes the whole-model branch in one call, without going
back to Python between layers, where it could wait for the interpreter lock.

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
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from worker.embedding.session import SessionFactory
from worker.embedding.stage_graph import (
    BRANCH_INPUT,
    LayerCut,
    StagingUnavailable,
    branched,
    find_cuts,
    plan_stages,
)
from worker.embedding.streamline import GraphIndex
from worker.logs import one_line
from worker.memory import release_freed_memory

FloatArray = npt.NDArray[np.float32]
Feeds = dict[str, np.ndarray]

# Slices keep at least this many tokens: a 64-token text in two slices took 0.71 of its
# whole time (bench/model_runs.py); shorter slices were not measured.
MIN_TOKENS_PER_SLICE = 32
# Long enough for the 3 slices the check runs; odd, and no other dimension of the model.
PROBE_TOKENS = 3 * MIN_TOKENS_PER_SLICE + 7
_TOKEN_AXIS = 1  # of the inputs [batch, tokens] and the hidden states [batch, tokens, width]


@dataclass(frozen=True, slots=True)
class Stage:
    """One way through the shared session: the whole model, or one stage of it."""

    session: ort.InferenceSession
    path: np.ndarray  # the selector that runs this stage's branch alone
    inputs: tuple[str, ...]  # cut tensors first, then the model inputs it reads shapes from
    outputs: tuple[str, ...]
    feed_names: tuple[str, ...]  # the session's names for `inputs`
    fetch_names: tuple[str, ...]  # the session's names for `outputs`

    def run(self, feeds: Feeds) -> list[FloatArray]:
        """This stage's outputs for `feeds` (by the names in `inputs`)."""
        session_feeds: Feeds = {BRANCH_INPUT: self.path}
        for name, feed_name in zip(self.inputs, self.feed_names, strict=True):
            session_feeds[feed_name] = feeds[name]
        return self.session.run(list(self.fetch_names), session_feeds)


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
    """The model whole or as stages; `run` is a drop-in for `InferenceSession.run` with one
    output.

    Thread-safe like a session: every stage is a branch of one onnxruntime session, which
    keeps the weights once.
    """

    def __init__(
        self,
        whole: Stage,
        embeddings: Stage,
        layers: Sequence[Stage],
        cuts: Sequence[LayerCut],
        axes: _Axes,
        model_inputs: Sequence[str],
        output: str,
    ) -> None:
        self._whole = whole
        self._embeddings = embeddings
        self._layers = tuple(layers)
        self._cuts = tuple(cuts)
        self._axes = axes
        self._model_inputs = [Port(name) for name in model_inputs]
        self._output = Port(output)

    @property
    def branches(self) -> tuple[Stage, ...]:
        """The whole model, the embeddings stage, then each layer's: the session's branches
        in the order of their numbers."""
        return (self._whole, self._embeddings, *self._layers)

    def get_inputs(self) -> list[Port]:
        return list(self._model_inputs)

    def get_outputs(self) -> list[Port]:
        return [self._output]

    def run(self, output_names: Sequence[str] | None, feeds: Feeds) -> list[FloatArray]:
        """The model's output for `feeds`: the whole model in one run on the calling thread."""
        return [self._whole.run(feeds)[0]]

    def run_split(
        self,
        feeds: Feeds,
        helpers: Executor | None,
        slices_now: Callable[[], int],
    ) -> FloatArray:
        """The model's output for `feeds`, its tokens in slices run side by side.

        Before each layer `slices_now()` says how many slices the cores allow now (1: whole,
        when another run holds them). A run that starts with the cores shared runs the whole
        model in one go; one that starts alone runs stage by stage, its tokens cut again when
        that changes, so a split run joins its slices when another starts and splits again
        once alone. Slice 0 runs on the calling thread, the others on `helpers`.
        """
        tokens = next(iter(feeds.values())).shape[_TOKEN_AXIS]
        most = most_slices(tokens) if helpers else 1

        def cores_allow() -> int:
            return max(1, min(slices_now(), most))

        wanted = cores_allow() if most > 1 else 1
        if wanted == 1:
            return self._whole.run(feeds)[0]
        first = self._embeddings.run(feeds)
        hiddens, keys, values = [first[0]], first[-2], first[-1]
        masks = dict(zip(self._embeddings.outputs[1:-2], first[1:-2], strict=True))
        spans: list[tuple[int, int] | None] = [None]
        for layer, (stage, cut) in enumerate(zip(self._layers, self._cuts, strict=True)):
            if layer:
                wanted = cores_allow()
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
        stage: Stage,
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
        return stage.run(stage_feeds)


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
    sessions: SessionFactory,
    output_name: str,
    probe_token_ids: Sequence[int],
) -> tuple[ort.InferenceSession | StagedEncoder, str | None]:
    """(the staged encoder, None), or (the whole model's session, why it is not staged).

    The stages produce `output_name` (the model's first output when it has none of that
    name). `sessions` opens every session here. The whole model is
    loaded first to let onnxruntime optimise it; its output on a probe (`probe_token_ids`,
    cycled to length) is the reference that the stages must match bit for bit, run whole
    and split. It is let go before the stages are built, so the weights are held once
    more at most while loading.
    """
    with tempfile.TemporaryDirectory(prefix="kp-stages-") as folder:
        optimised_path = Path(folder) / "optimised.onnx"
        whole = sessions.open(model, optimised_to=optimised_path)
        outputs = [o.name for o in whole.get_outputs()]
        output_name = output_name if output_name in outputs else outputs[0]
        input_names = [i.name for i in whole.get_inputs()]
        try:
            probes = _probe_feeds(input_names, probe_token_ids)
            expected = [whole.run([output_name], feeds)[0] for feeds in probes]
        except Exception as exc:  # the embedder's own smoke test will say what is wrong
            return whole, f"the whole model failed on the probe: {one_line(exc)}"
        del whole
        release_freed_memory()  # lowers the peak: the stages' model is as large again
        try:
            staged = _build(optimised_path, sessions, output_name, input_names, probes[0])
            reason = _difference(staged, probes, expected)
        except StagingUnavailable as exc:
            reason = str(exc)
        except Exception as exc:  # any other failure to cut leaves the whole model
            reason = f"cutting the model failed: {one_line(exc)}"
    if reason is None:
        return staged, None
    return sessions.open(model), reason


def _difference(
    staged: StagedEncoder, probes: list[Feeds], expected: list[FloatArray]
) -> str | None:
    """None when every way of running the model gives the whole model's bits on every
    probe: in one go, stage by stage in 2 or 3 slices, and split for the first layer only
    (the rest stage by stage, whole)."""
    from concurrent.futures import ThreadPoolExecutor

    ways: list[tuple[str, Callable[[], Callable[[], int]]]] = [
        ("1 slice", lambda: lambda: 1),
        ("2 slices", lambda: lambda: 2),
        ("3 slices", lambda: lambda: 3),
        ("2 slices, then 1", lambda: itertools.chain([2], itertools.repeat(1)).__next__),
    ]
    with ThreadPoolExecutor(2, thread_name_prefix="kp-stage-check") as helpers:
        for feeds, reference in zip(probes, expected, strict=True):
            for way, slices_now in ways:
                got = staged.run_split(feeds, helpers, slices_now())
                if got.shape != reference.shape or not np.array_equal(got, reference):
                    return f"the stages differ from the whole model ({way})"
    return None


def _probe_feeds(input_names: Sequence[str], token_ids: Sequence[int]) -> list[Feeds]:
    """One text alone and a padded batch of two: the shapes the embedder feeds."""
    ids = np.resize(np.asarray(token_ids, dtype=np.int64), PROBE_TOKENS)
    batch = np.stack([ids, np.roll(ids, 5)])
    batch_mask = np.ones_like(batch)
    batch_mask[1, -9:] = 0
    batch[1, -9:] = 0
    probes = []
    for input_ids, mask in (
        (ids[None, :], np.ones((1, PROBE_TOKENS), np.int64)),
        (batch, batch_mask),
    ):
        feeds: Feeds = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        probes.append(feeds)
    return probes


def _build(
    optimised_path: Path,
    sessions: SessionFactory,
    output_name: str,
    input_names: Sequence[str],
    probe: Feeds,
) -> StagedEncoder:
    import onnx

    graph_model = onnx.load(str(optimised_path))
    index = GraphIndex(graph_model.graph)
    cuts = find_cuts(graph_model.graph, index)
    parts = list(plan_stages(graph_model, index, cuts, output_name))
    release_freed_memory()  # what loading the graph freed, before its bytes are written
    model_bytes, names = branched(graph_model, parts)
    ports = [(part.inputs, part.outputs) for part in parts]
    del graph_model, index, parts  # the weights live on in model_bytes alone
    # The graph is already optimised: optimising it again could fuse differently.
    session = sessions.open(model_bytes, optimise=False)
    del model_bytes
    whole, embeddings, *layers = (
        Stage(session, np.array(number, dtype=np.int64), *ports[number], *names[number])
        for number in range(len(ports))
    )
    axes = _token_axes(embeddings, cuts, probe)
    return StagedEncoder(whole, embeddings, layers, cuts, axes, input_names, output_name)


def _token_axes(embeddings: Stage, cuts: Sequence[LayerCut], probe: Feeds) -> _Axes:
    """The token axis of the keys, values and mask, read from their shapes on the probe."""
    tokens = probe["input_ids"].shape[_TOKEN_AXIS]
    produced = embeddings.run(probe)
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
