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


class OnnxEmbedder:
    """One model and one tokenizer, run by up to `concurrency` threads at once.

    On CPU, separate single-threaded runs use the cores better than one run split over
    intra-op threads, so texts are spread over a small pool of threads that all call the same
    model (`InferenceSession.run` and `Tokenizer.encode_batch` are thread-safe; the model is
    one session, with one copy of the weights). A text's vector does not depend on which
    thread ran it.

    A long run that starts while no other run is under way or waiting goes to ``lone_model``,
    the same model in a session with one intra-op thread per core (onnxruntime's own
    parallelism), so a trace that arrives alone uses every core: a lone 256-token text in
    ~0.58 of its single-threaded time (bench/RESULTS.md). A backlog runs one text per core,
    each on the single-threaded session.
    """

    model_id: str
    dimensions: int

    def __init__(
        self,
        *,
        model: ort.InferenceSession,
        encoder: Encoder,
        model_id: str,
        batch_size: int,
        concurrency: int = 1,
        lone_model: ort.InferenceSession | None = None,
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
        self._pool_lock = threading.Lock()
        self._busy_lock = threading.Lock()
        self._runs_in_progress = 0
        self._tasks_outstanding = 0  # work handed to the pool and not finished
        self.runs_split = 0  # model runs that went to the lone-run session
        self.model = model
        self.encoder = encoder
        self.lone_model = lone_model if split_min_tokens else None
        self._split_min_tokens = split_min_tokens if self.lone_model is not None else 0
        # Why runs never use every core (None: they do, when nothing else runs).
        self.split_note = (
            split_note
            if self.lone_model is not None
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
        work waiting for it is not idle, and a long run does not take every core then."""
        with self._busy_lock:
            self._tasks_outstanding += 1

        def counted() -> FloatArray:
            try:
                return work(*args)
            finally:
                with self._busy_lock:
                    self._tasks_outstanding -= 1

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

    def close(self) -> None:
        """Let the embedding threads finish their current run and exit."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _embed_batch(self, encodings: list[Encoding], lengths: IntArray) -> FloatArray:
        """One padded batch through the model, mean-pooled and normalised."""
        return self.encoder.embed_batch(encodings, lengths, self.run_model)

    def run_model(self, feeds: Feeds) -> FloatArray:
        """The model's hidden states for one padded batch: on every core when it is long and
        nothing else runs or waits, else on one."""
        long_run = self._split_min_tokens and feeds["input_ids"].shape[1] >= self._split_min_tokens
        with self._busy_lock:
            alone = self._runs_in_progress == 0 and self._tasks_outstanding <= 1
            self._runs_in_progress += 1
            if long_run and alone:
                self.runs_split += 1
        session = self.lone_model if long_run and alone and self.lone_model else self.model
        try:
            (hidden,) = session.run([self._output_name], feeds)
            return hidden
        finally:
            with self._busy_lock:
                self._runs_in_progress -= 1
