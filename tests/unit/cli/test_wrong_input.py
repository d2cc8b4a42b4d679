"""A first run on the wrong file says so in one line and fails, as docs/commands.md says.

- ``score``, ``rescore`` and ``report`` refuse a file that is not UTF-8 JSON lines at all
  (random bytes, an image, UTF-16 text) with exit 2, naming the file and its first bad line,
  before writing anything; a bad line past the start is still one error line.
- ``report`` on traces that were never scored, or on nothing, exits 1 with no page, saying
  how to make scored outputs.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from worker.cli.main import main
from worker.cli.progress import HEAD_BYTES

from support.paths import REPO
from support.scored_corpus import model_scorer, scored_examples
from support.traces import code_review_example

GOOD = orjson.dumps(code_review_example())
EXAMPLES = REPO / "examples" / "traces.jsonl"
FLAGS = {"score": ["--no-embedder"], "rescore": [], "report": ["--json"]}


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def run(capsys: pytest.CaptureFixture[str], command: str, *args: str) -> tuple[int, str, str]:
    code = main([command, *args, *FLAGS[command], "--quiet"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


NOT_JSON_LINES = {
    "random": (random.Random(7).randbytes(4096), "line 1 is not UTF-8"),
    "png": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4, "line 1 is not UTF-8"),
    "utf-16": ((GOOD.decode() + "\n").encode("utf-16") * 3, "line 1 is not UTF-8"),
    "nul-on-line-3": (GOOD + b"\n" + GOOD + b"\n\x00\x00\x00\n", "line 3 holds a NUL byte"),
}


@pytest.mark.parametrize("command", ["score", "rescore", "report"])
@pytest.mark.parametrize("kind", list(NOT_JSON_LINES))
def test_a_file_that_is_not_json_lines_is_one_line_and_exit_2(
    command: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kp-scorer score picture.png` exited 0 and wrote an error line per "line" of it, each
    "surrogates not allowed"."""
    content, problem = NOT_JSON_LINES[kind]
    path = tmp_path / f"{kind}.bin"
    path.write_bytes(content)
    code, out, err = run(capsys, command, str(path))
    assert code == 2
    assert out == ""
    assert err == f"kp-scorer: {path} is not UTF-8 JSON lines ({problem}); give a JSONL file\n"


def test_binary_stdin_is_refused_the_same_way() -> None:
    """`cat picture.png | kp-scorer score`: stdin, a pipe, is looked at as a file is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KP_")}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "score", "--no-embedder", "--quiet"],
        input=NOT_JSON_LINES["png"][0],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert done.stderr == (
        b"kp-scorer: stdin is not UTF-8 JSON lines (line 1 is not UTF-8); give a JSONL file\n"
    )


def test_a_bad_line_past_the_start_is_still_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the start decides what kind of file it is: later, a line that is not UTF-8 is one
    bad record among good ones, dead-lettered as the worker would."""
    lines = [GOOD] * (HEAD_BYTES // len(GOOD) + 2) + [b'{"x": "\xff"}', GOOD]
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    code, out, _ = run(capsys, "score", str(path))
    assert code == 0
    written = [orjson.loads(line) for line in out.splitlines()]
    assert len(written) == len(lines)
    assert written[-2] == {
        "line": len(lines) - 1,
        "error": {"kind": "invalid_encoding", "reason": written[-2]["error"]["reason"]},
    }


def test_report_on_traces_never_scored_says_how_to_score_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It wrote a page of empty charts and exited 0, saying "report of 0 scored records"."""
    page = tmp_path / "report.html"
    assert main(["report", str(EXAMPLES), "--output", str(page), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"no scored outputs in {EXAMPLES} (50 records read: not_an_output 50)" in err
    assert "`kp-scorer score FILE > scored.jsonl`, then `kp-scorer report scored.jsonl`" in err
    assert not page.exists()


def test_report_of_nothing_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "scored.jsonl"
    empty.write_bytes(b"")
    code, out, err = run(capsys, "report", str(empty))
    assert (code, out) == (1, "")
    assert err == f"kp-scorer: no records in {empty}: nothing to report\n"


def test_report_on_outputs_scored_without_a_model_says_to_use_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Their novelty is the 0.5 stand-in, which report cannot re-score from: "score traces
    first" would send the person round in a circle."""
    code, out, _ = run(capsys, "score", str(EXAMPLES))
    assert code == 0
    scored = tmp_path / "scored.jsonl"
    scored.write_text(out)
    code, out, err = run(capsys, "report", str(scored))
    assert (code, out) == (1, "")
    assert "(50 records read: no_embedder 50)" in err
    assert "score the traces with the model" in err


def test_report_of_scored_outputs_still_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs, errors = scored_examples(model_scorer())
    scored = tmp_path / "scored.jsonl"
    scored.write_bytes(b"".join(line + b"\n" for line in [*outputs, *errors]))
    code, out, err = run(capsys, "report", str(scored))
    assert code == 0, err
    assert orjson.loads(out)["scored"] == len(outputs)
