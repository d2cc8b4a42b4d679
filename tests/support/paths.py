"""Where the tests' files are, independent of where a test module sits under ``tests/``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DATA = TESTS / "data"
EXAMPLES = REPO / "examples" / "traces.jsonl"
