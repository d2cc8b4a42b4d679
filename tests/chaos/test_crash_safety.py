"""SIGKILL the worker mid-stream and restart it: nothing lost, duplicates bounded and identical.

The input is produced up front (a backlog on a 3-partition topic); one worker at a time
works through it and is killed (SIGKILL: no shutdown, no final commit) at moments chosen by a
seeded RNG, then restarted. At the end every input record, identified by its source
partition and offset (and every valid trace by its unique id), has an output; records
published twice (work done after the last offset commit before a kill) are counted, and each
duplicate must carry exactly the score of its first delivery, because a restarted worker
rebuilds its novelty caches from the log.

The cache capacity is lowered (``KP_CACHE_CAPACITY``) so that each restart's cache rebuild
takes seconds, not minutes, on a 2-core machine; capacity does not change the mechanics.
"""

from __future__ import annotations

import random
import re
import time
import urllib.request
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.kafka_helpers import create_topics, produce
from support.outputs import Output, collect_outputs
from support.traces import make_trace
from support.workers import worker_topics

pytestmark = pytest.mark.broker

PARTITIONS = 3
DOMAINS = ("code", "finance", "medical", "general")
CACHE_CAPACITY = "200"


def short_trace(i: int, tag: str) -> bytes:
    """A valid trace with a unique id and a short text (the embedder is the bottleneck)."""
    return orjson.dumps(
        make_trace(
            id=f"kp:trace:{tag}-{i:06d}",
            domain=DOMAINS[i % len(DOMAINS)],
            success=i % 5 != 0,
            confidence=(i % 101) / 100,
            objective=f"Order {i} status",
            steps=[
                {"step_id": 0, "type": "thought", "content": f"check {i % 89}"},
                {"step_id": 1, "type": "tool_call", "tool": {"name": f"db{i % 3}"}},
                {"step_id": 2, "type": "observation", "content": "ok"},
            ][: 1 + i % 3],
        )
    )


def make_inputs(count: int, tag: str) -> list[tuple[bytes, bytes, int, None]]:
    """(key, value, partition, headers); every 97th record is malformed (dead-letter)."""
    records = []
    for i in range(count):
        value = b'{"broken": ' if i % 97 == 50 else short_trace(i, tag)
        records.append((f"k{i}".encode(), value, i % PARTITIONS, None))
    return records


def topics_env(prefix: str) -> tuple[dict[str, str], dict[str, str]]:
    return worker_topics(prefix, PARTITIONS, KP_CACHE_CAPACITY=CACHE_CAPACITY)


def processed(worker: WorkerProcess) -> int:
    """Records this worker incarnation has published (kp_records_total), 0 if not serving."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=2
        ) as response:
            text = response.read().decode()
    except OSError:
        return 0
    return round(
        sum(float(m) for m in re.findall(r"^kp_records_total\{[^}]*\} (\S+)$", text, re.M))
    )


def wait_processed(worker: WorkerProcess, at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = processed(worker)
        if done >= at_least:
            return done
        assert worker.process is not None and worker.process.poll() is None, worker.tail()
        time.sleep(0.05)
    raise TimeoutError(f"worker published fewer than {at_least} records:\n{worker.tail()}")


def account(
    outputs: list[Output], records: list[tuple[bytes, bytes, int, None]], offsets: list[int]
) -> dict[str, Any]:
    """Loss, duplicates and duplicate-score consistency of a run."""
    by_source: dict[tuple[int, int], list[Output]] = {}
    for output in outputs:
        by_source.setdefault((output.source_partition, output.source_offset), []).append(output)
    expected = {(r[2], o) for r, o in zip(records, offsets, strict=True)}
    lost = sorted(expected - set(by_source))
    unknown = sorted(set(by_source) - expected)
    duplicates = sum(len(v) - 1 for v in by_source.values())
    mismatched = []
    for source, outs in by_source.items():
        first = outs[0]
        for later in outs[1:]:
            if (later.decision, later.score) != (first.decision, first.score):
                mismatched.append(
                    (source, first.decision, first.score, later.decision, later.score)
                )
    ids = Counter(
        o.document["trace"]["id"] for o in outputs if o.decision in ("accepted", "rejected")
    )
    wanted_ids = {
        orjson.loads(value)["id"] for _, value, _, _ in records if value.startswith(b'{"@context')
    }
    return {
        "lost": lost,
        "unknown": unknown,
        "duplicates": duplicates,
        "mismatched": mismatched,
        "missing_ids": sorted(wanted_ids - set(ids)),
        "decisions": Counter(o.decision for o in outputs),
    }


def run_with_kills(
    kafka_bootstrap: str, count: int, kills: int, seed: int, kill_after: tuple[int, int]
) -> tuple[dict[str, Any], list[str], float]:
    """Backlog of ``count`` records; ``kills`` SIGKILLs, each after the incarnation has
    published a random number of records in ``kill_after`` (seeded); then run to the end."""
    rng = random.Random(seed)
    prefix = f"crash-{uuid.uuid4().hex[:8]}"
    env, output_topics = topics_env(prefix)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=PARTITIONS)
    records = make_inputs(count, prefix)
    offsets = [p.offset for p in produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], records)]
    log: list[str] = []
    started = time.monotonic()
    workers: list[WorkerProcess] = []
    try:
        for kill in range(kills):
            worker = WorkerProcess(kafka_bootstrap, **env).start()
            workers.append(worker)
            worker.wait_ready(timeout=120)
            target = rng.randint(*kill_after)
            done = wait_processed(worker, target, timeout=300)
            worker.kill()
            log.append(
                f"kill {kill + 1}: after {done} records published by this incarnation "
                f"(target {target}), t={time.monotonic() - started:.0f}s"
            )
            print(log[-1])
        worker = WorkerProcess(kafka_bootstrap, **env).start()
        workers.append(worker)
        worker.wait_ready(timeout=120)
        expected = {(r[2], o) for r, o in zip(records, offsets, strict=True)}
        outputs = collect_outputs(kafka_bootstrap, output_topics, expected, timeout=900, settle=3)
        assert worker.process is not None and worker.process.poll() is None
        seconds = time.monotonic() - started
    finally:
        for worker in workers:
            worker.stop()
    gaps = sum(
        int(e.get("records", 0))
        for w in workers
        for e in w.events()
        if e.get("event") == "consumer skipped records; scoring them from the log"
    )
    crashed = [str(e["event"]) for w in workers for e in w.events() if "Crashed" in str(e["event"])]
    assert not crashed, crashed
    result = account(outputs, records, offsets)
    result["gap_records"] = gaps
    return result, log, seconds


def _summary(result: dict[str, Any], count: int, kills: int, seconds: float) -> str:
    per_kill = result["duplicates"] / max(1, kills)
    return (
        f"{count} inputs, {kills} SIGKILL(s), {seconds:.0f} s: lost {len(result['lost'])}, "
        f"duplicates {result['duplicates']} ({per_kill:.1f} per kill), duplicate score "
        f"mismatches {len(result['mismatched'])}, records gap-filled from the log "
        f"{result['gap_records']}, outputs {dict(result['decisions'])}"
    )


def test_one_kill_loses_nothing(kafka_bootstrap: str) -> None:
    count = 300
    result, _, seconds = run_with_kills(
        kafka_bootstrap, count, kills=1, seed=7, kill_after=(40, 80)
    )
    print("\n" + _summary(result, count, 1, seconds))
    assert not result["lost"], f"lost {len(result['lost'])}: {result['lost'][:10]}"
    assert not result["missing_ids"], result["missing_ids"][:10]
    assert not result["unknown"]
    assert not result["mismatched"], result["mismatched"][:5]
    assert result["duplicates"] <= 300


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_ten_random_kills_lose_nothing(kafka_bootstrap: str) -> None:
    count, kills = 20_000, 10
    result, _, seconds = run_with_kills(
        kafka_bootstrap, count, kills=kills, seed=20_000, kill_after=(100, 1500)
    )
    print("\n" + _summary(result, count, kills, seconds))
    assert not result["lost"], f"lost {len(result['lost'])}: {result['lost'][:10]}"
    assert not result["missing_ids"], result["missing_ids"][:10]
    assert not result["unknown"]
    assert not result["mismatched"], result["mismatched"][:5]
    # About one batch plus what was published since the last offset commit, per kill.
    assert result["duplicates"] <= 300 * kills
