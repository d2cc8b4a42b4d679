"""The pool of model runs: texts spread over a few threads that share one model."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding

from worker.embedding.encoder import Encoder, IntArray, mean_pool_normalise
from worker.embedding.protocol import DIMENSIONS, FloatArray, RunTiming


class OnnxEmbedder:
    """One model and one tokenizer, run by up to `concurrency` threads at once.

    On CPU, separate single-threaded runs use the cores better than one run split over
    intra-op threads, so texts are spread over a small pool of threads that all call the same
    model (`InferenceSession.run` and `Tokenizer.encode_batch` are thread-safe; the model is
    one session, with one copy of the weights). A text's vector does not depend on which
    thread ran it.

    Nothing treats a lone long text apart: measured against running it over every core (as
    per-layer slices, or as a second session with one intra-op thread per core), plain runs
    had the shortest tails at 25 % and 50 % load, the same backlog rate and the least memory
    (bench/RESULTS.md, "a lone long text").
    """

    model_id: str
    identity: str
    dimensions: int

    def __init__(
        self,
        *,
        model: ort.InferenceSession,
        encoder: Encoder,
        model_id: str,
        identity: str,
        batch_size: int,
        concurrency: int = 1,
    ) -> None:
        """Use :func:`worker.embedding.load.open_embedder`; this only wires already-validated
        parts together."""
        self.model_id = model_id
        self.identity = identity
        self.dimensions = DIMENSIONS
        self.batch_size = batch_size
        self.concurrency = concurrency
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.model = model
        self.encoder = encoder
        # The hidden states: ``last_hidden_state``, else the model's first output.
        outputs = [o.name for o in model.get_outputs()]
        self._output_name = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]

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
        pool = self._executor()
        runs = [(rows, pool.submit(self._embed_batch, *batch)) for rows, batch in batches[::-1]]
        for rows, run in runs:
            result[rows] = run.result()
        return result

    def submit(self, texts: Sequence[str], timing: RunTiming | None = None) -> Future[FloatArray]:
        """`embed(texts)` on one of the embedder's threads; the future holds the vectors.

        The stream worker embeds each record as soon as it arrives this way, so the records
        of a burst run side by side instead of one after another. ``timing`` is stamped when
        a thread takes the run, when its texts are tokenized and when it ends.
        """
        return self._executor().submit(self._embed_serially, list(texts), timing)

    def _embed_serially(self, texts: Sequence[str], timing: RunTiming | None = None) -> FloatArray:
        timing = timing or RunTiming()  # stamped whether or not the caller reads it
        timing.started = time.monotonic()
        result, batches = self._plan(texts)
        timing.tokenized = time.monotonic()
        for rows, batch in batches:
            result[rows] = self._embed_batch(*batch)
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
        feeds = self.encoder.feeds(encodings, lengths)
        (hidden,) = self.model.run([self._output_name], feeds)
        return mean_pool_normalise(hidden, feeds["attention_mask"], lengths)
