"""Throughput of the scorer on one machine, next to what bare onnxruntime reaches on it.

    python bench/worker_throughput.py [--quick] [--records N] [--env KEY=VALUE ...]
                                      [--repeat-texts] [--profile]

One corpus of N traces (default 480; examples/traces.jsonl replicated in order with unique
ids and, unless --repeat-texts, unique embedding texts so every trace costs one model run),
measured four ways in one run:

1. bare single-session ceiling: ONE onnxruntime session with intra-op threads = all cores,
   the texts pre-tokenized and run one after another, one text per run (no padding), measured
   twice: with onnxruntime's default options (its threads spin between operators) and with
   the worker's session options (worker.embedding.session.SessionFactory: threads that sleep between
   operators); the ceiling is the faster of the two (the defaults, 7-15 % faster here);
2. concurrent ceiling: one session with 1 intra-op thread, run from `cores` threads at once
   on the same pre-tokenized texts (how the worker runs its model);
3. offline: `kp-scorer score FILE` on the corpus as a JSONL file, the whole process timed
   (traces/s = lines / time); runs on 1 line are timed too (median of 3), and "steady" is
   (N - 1) / (time of N lines - time of 1 line): the rate without process start-up;
4. the stream worker: a `kp-scorer worker` subprocess on the embedded broker (4 input
   partitions). After a small warm-up (group joined, partitions initialised, model warm) the
   corpus is produced at once as a backlog; the rate is read from the output records' broker
   timestamps (CreateTime, set by the worker's producer), first to last output. While the
   backlog runs the bench only counts the outputs (its /metrics) and reads them afterwards, so
   it takes next to no CPU from the worker. Its RSS, its CPU, its threads' time on a core and
   waiting for one (/proc schedstat), the cores the whole machine left idle while it ran
   (/proc/stat) and its /metrics deltas (pipeline depth, reused embeddings, stage times) are
   printed.

Both ceilings are measured in this process before and after 3 and 4 (never while they run;
the machine may be shared, so the ratios use the mean of the two). The ceilings use the
model file the worker loads (KP_MODEL_PATH if --env sets it, else the packaged model) as it
is; a third, the concurrent ceiling on the model streamlined as the worker loads it (exact
graph rewrites, bit-identical vectors), shows how much of what the worker reaches is the
rewrites' (no target).

--env KEY=VALUE (repeatable) goes to the offline and worker processes, e.g.
--env KP_EMBED_CONCURRENCY=1; without it both run the shipped settings.
--profile samples the worker with py-spy during the backlog (pip install py-spy).

RATIO lines: offline and worker against the bare single-session ceiling (target >= 1.2),
and against the concurrent ceiling (no target: how much of the parallel ceiling is reached);
"streamlined concurrent / single-session" is what a worker whose cores ran nothing but its
model runs would reach.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import _ceilings
import _corpus
import _machine
import _metrics
import _worker
import numpy as np

from worker.dev.embedded_broker import EmbeddedBroker

WARMUP_RECORDS = 24
TARGET_RATIO = 1.2
DEFAULT_RECORDS = 480
QUICK_RECORDS = 120
ONE_LINE_RUNS = 3


@dataclass
class Offline:
    lines: int
    seconds: float  # whole process, N lines
    one_line_seconds: float  # whole process, 1 line (median of ONE_LINE_RUNS)
    summary: str  # what kp-scorer printed last on stderr

    @property
    def rate(self) -> float:
        return self.lines / self.seconds

    @property
    def steady_rate(self) -> float:
        extra = self.seconds - self.one_line_seconds
        return (self.lines - 1) / extra if extra > 0 else float("nan")


def measure_ceilings(ceiling: _ceilings.Ceiling, reverse: bool) -> dict[str, tuple[float, float]]:
    """The ceilings over all texts once (texts per wall s, per CPU s); order alternates."""
    runs = [
        ("single", ceiling.single_rate),
        ("sleeping", ceiling.single_sleeping_rate),
        ("concurrent", ceiling.concurrent_rate),
        ("streamlined", ceiling.streamlined_rate),
    ]
    if reverse:
        runs.reverse()
    return {name: run() for name, run in runs}


def run_offline(records: list[_corpus.Record], env: dict[str, str]) -> Offline:
    folder = Path(tempfile.mkdtemp(prefix="kp-bench-offline-"))
    try:
        full = _corpus.write_jsonl(records, folder / "traces.jsonl")
        one = _corpus.write_jsonl(records[:1], folder / "one.jsonl")
        process_env = {**os.environ, "KP_LOG_LEVEL": "WARNING", **env}

        def timed(path: Path, lines: int) -> tuple[float, str]:
            out = folder / "out.jsonl"
            started = time.perf_counter()
            with out.open("wb") as stdout:
                done = subprocess.run(
                    [sys.executable, "-m", "worker.cli", "score", str(path)],
                    env=process_env,
                    stdout=stdout,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    cwd=_corpus.REPO,
                    check=False,
                )
            seconds = time.perf_counter() - started
            stderr = done.stderr.decode(errors="replace").strip()
            written = out.read_bytes().count(b"\n")
            if done.returncode != 0 or written != lines:
                raise RuntimeError(
                    f"kp-scorer score exited {done.returncode} with {written}/{lines} lines:\n"
                    f"{stderr[-2000:]}"
                )
            return seconds, (stderr.splitlines() or [""])[-1]

        # Start-up alone varied 0.9-1.7 s between runs on the shared machine, which moved
        # "steady" by several percent: the median of three 1-line runs.
        one_seconds = float(np.median([timed(one, 1)[0] for _ in range(ONE_LINE_RUNS)]))
        seconds, summary = timed(full, len(records))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Offline(len(records), seconds, one_seconds, summary)


async def run_worker(
    args: argparse.Namespace, records: list[_corpus.Record], env: dict[str, str]
) -> tuple[dict[str, float], list[str]]:
    broker = EmbeddedBroker()
    broker.start()
    topics = _worker.Topics(f"bench-tp-{uuid.uuid4().hex[:8]}")
    worker = _worker.Worker(
        broker.bootstrap_servers, **{**topics.worker_env(), **broker.worker_settings, **env}
    )
    collector = _worker.OutputCollector(broker.bootstrap_servers, topics)
    # While the backlog runs, the outputs are only counted (the worker's /metrics, once a second),
    # and read once all are there: the rate comes from their broker timestamps, and reading
    # them as they came (a consumer polling 12 partitions every 10 ms) took the broker and this
    # process ~0.3 of the 2 cores the worker runs on, which the ceilings never pay.
    count = _worker.OutputCount(worker)
    lines: list[str] = []
    try:
        await _worker.create_topics(broker.bootstrap_servers, topics)
        worker.start()
        await worker.wait_serving()
        await asyncio.to_thread(worker.wait_ready)  # model loaded and partitions assigned
        rss_ready = _machine.proc_status_kib(worker.pid or 0, "VmRSS") / 1024
        await collector.start()
        warm = await _worker.produce_burst(
            broker.bootstrap_servers,
            topics.input,
            _corpus.corpus(WARMUP_RECORDS, "warm", not args.repeat_texts),
        )
        await collector.wait_for([(s.partition, s.offset) for s in warm], timeout=180)
        await collector.stop()
        outputs_before = await count.total()
        rss_warm = _machine.proc_status_kib(worker.pid or 0, "VmRSS") / 1024
        await asyncio.sleep(0.5)
        before = _metrics.scrape(await asyncio.to_thread(worker.metrics_text))
        threads_before = _machine.thread_schedstats(worker.pid)
        cpu_before = {
            "worker": _machine.cpu_seconds(worker.pid),
            "broker": _machine.cpu_seconds(broker.pid),
            "bench": _machine.cpu_seconds(os.getpid()),
        }
        load_at_start = _machine.load_average()
        profiler = start_profiler(worker.pid, len(records) / 10) if args.profile else None
        machine_busy = [_machine.machine_cpu_seconds()]  # at the start, then at polls still short
        started = time.time()
        sent = await _worker.produce_burst(broker.bootstrap_servers, topics.input, records)
        produced = time.time()
        await count.wait_for(
            outputs_before + len(sent),
            timeout=60 + len(records) / 2,
            still_short=lambda: machine_busy.append(_machine.machine_cpu_seconds()),
        )
        finished = time.time()
        threads_after = _machine.thread_schedstats(worker.pid)
        cpu_after = {
            "worker": _machine.cpu_seconds(worker.pid),
            "broker": _machine.cpu_seconds(broker.pid),
            "bench": _machine.cpu_seconds(os.getpid()),
        }
        await asyncio.sleep(0.5)  # the worker observes its metrics right after the acks
        after = _metrics.scrape(await asyncio.to_thread(worker.metrics_text))
        rss = _machine.proc_status_kib(worker.pid or 0, "VmRSS") / 1024
        hwm = _machine.proc_status_kib(worker.pid or 0, "VmHWM") / 1024
        profile = stop_profiler(profiler) if profiler else []
        collector = _worker.OutputCollector(broker.bootstrap_servers, topics)
        await collector.start()
        outputs = await collector.wait_for([(s.partition, s.offset) for s in sent], timeout=60)
    finally:
        await collector.stop()
        worker.cleanup()
        broker.stop()

    rate, rate_from_burst, span = _worker.output_rate(outputs, produced)
    decisions = Counter(o.decision for o in outputs)
    diff = _metrics.delta(after, before)
    wall = finished - started
    worker_cpu = cpu_after["worker"] - cpu_before["worker"]
    lines.append(
        f"worker: {len(outputs)} outputs ({dict(decisions)}), duplicates "
        f"{collector.duplicates}; backlog produced in {produced - started:.2f} s; load average "
        f"at start {load_at_start}"
    )
    lines.append(
        f"  rate first->last output {rate:.1f} traces/s over {span:.2f} s; "
        f"backlog acked->last output {rate_from_burst:.1f} traces/s"
    )
    lines.append(
        "  CPU during the backlog (cores busy): "
        + ", ".join(f"{k} {(cpu_after[k] - cpu_before[k]) / wall:.2f}" for k in cpu_after)
        + f"  (wall {wall:.2f} s, {os.cpu_count()} cores)"
    )
    lines += _machine.thread_lines(threads_before, threads_after, wall)
    lines.append(f"  {idle_line(machine_busy[0], machine_busy[-1])}")
    lines.append(
        f"  worker RSS {rss:.0f} MiB (peak {hwm:.0f} MiB; {rss_ready:.0f} MiB when ready, "
        f"{rss_warm:.0f} MiB after the {WARMUP_RECORDS}-trace warm-up); "
        f"{len(outputs) / worker_cpu:.1f} traces per worker CPU-second"
    )
    lines.append("  pipeline over the backlog (worker /metrics deltas):")
    lines += ["  " + line for line in _metrics.pipeline_lines(diff, span)]
    if profile:
        lines.append("py-spy profile of the worker during the backlog (share of samples):")
        lines += profile
    per_cpu = len(outputs) / max(worker_cpu, 1e-9)
    return {"rate": rate, "per_cpu": per_cpu}, lines


def start_profiler(pid: int | None, seconds: float) -> tuple[subprocess.Popen[bytes], Path] | None:
    spy = shutil.which("py-spy")
    if spy is None or pid is None:
        print("(py-spy not installed: pip install py-spy; skipping the profile)")
        return None
    out = Path(tempfile.mkdtemp(prefix="kp-bench-spy-")) / "worker.txt"
    process = subprocess.Popen(
        [
            spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(out),
            "--rate", "200", "--threads", "--idle", "--nonblocking",
            "--duration", str(max(5, round(seconds))),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    return process, out


def stop_profiler(profiler: tuple[subprocess.Popen[bytes], Path]) -> list[str]:
    """Summarise py-spy's collapsed stacks: per thread, the top leaf functions."""
    process, out = profiler
    process.send_signal(2)  # SIGINT: py-spy writes what it has and exits
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    if not out.exists():
        return ["  (py-spy wrote nothing: ptrace may be refused here)"]
    return summarise_stacks(out.read_text())


def summarise_stacks(raw: str, top: int = 8) -> list[str]:
    threads: Counter[str] = Counter()
    leaves: Counter[tuple[str, str]] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0].split(" ")[0] if frames else "?"
        thread = "main" if "MainThread" in frames[0] else thread
        leaf = frames[-1]
        leaf = leaf.split(" (")[0] + " (" + leaf.split("/")[-1] if "/" in leaf else leaf
        threads[thread] += count
        leaves[(thread, leaf)] += count
        total += count
    lines = [f"  {total} samples; by thread: " + ", ".join(
        f"{t} {n / total:.0%}" for t, n in threads.most_common(6))]  # fmt: skip
    for (thread, leaf), count in leaves.most_common(top):
        lines.append(f"  {count / total:6.1%}  [{thread}] {leaf[:110]}")
    return lines


def idle_line(first: tuple[float, float], last: tuple[float, float]) -> str:
    """The machine's cores left idle between two /proc/stat readings taken while the worker
    was still scoring: what no thread of any process could use (a thread waiting for a lock,
    the GIL or work leaves its core to whatever else is runnable)."""
    idle, elapsed = last[0] - first[0], last[1] - first[1]
    if elapsed <= 0:
        return "machine idle while the backlog ran: not measured (the backlog ended first)"
    cores = os.cpu_count() or 1
    return (
        f"machine idle while the backlog ran: {cores * idle / elapsed:.3f} of {cores} cores "
        f"(/proc/stat over the first {elapsed / cores:.1f} s)"
    )


def ratio_line(label: str, rate: float, name: str, reference: float, target: bool) -> str:
    ratio = rate / reference if reference else float("nan")
    verdict = (
        f"  (target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'NOT met'})"
        if target
        else ""
    )
    return f"RATIO {label} / {name} = {rate:.1f} / {reference:.1f} = {ratio:.3f}{verdict}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[4:]),
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_RECORDS} traces (default {DEFAULT_RECORDS})"
    )
    parser.add_argument("--records", type=int, default=None, help="traces in the corpus")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="setting for the offline and worker processes (repeatable)",
    )
    parser.add_argument(
        "--repeat-texts",
        action="store_true",
        help="keep the 50 example texts repeating (the worker then reuses their vectors)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the worker")
    args = parser.parse_args()
    try:
        env = _worker.parse_env(args.env)
    except ValueError as exc:
        parser.error(str(exc))
    count = args.records or (QUICK_RECORDS if args.quick else DEFAULT_RECORDS)
    cores = os.cpu_count() or 1

    print(_machine.machine_line())
    print(
        f"worker throughput: {count} traces ({'repeating' if args.repeat_texts else 'unique'} "
        f"texts), {_worker.PARTITIONS} partitions, settings: {_worker.env_text(env)}; "
        f"load average {_machine.load_average()}"
    )
    records = _corpus.corpus(count, uuid.uuid4().hex[:6], not args.repeat_texts)
    ceiling = _ceilings.Ceiling(
        [r.text for r in records],
        _ceilings.model_path(env),
        int(env.get("KP_EMBED_MAX_TOKENS", 256)),
    )
    print(
        f"corpus: mean {ceiling.mean_tokens:.0f} tokens/text; ceilings on {ceiling.model.name} "
        f"({ceiling.model.parent.name}), {cores} cores"
    )
    ceilings = [measure_ceilings(ceiling, reverse=False)]
    offline = run_offline(records, env)
    worker, worker_lines = asyncio.run(run_worker(args, records, env))
    ceilings.append(measure_ceilings(ceiling, reverse=True))

    def mean(name: str, what: int = 0) -> float:
        return float(np.mean([m[name][what] for m in ceilings]))

    labels = {
        "single": f"bare single-session ceiling ({cores} intra-op threads, batch 1)",
        "sleeping": "  the same, the worker's options (threads sleep, no spinning)",
        "concurrent": f"concurrent ceiling ({cores} threads x 1 intra-op thread, batch 1)",
        "streamlined": "  the same, model streamlined as the worker loads it",
    }
    print("embedding only (texts/s): before, after, mean; per CPU-second mean")
    for name, label in labels.items():
        walls = " ".join(f"{m[name][0]:7.1f}" for m in ceilings)
        print(f"  {label:<62} {walls} {mean(name):7.1f} {mean(name, 1):8.1f}")
    print(
        f"offline `kp-scorer score` on {offline.lines} lines: {offline.seconds:.2f} s whole "
        f"process = {offline.rate:.1f} traces/s; 1 line {offline.one_line_seconds:.2f} s; "
        f"steady (without start-up) {offline.steady_rate:.1f} traces/s"
    )
    print(f"  {offline.summary}")
    for line in worker_lines:
        print(line)
    single = max(mean("single"), mean("sleeping"))
    concurrent, streamlined = mean("concurrent"), mean("streamlined")
    print(ratio_line("offline steady", offline.steady_rate, "single-session", single, True))
    print(ratio_line("offline whole process", offline.rate, "single-session", single, True))
    print(ratio_line("worker", worker["rate"], "single-session", single, True))
    print(ratio_line("offline steady", offline.steady_rate, "concurrent", concurrent, False))
    print(ratio_line("worker", worker["rate"], "concurrent", concurrent, False))
    print(ratio_line("worker", worker["rate"], "streamlined concurrent", streamlined, False))
    print(ratio_line("concurrent", concurrent, "single-session", single, False))
    # What a worker would reach if nothing but its model runs used the cores.
    print(ratio_line("streamlined concurrent", streamlined, "single-session", single, False))
    print(
        ratio_line(
            "worker", worker["rate"], "single-session, worker's options", mean("sleeping"), False
        )
    )
    print(
        f"  per CPU-second: worker {worker['per_cpu']:.1f} traces / single-session (the "
        f"worker's options: no CPU spent spinning) {mean('sleeping', 1):.1f} texts = "
        f"{worker['per_cpu'] / mean('sleeping', 1):.3f}; "
        f"/ concurrent {mean('concurrent', 1):.1f} = "
        f"{worker['per_cpu'] / mean('concurrent', 1):.3f}"
    )
    print(f"load average at end {_machine.load_average()}")


if __name__ == "__main__":
    main()
