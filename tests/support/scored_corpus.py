"""Recorded outputs as `kp-scorer score` writes them: the examples scored with the real model
(real novelty), and a few lines it dead-letters, replicated to any number of lines with
unique trace ids and offsets (as bench/rescore.py builds its input)."""

from __future__ import annotations

import io
import uuid

import orjson

from worker.cli.score import score_lines
from worker.core.cache import PartitionCaches
from worker.core.records import LineRecords
from worker.core.scorer import Scorer, build_scorer
from worker.settings import load_settings

from support.paths import EXAMPLES

# Lines `score` cannot score, one per dead-letter kind shown in the report.
UNSCORABLE = (b"{not json", b"[1, 2]", b'{"id": "kp:trace:x"}')


def model_scorer() -> Scorer:
    scorer = build_scorer(load_settings())
    assert scorer.embedder is not None, scorer.embedder_reason
    return scorer


def scored_examples(scorer: Scorer) -> tuple[list[bytes], list[bytes]]:
    """(scored outputs, error lines) of the examples and ``UNSCORABLE``, with fresh caches."""
    scorer.caches = PartitionCaches(1000)
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    out = io.StringIO()
    score_lines(scorer, [*lines, *UNSCORABLE], out, LineRecords("traces.jsonl", None))
    written = [line.encode() for line in out.getvalue().splitlines()]
    errors = [line for line in written if line.startswith(b'{"line"')]
    return [line for line in written if not line.startswith(b'{"line"')], errors


def replicate(outputs: list[bytes], errors: list[bytes], records: int) -> bytes:
    """``records`` lines cycling through ``outputs``, each with its own trace id and offset;
    every 50th an error line (2% dead letters, of every kind in ``errors``)."""
    parsed = [orjson.loads(line) for line in outputs]
    lines = []
    for offset in range(records):
        if offset % 50 == 49:
            lines.append(errors[(offset // 50) % len(errors)])
            continue
        document = parsed[offset % len(parsed)]
        document["trace"]["id"] = f"kp:trace:{uuid.UUID(int=(1 << 64) + offset)}"
        document["source"]["offset"] = offset
        lines.append(orjson.dumps(document))
    return b"\n".join(lines) + b"\n"
