"""How long `kp-scorer report` takes on 3,000 recorded outputs, as an operator runs it (the
whole process, start-up included): CPU and wall seconds, best of --runs.

    python bench/report_time.py [--records 3000] [--runs 3]

The corpus is the examples scored with the packaged model (real novelty), replicated, 2 % of
it dead letters (tests/support/scored_corpus.py). Target: 2 s of CPU for 3,000 records.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support.scored_corpus import model_scorer, replicate, scored_examples  # noqa: E402

TARGET_CPU_SECONDS = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "scored.jsonl"
        outputs, errors = scored_examples(model_scorer())
        corpus.write_bytes(replicate(outputs, errors, args.records))
        page = Path(folder) / "report.html"
        command = [sys.executable, "-m", "worker.cli", "report", str(corpus), "-o", str(page)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KP_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        timings = []
        for _ in range(args.runs):  # the first run may pay for cold file caches
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run([*command, "--quiet"], check=True, env=env, capture_output=True)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            timings.append((cpu, wall))
    cpu, wall = min(timings)
    verdict = "within" if cpu <= TARGET_CPU_SECONDS else "OVER"
    print(
        f"kp-scorer report, {args.records} records: best of {args.runs}: {cpu:.2f} s CPU, "
        f"{wall:.2f} s wall ({verdict} the {TARGET_CPU_SECONDS:g} s CPU target); "
        f"all runs (cpu, wall): {[(round(c, 2), round(w, 2)) for c, w in timings]}"
    )


if __name__ == "__main__":
    main()
