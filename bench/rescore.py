"""`kp-scorer rescore` throughput: a whole process over 30,000 recorded outputs (target 10,000/s).

    python bench/rescore.py [--records 30000] [--unique 300] [--runs 5]

Makes the recorded outputs the way production does: ``--unique`` traces (the examples,
each repeated with a varied objective so novelty varies) scored once with the real model
through the worker's Scorer, exactly as `kp-scorer score` writes them; then replicated to
``--records`` lines with unique trace ids and source offsets. Each run times the whole
process, start-up included, as an operator would run it:

    kp-scorer rescore FILE --threshold 0.6 --json > /dev/null

and reads the JSON summary (stderr) to check that every record was re-scored. The figure
is the median run; start-up alone (a one-record file) is shown for scale.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import orjson

from worker.cli.score import score_lines
from worker.core.records import LineRecords
from worker.core.scorer import build_scorer
from worker.settings import load_settings

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "traces.jsonl"
TARGET_PER_SECOND = 10_000


def recorded_outputs(unique: int) -> list[bytes]:
    """``unique`` traces scored with the model, one output line each (as `score` writes)."""
    examples = [orjson.loads(line) for line in EXAMPLES.read_bytes().splitlines() if line]
    traces = []
    for index in range(unique):
        trace = copy.deepcopy(examples[index % len(examples)])
        trace["id"] = f"kp:trace:{uuid.UUID(int=index)}"
        if index >= len(examples):
            trace["task"]["objective"] += f" (case {index // len(examples)})"
        traces.append(orjson.dumps(trace))
    scorer = build_scorer(load_settings())
    if scorer.embedder is None:
        raise SystemExit(f"the model is needed to record real novelty: {scorer.embedder_reason}")
    out = io.StringIO()
    score_lines(scorer, traces, out, LineRecords("bench", None))
    lines = [line.encode() for line in out.getvalue().splitlines()]
    assert all(b'"novelty_source":"no_embedder"' not in line for line in lines)
    return lines


def replicate(outputs: list[bytes], records: int) -> bytes:
    """``records`` lines cycling through ``outputs``, each with its own trace id and offset."""
    parsed = [orjson.loads(line) for line in outputs]
    lines = []
    for offset in range(records):
        document = parsed[offset % len(parsed)]
        document["trace"]["id"] = f"kp:trace:{uuid.UUID(int=(1 << 64) + offset)}"
        document["source"]["offset"] = offset
        lines.append(orjson.dumps(document))
    return b"\n".join(lines) + b"\n"


def timed_run(path: Path) -> tuple[float, dict[str, object]]:
    """Wall seconds of one whole `kp-scorer rescore` process, and its JSON summary."""
    command = [sys.executable, "-m", "worker.cli", "rescore", str(path), "--threshold", "0.6"]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--json", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("KP_")},
    )
    seconds = time.perf_counter() - started
    return seconds, orjson.loads(done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--unique", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
        f"{platform.python_version()}, orjson {orjson.__version__}"
    )
    started = time.perf_counter()
    outputs = recorded_outputs(args.unique)
    seconds = time.perf_counter() - started
    print(f"recorded {len(outputs)} outputs with the model in {seconds:.1f} s")
    with tempfile.TemporaryDirectory(prefix="kp-rescore-bench-") as folder:
        path = Path(folder) / "scored.jsonl"
        path.write_bytes(replicate(outputs, args.records))
        one = Path(folder) / "one.jsonl"
        one.write_bytes(outputs[0] + b"\n")
        size_mib = path.stat().st_size / 2**20
        print(f"input: {args.records} lines, {size_mib:.1f} MiB")
        startup, _ = timed_run(one)
        print(f"start-up alone (1 record): {startup:.2f} s")
        rates = []
        for run in range(1, args.runs + 1):
            seconds, summary = timed_run(path)
            assert summary["records"] == args.records, summary
            assert summary["rescored"] == args.records, summary["unrescorable"]
            rate = args.records / seconds
            rates.append(rate)
            flips = summary["flips"]
            print(
                f"run {run}: {seconds:.2f} s, {rate:,.0f} records/s "
                f"(rejected -> accepted {flips['rejected_to_accepted']}, "  # type: ignore[index]
                f"accepted -> rejected {flips['accepted_to_rejected']}; "  # type: ignore[index]
                f"load average {os.getloadavg()[0]:.2f})"
            )
    median = statistics.median(rates)
    verdict = "met" if median >= TARGET_PER_SECOND else "NOT met"
    print(
        f"median {median:,.0f} records/s for the whole process on {args.records} records: "
        f">= {TARGET_PER_SECOND:,}/s {verdict}"
    )


if __name__ == "__main__":
    main()
