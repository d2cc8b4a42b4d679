"""The demo's share within the 100 ms budget beside what the model alone allows on its texts.

    python bench/demo_floor.py [--runs 2] [--repeats 3]

`kp-scorer demo` publishes the sample traces (examples/traces.jsonl) and some malformed
records one at a time, far apart, so no trace waits for another: a trace's latency is its
model run plus the worker's own few milliseconds (decoding, tokenizing, novelty, publishing).
A text whose model run alone takes longer than the budget is over it in any worker, and the
share within the budget that the demo prints is bounded by those texts.

Per run, in one process: each sample text's model time alone (the embedder as the demo runs it,
one text at a time over every core, --repeats times), then `kp-scorer demo` itself, then the
texts again. Per text, the median of those runs (the least would flatter the model: a demo runs
each text once, on a machine whose speed moves by 10 % between runs). It prints how many texts
that median puts over the budget (over it in any worker), how many it puts over once the demo's
own mean stage times besides the model run are added (its decoding, tokenizing, waits, novelty,
scoring and publishing, from the demo's printed stage means), the shares within the budget
those allow, and the demo's share beside them."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _machine

from worker.cli.demo import REPO_EXAMPLES, light_stream_model
from worker.core.trace import parse_trace
from worker.embedding import EmbedderConfig, load_embedder
from worker.settings import Settings

BUDGET_MS = 100.0
_WITHIN = re.compile(r"per-trace latency .*?; ([\d.]+)% within")
_TOTAL = re.compile(r"total / published\D+(\d+) / (\d+)")
_STAGES = re.compile(r"mean time per trace in each stage: (.*)")
NOT_THE_WORKERS = ("fetch", "embed")  # before receipt; the model run itself


def model_ms(texts: list[str], repeats: int) -> list[list[float]]:
    """Each text's model runs alone, in ms."""
    embedder, why = load_embedder(EmbedderConfig.from_settings(Settings()))
    if embedder is None:
        raise SystemExit(f"the model did not load: {why}")
    embedder.embed(["warm up"])
    runs: list[list[float]] = [[] for _ in texts]
    for _ in range(repeats):
        for text, times in zip(texts, runs, strict=True):
            began = time.perf_counter()
            embedder.submit([text]).result()
            times.append((time.perf_counter() - began) * 1000)
    embedder.close()
    return runs


def demo() -> tuple[float, int, float]:
    """(the share within the budget the demo printed, in %; records published; the mean ms
    of its stages after receipt besides the model run)."""
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "demo"], capture_output=True, text=True, check=False
    )
    within, total = _WITHIN.search(done.stdout), _TOTAL.search(done.stdout)
    stages = _STAGES.search(done.stdout)
    if done.returncode != 0 or within is None or total is None or stages is None:
        raise SystemExit(f"the demo failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    means = dict(re.findall(r"(\w+) ([\d.]+) ms", stages.group(1)))
    own = sum(float(ms) for stage, ms in means.items() if stage not in NOT_THE_WORKERS)
    return float(within.group(1)), int(total.group(2)), own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(light_stream_model(Settings()))  # the demo's model options, for both
    lines = [line for line in Path(REPO_EXAMPLES).read_bytes().splitlines() if line.strip()]
    texts = [parse_trace(line).embedding_text() for line in lines]
    print(_machine.machine_line())
    print(f"{len(texts)} sample texts, the {BUDGET_MS:.0f} ms budget")
    for run in range(1, args.runs + 1):
        before = model_ms(texts, args.repeats)
        share, records, own = demo()
        after = model_ms(texts, args.repeats)
        medians = [statistics.median(b + a) for b, a in zip(before, after, strict=True)]
        alone = sum(ms > BUDGET_MS for ms in medians)
        with_own = sum(ms + own > BUDGET_MS for ms in medians)
        slowest = ", ".join(f"{ms:.0f}" for ms in sorted(medians)[-6:])
        print(
            f"run {run}: the model alone, median of {2 * args.repeats} runs a text around the "
            f"demo: mean {statistics.mean(medians):.1f} ms, slowest {slowest}\n"
            f"  over the budget: {alone} texts alone, {with_own} with the demo's "
            f"{own:.1f} ms of other stages; within it at best: {(records - alone) / records:.1%}"
            f" of {records} records, {(records - with_own) / records:.1%}; the demo: {share:.1f}%"
        )


if __name__ == "__main__":
    main()
