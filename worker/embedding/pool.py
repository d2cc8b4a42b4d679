"""The pool of model runs: texts spread over a few threads that share one model."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding

from worker.embedding.encoder import Encoder, Feeds, IntArray
from worker.embedding.protocol import DIMENSIONS, FloatArray, RunTiming
from worker.embedding.session import output_name
from worker.embedding.stages import StagedEncoder, most_slices


class OnnxEmbedder:
    """One model and one tokenizer, run by up to `concurrency` threads at once.

    On CPU, separate single-threaded runs use the cores better than one run split over
    intra-op threads, so texts are spread over a small pool of threads that all call the same
    model (`InferenceSession.run` and `Tokenizer.encode_batch` are thread-safe; the model is
    one session, with one copy of the weights). A text's vector does not depend on which
    thread ran it.

    A long run that starts while other threads have no work splits its tokens over them,
    layer by layer (:mod:`worker.embedding.stages`), so a trace that arrives alone uses every
    core; a backlog runs one text per core, each in one model call.
    """

    model_id: str
    dimensions: int

    def __init__(
        self,
        *,
        model: ort.InferenceSession | StagedEncoder,
        encoder: Encoder,
        model_id: str,
        batch_size: int,
        concurrency: int = 1,
        split_min_tokens: int = 0,
        split_note: str | None = None,
    ) -> None:
        """Use :func:`worker.embedding.load.open_embedder`; this only wires already-validated
        parts together."""
        self.model_id = model_id
        self.dimensions = DIMENSIONS
        self.batch_size = batch_size
        self.concurrency = concurrency
        self._pool: ThreadPoolExecutor | None = None
        self.slice_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.thread_use = ThreadUse(concurrency)
        self.runs_split = 0  # model runs that ran at least one layer in slices
        self.model = model  # one session, or the same weights as stages
        self.encoder = encoder
        # Splitting a run over the idle threads needs the stages and more than one thread.
        self._split_min_tokens = (
            split_min_tokens if isinstance(model, StagedEncoder) and concurrency > 1 else 0
        )
        # Why runs are never split (None: they are, when the other threads are idle).
        self.split_note = (
            split_note
            if self._split_min_tokens
            else (split_note or "runs are not split (KP_EMBED_SPLIT_MIN_TOKENS=0 or one thread)")
        )
        self._output_name = output_name([o.name for o in model.get_outputs()])

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Unit vectors [len(texts), 384] float32, in the order given.

        Texts are sorted by token count and run `batch_size` at a time, each batch padded
        only to its own longest text (padding everything to the maximum costs several times
        the compute on short traces); the batches run on up to `concurrency` threads.
        Must not be called from one of the embedder's own threads (use `submit` there).
        """
        if self.concurrency == 1 or len(texts) <= self.batch_size:
            return self._embed_serially(texts)
        result, batches = self._plan(texts)
        # Longest first: the slowest runs start early, so the threads finish together.
        runs = [(rows, self._in_pool(self._embed_batch, *batch)) for rows, batch in batches[::-1]]
        for rows, run in runs:
            result[rows] = run.result()
        return result

    def submit(self, texts: Sequence[str], timing: RunTiming | None = None) -> Future[FloatArray]:
        """`embed(texts)` on one of the embedder's threads; the future holds the vectors.

        The stream worker embeds each record as soon as it arrives this way, so the records
        of a burst run side by side instead of one after another. ``timing`` is stamped when
        a thread takes the run, when its texts are tokenized and when it ends.
        """
        return self._in_pool(self._embed_serially, list(texts), timing)

    def _in_pool(self, work: Callable[..., FloatArray], *args: Any) -> Future[FloatArray]:
        """``work(*args)`` on the pool, counted as outstanding until it ends: a thread with
        work waiting for it is not idle, and long runs do not split over it."""
        use = self.thread_use
        with use.lock:
            use.tasks_outstanding += 1

        def counted() -> FloatArray:
            try:
                return work(*args)
            finally:
                with use.lock:
                    use.tasks_outstanding -= 1

        return self._executor().submit(counted)

    def _embed_serially(self, texts: Sequence[str], timing: RunTiming | None = None) -> FloatArray:
        if timing is not None:
            timing.started = time.monotonic()
        result, batches = self._plan(texts)
        if timing is not None:
            timing.tokenized = time.monotonic()
        for rows, batch in batches:
            result[rows] = self._embed_batch(*batch)
        if timing is not None:
            timing.finished = time.monotonic()
        return result

    def _plan(
        self, texts: Sequence[str]
    ) -> tuple[FloatArray, list[tuple[IntArray, tuple[list[Encoding], IntArray]]]]:
        """The zeroed result and its batches: rows of the result and what each run embeds."""
        result = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return result, []
        encodings = self.encoder.encode(texts)
        lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
        # Stable sort so equal-length texts always form the same batches (determinism).
        order = np.argsort(lengths, kind="stable")
        batches = []
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batches.append((rows, ([encodings[i] for i in rows], lengths[rows])))
        return result, batches

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="kp-embed")
            return self._pool

    def _slice_executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self.slice_pool is None:
                self.slice_pool = ThreadPoolExecutor(
                    self.concurrency - 1, thread_name_prefix="kp-embed-slice"
                )
            return self.slice_pool

    def close(self) -> None:
        """Let the embedding threads finish their current run and exit."""
        with self._pool_lock:
            pools = (self._pool, self.slice_pool)
            self._pool = self.slice_pool = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _embed_batch(self, encodings: list[Encoding], lengths: IntArray) -> FloatArray:
        """One padded batch through the model, mean-pooled and normalised."""
        return self.encoder.embed_batch(encodings, lengths, self.run_model)

    def run_model(self, feeds: Feeds) -> FloatArray:
        """The model's hidden states for one padded batch. A long one is split, layer by
        layer, over the threads no other run holds at that moment."""
        width = feeds["input_ids"].shape[1]
        use = self.thread_use
        with use.lock:
            use.runs_in_progress += 1
        split = False

        def slices_now() -> int:
            nonlocal split
            slices = min(use.slices_now(), most_slices(width))
            split = split or slices > 1
            return slices

        try:
            if self._split_min_tokens and width >= self._split_min_tokens:
                assert isinstance(self.model, StagedEncoder)
                return self.model.run_split(feeds, self._slice_executor(), slices_now)
            (hidden,) = self.model.run([self._output_name], feeds)
            return hidden
        finally:
            with use.lock:
                use.runs_in_progress -= 1
                self.runs_split += split


class ThreadUse:
    """How busy the pool's threads are: what decides whether a long run splits, and how far.

    A thread is busy while it runs the model or while work waits for it: on a backlog every
    thread has its own text and runs stay whole.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.lock = threading.Lock()
        self.runs_in_progress = 0  # model runs under way, whoever called them
        self.tasks_outstanding = 0  # work handed to the pool and not finished

    def slices_now(self) -> int:
        """Slices a long run may cut its next layer into: itself plus its share of the idle
        threads (the runs under way share them, so no more slices run than threads)."""
        runs = max(self.runs_in_progress, 1)
        busy = max(runs, min(self.tasks_outstanding, self.threads))
        return 1 + (self.threads - busy) // runs
