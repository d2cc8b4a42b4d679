"""The hostile-input corpus in ``tests/data/bad/``, shared by its pure and broker tests.

``tests/data/bad/MANIFEST.json`` maps each input to the routing it must get: the
``kp-error-kind`` it is dead-lettered with, or ``valid`` (a few edge cases that must be scored,
not dead-lettered). Entries with a ``generate`` recipe have no committed file: their bytes (a
5 MB string, 10,000 steps, 10,000 levels of nesting) are built here at test time, so the
committed corpus stays small.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import orjson

from worker.core.trace import MAX_DEPTH

from support.paths import DATA

BAD_DIR = DATA / "bad"
MANIFEST: dict[str, dict[str, Any]] = {
    name: entry
    for name, entry in json.loads((BAD_DIR / "MANIFEST.json").read_text()).items()
    if not name.startswith("$")
}
VALID = "valid"

# The base document of the generated entries (the same shape as the committed files').
BASE: dict[str, Any] = {
    "@context": "https://openknowledgepulse.org/schema/v1",
    "@type": "ReasoningTrace",
    "id": "kp:trace:bad-generated",
    "metadata": {
        "created_at": "2025-01-15T12:00:00Z",
        "task_domain": "code",
        "success": True,
        "quality_score": 0,
        "visibility": "network",
        "privacy_level": "aggregated",
    },
    "task": {"objective": "Find the failing test"},
    "steps": [
        {"step_id": 0, "type": "thought", "content": "Read the CI log"},
        {"step_id": 1, "type": "tool_call", "tool": {"name": "shell"}, "input": {"cmd": "x"}},
    ],
    "outcome": {"result_summary": "found it", "confidence": 0.8},
}


def _base(name: str) -> dict[str, Any]:
    document = json.loads(json.dumps(BASE))
    document["id"] = f"kp:trace:bad-{name.removesuffix('.json')}"
    return document


def _generate(name: str, recipe: dict[str, Any]) -> bytes:
    kind = recipe["recipe"]
    document = _base(name)
    if kind == "long_content":
        document["steps"][0]["content"] = "a" * recipe["content_bytes"]
        return orjson.dumps(document)
    if kind == "pad_to":
        # An unknown field (passed through, never embedded) grown to the exact total size.
        document["x_pad"] = ""
        missing = recipe["total_bytes"] - len(orjson.dumps(document))
        document["x_pad"] = "p" * missing
        raw = orjson.dumps(document)
        assert len(raw) == recipe["total_bytes"]
        return raw
    if kind == "many_steps":
        count = recipe["count"]
        document["steps"] = [{"step_id": i, "type": "thought"} for i in range(count)]
        if recipe["last_step"] == "bad_type":
            document["steps"][-1]["type"] = "bogus"
        return orjson.dumps(document)
    if kind == "number_expansion":
        # Short number literals (1e9) that are written back much longer (1000000000.0).
        raw = orjson.dumps(document)
        count = (recipe["total_bytes"] - len(raw) - 12) // 4
        return raw[:-1] + b',"x_numbers":[' + b",".join([b"1e9"] * count) + b"]}"
    if kind == "input_total_depth":
        # The document is level 1, steps 2, a step 3, its input 4: n dicts reach level 3 + n.
        limit = MAX_DEPTH + recipe["over_limit"]
        nested: Any = 1
        for _ in range(limit - 3):
            nested = {"a": nested}
        document["steps"][1]["input"] = nested
        return orjson.dumps(document)
    if kind == "deep_input":
        depth = recipe["depth"]
        raw = orjson.dumps(document)
        deep = b'{"a":' * depth + b"1" + b"}" * depth
        return raw.replace(b'"input":{"cmd":"x"}', b'"input":' + deep)
    if kind == "deep_array_root":
        return b"[" * recipe["depth"] + b"]" * recipe["depth"]
    raise AssertionError(f"{name}: unknown recipe {kind!r}")


@cache
def corpus_bytes(name: str) -> bytes:
    entry = MANIFEST[name]
    if "generate" in entry:
        return _generate(name, entry["generate"])
    return (BAD_DIR / name).read_bytes()
