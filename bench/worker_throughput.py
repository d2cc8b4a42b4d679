"""End-to-end Kafka -> Kafka throughput of ONE worker process, next to the onnxruntime ceiling.

    python bench/worker_throughput.py [--quick] [--records N] [--threads T] [--batch-max B]
                                      [--within S] [--chunk C] [--embed-batch E[,E2...]]
                                      [--fetch-max-wait-ms M] [--profile]

On the embedded broker: a 4-partition input topic, one `kp-scorer worker` subprocess
(KP_EMBED_THREADS = --threads, default the machine's cores). After a small warm-up (group
joined, partitions initialised, model arena sized) a backlog of N records is produced at once
(examples/traces.jsonl replicated in order, unique ids, 32 keys), and the worker's rate is
read from its output records' broker timestamps (CreateTime, set by the worker's producer):
first to last output. With --embed-batch 1,8 one worker per value runs in turn.

The ceiling is bare `InferenceSession.run()` on the SAME embedding texts
(parse_trace(line).embedding_text()), pre-tokenized and pre-padded, with the embedder's own
session options and the same intra-op threads (bench/embed_ceiling.py's approach), measured
in this process before, between and after the worker runs (never while one runs). The texts
repeat with period 50 and takes hold 8, so the first 200 texts form exactly the chunks of the
whole corpus (N a multiple of 200); the ceiling runs over those:

- "ceiling, takes of 8": the texts in production order, chunks of 8, each chunk sorted by
  length and run as one batch (KP_EMBED_BATCH_SIZE=8 on one take of the worker);
- "ceiling, takes of 8, batch 1": the same texts, one per run (no padding at all; what the
  shipped KP_EMBED_BATCH_SIZE=1 runs);
- "ceiling, all sorted": all texts sorted by length, batches of 8 -- what length bucketing
  across a larger backlog could reach;
- "embed(), takes of 8": OnnxEmbedder.embed() on the same chunks (adds tokenization,
  pooling), with the shipped batch size 1.

The ratio's denominator is the BEST of the three raw ceilings (the strictest yardstick).

The stage breakdown is the delta of the worker's kp_stage_latency_seconds over the burst.
--profile samples the worker with py-spy during the burst (pip install py-spy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import _common as c
import numpy as np

from worker.embedded_broker import EmbeddedBroker

WARMUP_RECORDS = 24
CEILING_PERIOD = 200  # lcm(50 distinct texts, takes of 8)
TARGET_RATIO = 0.8
RAW_CEILINGS = ("takes of 8", "takes of 8, batch 1", "all sorted")


def measure_ceiling(
    ceiling: c.Ceiling, texts: list[str], reverse: bool
) -> dict[str, tuple[float, float]]:
    """The three embedding-only rates (texts per wall s, per CPU s), each over all texts once;
    the order alternates between calls."""
    takes = ceiling.feeds(texts, chunk=8)
    singles = ceiling.feeds(texts, chunk=8, batch=1)
    bucketed = ceiling.feeds(texts, chunk=len(texts))
    runs = [
        ("takes of 8", lambda: ceiling.rate(takes, len(texts))),
        ("takes of 8, batch 1", lambda: ceiling.rate(singles, len(texts))),
        ("all sorted", lambda: ceiling.rate(bucketed, len(texts))),
        ("embed()", lambda: ceiling.embed_rate(texts, chunk=8)),
    ]
    if reverse:
        runs.reverse()
    return {name: run() for name, run in runs}


async def run_worker(
    args: argparse.Namespace, records: list[c.Record], embed_batch: int
) -> tuple[dict[str, float], list[str]]:
    broker = EmbeddedBroker()
    broker.start()
    topics = c.Topics(f"bench-tp-{uuid.uuid4().hex[:8]}")
    env = {
        **topics.worker_env(),
        "KP_EMBED_THREADS": str(args.threads),
        "KP_BATCH_MAX_RECORDS": str(args.batch_max),
        "KP_BATCH_WITHIN_SECONDS": str(args.within),
        "KP_EMBED_BATCH_SIZE": str(embed_batch),
        "KP_SCORE_CHUNK_RECORDS": str(args.chunk),
    }
    worker = c.Worker(broker.bootstrap_servers, args.fetch_max_wait_ms, **env)
    collector = c.OutputCollector(broker.bootstrap_servers, topics)
    lines: list[str] = []
    try:
        await c.create_topics(broker.bootstrap_servers, topics)
        worker.start()
        await worker.wait_serving()
        await collector.start()
        warm = await c.produce_burst(
            broker.bootstrap_servers, topics.input, c.corpus(WARMUP_RECORDS, "warm")
        )
        await collector.wait_for([(s.partition, s.offset) for s in warm], timeout=180)
        await asyncio.sleep(0.5)
        before = c.scrape(await asyncio.to_thread(worker.metrics_text))
        cpu_before = {
            "worker": c.cpu_seconds(worker.pid),
            "broker": c.cpu_seconds(broker.pid),
            "bench": c.cpu_seconds(os.getpid()),
        }
        load_at_start = c.load_average()
        profiler = start_profiler(worker.pid, len(records) / 10) if args.profile else None
        started = time.time()
        sent = await c.produce_burst(broker.bootstrap_servers, topics.input, records)
        produced = time.time()
        outputs = await collector.wait_for(
            [(s.partition, s.offset) for s in sent], timeout=60 + len(records) / 2
        )
        finished = time.time()
        cpu_after = {
            "worker": c.cpu_seconds(worker.pid),
            "broker": c.cpu_seconds(broker.pid),
            "bench": c.cpu_seconds(os.getpid()),
        }
        await asyncio.sleep(0.5)  # the worker observes its metrics right after the acks
        after = c.scrape(await asyncio.to_thread(worker.metrics_text))
        rss = c.proc_status_kib(worker.pid or 0, "VmRSS") / 1024
        hwm = c.proc_status_kib(worker.pid or 0, "VmHWM") / 1024
        profile = stop_profiler(profiler) if profiler else []
    finally:
        await collector.stop()
        worker.cleanup()
        broker.stop()

    rate, rate_from_burst, span = c.output_rate(outputs, produced)
    decisions = Counter(o.decision for o in outputs)
    diff = c.delta(after, before)
    wall = finished - started
    lines.append(
        f"worker with KP_EMBED_BATCH_SIZE={embed_batch}: {len(outputs)} outputs "
        f"({dict(decisions)}), duplicates {collector.duplicates}; burst produced in "
        f"{produced - started:.2f} s; load average at start {load_at_start}"
    )
    lines.append(
        f"  rate first->last output {rate:.1f} traces/s over {span:.2f} s; "
        f"burst acked->last output {rate_from_burst:.1f} traces/s"
    )
    lines.append(
        "  CPU during the burst (cores busy): "
        + ", ".join(f"{k} {(cpu_after[k] - cpu_before[k]) / wall:.2f}" for k in cpu_after)
        + f"  (wall {wall:.2f} s, {os.cpu_count()} cores)"
    )
    latency = c.histogram(diff, "kp_trace_latency_seconds")
    lines.append(
        f"  worker RSS {rss:.0f} MiB (peak {hwm:.0f} MiB); kp_trace_latency p50 "
        f"{c.fmt_ms(latency.quantile(0.5))} ms (backlog: queueing dominates)"
    )
    lines.append("stage breakdown over the burst (worker /metrics deltas):")
    lines += c.stage_table(diff, span, args.chunk)
    if profile:
        lines.append("py-spy profile of the worker during the burst (share of samples):")
        lines += profile
    per_cpu = len(outputs) / max(cpu_after["worker"] - cpu_before["worker"], 1e-9)
    result = {"rate": rate, "rate_from_burst": rate_from_burst, "span": span, "per_cpu": per_cpu}
    return result, lines


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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="400 records (default 600)")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-max", type=int, default=8, help="KP_BATCH_MAX_RECORDS")
    parser.add_argument("--within", type=float, default=0.02, help="KP_BATCH_WITHIN_SECONDS")
    parser.add_argument("--chunk", type=int, default=1, help="KP_SCORE_CHUNK_RECORDS")
    parser.add_argument(
        "--embed-batch",
        default="1",
        help="KP_EMBED_BATCH_SIZE; comma-separated values run one worker each, in this order, "
        "with the ceiling measured before, between and after them (default 1, as shipped)",
    )
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=None,
        help="bench-only override of faust's 1500 ms consumer fetch wait (default: as shipped)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the worker")
    args = parser.parse_args()
    count = args.records or (400 if args.quick else 600)
    embed_batches = [int(x) for x in args.embed_batch.split(",")]

    print(c.machine_line())
    print(
        f"worker throughput: {count} records, {c.PARTITIONS} partitions, intra-op threads "
        f"{args.threads}, KP_BATCH_MAX_RECORDS={args.batch_max}, "
        f"KP_BATCH_WITHIN_SECONDS={args.within}, KP_EMBED_BATCH_SIZE in {embed_batches}, "
        f"faust fetch wait {args.fetch_max_wait_ms or 'as shipped (1500)'} ms; "
        f"load average {c.load_average()}"
    )
    records = c.corpus(count, uuid.uuid4().hex[:6])
    texts = [r.text for r in records]
    # Texts repeat with period 50 and takes have 8: every CEILING_PERIOD consecutive texts
    # form the same chunks, so the ceiling over that many is the ceiling over all of them.
    sample = texts[:CEILING_PERIOD] if count % CEILING_PERIOD == 0 else texts
    ceiling = c.Ceiling(args.threads)
    mean_tokens, padding = c.padded_share(ceiling.tokenizer, texts, 8)
    _, padding_sorted = c.padded_share(
        ceiling.tokenizer, sorted(texts, key=lambda t: len(ceiling.tokenizer.encode(t))), 8
    )
    print(
        f"corpus: mean {mean_tokens:.0f} tokens/text; padded/real tokens {padding:.2f} in "
        f"takes of 8, {padding_sorted:.2f} all sorted; ceiling over {len(sample)} texts "
        "(same takes as the whole corpus)"
    )
    ceilings = [measure_ceiling(ceiling, sample, reverse=False)]
    results = []
    for index, embed_batch in enumerate(embed_batches):
        results.append(asyncio.run(run_worker(args, records, embed_batch)))
        ceilings.append(measure_ceiling(ceiling, sample, reverse=index % 2 == 0))

    print("embedding only (texts/s), measured " + ", ".join(
        ["before"] + [f"after worker {i + 1}" for i in range(len(results))]) + "; per CPU-s mean"
    )  # fmt: skip
    for name in ceilings[0]:
        label = (
            f"embed(), takes of 8, batch {ceiling.embedder.batch_size}"
            if name == "embed()"
            else f"ceiling, {name}"
        )
        walls = " ".join(f"{m[name][0]:8.1f}" for m in ceilings)
        per_cpu = float(np.mean([m[name][1] for m in ceilings]))
        print(f"  {label:<32} {walls} {per_cpu:10.1f}")
    for index, (embed_batch, (result, lines)) in enumerate(
        zip(embed_batches, results, strict=True)
    ):
        for line in lines:
            print(line)
        around = ceilings[index : index + 2]

        def mean(name: str, what: int = 0, around: list[dict[str, tuple[float, float]]] = around):
            return float(np.mean([m[name][what] for m in around]))

        best = max(RAW_CEILINGS, key=mean)
        ratio = result["rate"] / mean(best)
        verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
        print(
            f"RATIO worker(KP_EMBED_BATCH_SIZE={embed_batch}) / best raw ceiling ({best}, wall; "
            f"mean of the runs just before and after) = {result['rate']:.1f} / "
            f"{mean(best):.1f} = {ratio:.3f}  (target >= {TARGET_RATIO}: {verdict})"
        )
        print(
            f"  per CPU-second: worker {result['per_cpu']:.1f} traces / ceiling "
            f"{mean(best, 1):.1f} texts = {result['per_cpu'] / mean(best, 1):.3f}"
            " (steadier under load; the worker's CPU includes Kafka, decode, scoring)"
        )
        print(
            "  worker / each raw ceiling: "
            + ", ".join(f"{name} {result['rate'] / mean(name):.3f}" for name in RAW_CEILINGS)
        )
    print(f"load average at end {c.load_average()}")


if __name__ == "__main__":
    main()
