"""The bench corpus: ``examples/traces.jsonl`` replicated, each text made unique.

Run the benches as scripts from the repository root (``python bench/<name>.py``): this
directory is then on ``sys.path``, so ``import _corpus`` works.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# isort: off
import worker  # noqa: F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as in the worker)

# isort: on
import orjson

from worker.core.trace import parse_trace

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "traces.jsonl"


@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes
    text: str  # what the worker embeds: parse_trace(value).embedding_text()


# Numbers that make texts unique across every corpus built in this process.
_text_numbers = itertools.count()


def corpus(count: int, tag: str, unique_texts: bool = True) -> list[Record]:
    """examples/traces.jsonl replicated in order to ``count`` records, each with a unique id.

    Keys cycle over 32 agents so the default partitioner spreads them over the partitions.
    The id is not part of the embedding text, so the 50 example texts would repeat, and the
    worker takes the vector of a repeated text from its cache instead of running the model.
    With ``unique_texts`` (the default) each objective gets a number, " (#1234)", that no
    other record of this process has: every record costs one model run, a few tokens more.
    """
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    records = []
    for index in range(count):
        document = orjson.loads(lines[index % len(lines)])
        document["id"] = f"kp:trace:bench-{tag}-{index}"
        if unique_texts:
            task = document["task"]
            task["objective"] = f"{task['objective']} (#{next(_text_numbers)})"
        value = orjson.dumps(document)
        records.append(
            Record(f"agent-{index % 32}".encode(), value, parse_trace(value).embedding_text())
        )
    return records


def write_jsonl(records: Sequence[Record], path: Path) -> Path:
    """The records' values, one per line (what ``kp-scorer score`` reads)."""
    path.write_bytes(b"".join(record.value + b"\n" for record in records))
    return path
