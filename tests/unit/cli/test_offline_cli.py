"""Offline scoring of JSONL files: ``worker.offline`` and ``kp-scorer score``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from worker.cli.main import main
from worker.cli.score import output_line, score_lines
from worker.core.cache import PartitionCaches
from worker.core.records import LineRecords, SourceRecord
from worker.core.scorer import Scorer, Thresholds
from worker.core.scoring import BUILTIN_PROFILES, ProfileSet

from support.paths import EXAMPLES, REPO
from support.traces import (
    CODE_REVIEW_EXPECTED_SCORE,
    FINANCE_EXPECTED_SCORE,
    FIXED_CREATED_AT_MS,
    code_review_example,
    finance_example,
    make_trace,
)


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def jsonl(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


GOOD_REVIEW = orjson.dumps(code_review_example())
GOOD_FINANCE = orjson.dumps(finance_example())
BAD_JSON = b'{"@context": "https://knowledgepulse.dev/schema/v1", oops'
BAD_SCHEMA = orjson.dumps(make_trace(steps=[]))
MIXED = jsonl(GOOD_REVIEW, BAD_JSON, b"", BAD_SCHEMA, GOOD_FINANCE)


@pytest.fixture
def mixed_file(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(MIXED)
    return path


def output_records(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines()]


def check_mixed_output(records: list[dict[str, Any]]) -> None:
    assert len(records) == 5  # one per input line, blank line included
    review, bad_json, blank, bad_schema, finance = records
    assert review["trace"]["id"] == code_review_example()["id"]
    assert review["score"]["score"] == pytest.approx(CODE_REVIEW_EXPECTED_SCORE, abs=1e-9)
    assert review["trace"]["metadata"]["quality_score"] == review["score"]["score"]
    assert review["score"]["novelty_source"] == "no_embedder"
    assert review["source"]["offset"] == 0
    assert bad_json == {
        "line": 2,
        "error": {"kind": "invalid_json", "reason": bad_json["error"]["reason"]},
    }
    assert bad_json["error"]["reason"].startswith("not valid JSON")
    assert blank["line"] == 3 and blank["error"]["kind"] == "empty"
    assert bad_schema == {
        "line": 4,
        "error": {"kind": "schema", "reason": "steps: needs at least 1 item(s)"},
    }
    assert finance["trace"]["id"] == "kp:trace:finance-demo-001"
    assert finance["score"]["score"] == pytest.approx(FINANCE_EXPECTED_SCORE, abs=1e-9)
    assert finance["score"]["novelty_source"] == "no_embedder"
    assert finance["source"]["offset"] == 4


# --- worker.offline -----------------------------------------------------------------------


def offline_scorer(threshold: float = 0.75) -> Scorer:
    return Scorer(
        profiles=ProfileSet(BUILTIN_PROFILES),
        thresholds=Thresholds(threshold),
        caches=PartitionCaches(),
        embedder=None,
    )


def test_score_lines_one_output_per_line_in_order() -> None:
    out = io.StringIO()
    progress: list[tuple[int, int]] = []
    summary = score_lines(
        offline_scorer(0.7),
        io.BytesIO(MIXED),
        out,
        LineRecords("file.jsonl", None),
        lambda lines, size: progress.append((lines, size)),
    )
    check_mixed_output(output_records(out.getvalue()))
    assert summary.counts == {"accepted": 1, "rejected": 1, "dead_letter": 3}
    assert summary.scores == pytest.approx([CODE_REVIEW_EXPECTED_SCORE, FINANCE_EXPECTED_SCORE])
    assert sum(lines for lines, _ in progress) == 5
    assert sum(size for _, size in progress) == len(MIXED)


def test_score_lines_in_many_chunks_keeps_order() -> None:
    lines = [orjson.dumps(make_trace(id=f"kp:trace:{i}")) if i % 7 else b"x" for i in range(100)]
    out = io.StringIO()
    summary = score_lines(offline_scorer(), iter(lines), out, LineRecords("f", None))
    records = output_records(out.getvalue())
    assert len(records) == 100
    for i, item in enumerate(records):
        if i % 7:
            assert item["trace"]["id"] == f"kp:trace:{i}"
            assert item["source"]["offset"] == i
        else:
            assert item == {"line": i + 1, "error": item["error"]}
    assert summary.counts["dead_letter"] == 15


def test_crlf_and_missing_final_newline() -> None:
    data = GOOD_REVIEW + b"\r\n" + GOOD_FINANCE
    out = io.StringIO()
    score_lines(offline_scorer(), io.BytesIO(data), out, LineRecords("f", None))
    records = output_records(out.getvalue())
    assert [r["trace"]["id"] for r in records] == [
        code_review_example()["id"],
        "kp:trace:finance-demo-001",
    ]


def test_line_records_partition_by_and_event_time() -> None:
    records = LineRecords("src", "metadata.agent_id")
    lines = [
        orjson.dumps(make_trace(metadata={"agent_id": "a"})),
        orjson.dumps(make_trace(metadata={"agent_id": "b"})),
        orjson.dumps(make_trace(metadata={"agent_id": "a"})),
        orjson.dumps(make_trace()),  # no agent_id: its own group (null)
        b"not json",  # also null
    ]
    made = [records.record(i, line) for i, line in enumerate(lines)]
    assert [r.partition for r in made] == [0, 1, 0, 2, 2]
    assert [r.offset for r in made] == [0, 1, 2, 3, 4]
    assert made[0] == SourceRecord("src", 0, 0, FIXED_CREATED_AT_MS, None, lines[0])
    assert made[4].timestamp_ms == 0  # no created_at: time 0
    assert LineRecords("src", None).record(9, lines[1]).partition == 0


def test_partition_by_a_value_too_deep_to_serialise_does_not_crash() -> None:
    records = LineRecords("src", "x")
    deep = b'{"x":' + b"[" * 300 + b"]" * 300 + b"}"
    assert records.record(0, deep).partition == 0
    assert records.record(1, deep).partition == 0
    assert records.record(2, b'{"x": 1}').partition == 1


@pytest.mark.parametrize(
    ("created_at", "expected_ms"),
    [
        ("2025-01-15T12:00:00+00:00", FIXED_CREATED_AT_MS),
        ("2025-01-15T12:00:00Z", FIXED_CREATED_AT_MS),
        ("2025-01-15T14:00:00+02:00", FIXED_CREATED_AT_MS),
        ("2025-01-15T12:00:00.001Z", FIXED_CREATED_AT_MS + 1),
        ("2025-01-15t12:00:00z", FIXED_CREATED_AT_MS),  # RFC 3339 allows lower case
        ("2016-12-31T23:59:60Z", 1_483_228_800_000),  # a leap second: 2017-01-01T00:00:00Z
        ("2016-12-31T18:59:60.5-05:00", 1_483_228_800_500),
        # float seconds * 1000 would give ...080 for these
        ("2038-06-13T14:51:45.081000+00:00", 2_160_053_505_081),
        ("1833-10-11T17:10:41.397000+00:00", -4_298_770_158_603),
        ("0001-01-01T00:00:00+01:00", -62_135_600_400_000),
        ("0001-01-01T00:00:00", -62_135_596_800_000),
        ("9999-12-31T23:59:59-01:00", 253_402_304_399_000),
        # The last leap second RFC 3339 can write: its second after is past datetime's range.
        ("9999-12-31T23:59:60Z", 253_402_300_800_000),
        ("9999-12-31T23:59:60.999", 253_402_300_800_999),
        ("9999-12-31T23:59:60-01:00", 253_402_304_400_000),
        # Year 0000, which RFC 3339 (and the schema) admit and datetime cannot hold; a leap year.
        ("0000-01-01T00:00:00Z", -62_167_219_200_000),
        ("0000-02-29T12:00:00.5z", -62_162_078_399_500),
        ("0000-12-31T23:59:60Z", -62_135_596_800_000),
        ("0000-12-31T23:30:00-01:00", -62_135_595_000_000),
    ],
)
def test_event_time_is_exact_milliseconds(created_at: str, expected_ms: int) -> None:
    line = orjson.dumps(make_trace(metadata={"created_at": created_at}))
    assert LineRecords("f", None).record(0, line).timestamp_ms == expected_ms


def test_event_time_without_offset_is_utc_on_any_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    line = orjson.dumps(make_trace(metadata={"created_at": "2024-03-10T02:30:00"}))
    try:
        for zone in ("UTC", "America/New_York", "Asia/Kolkata"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            assert LineRecords("f", None).record(0, line).timestamp_ms == 1_710_037_800_000
    finally:
        monkeypatch.undo()
        time.tzset()


def test_output_line_for_error_and_scored_records() -> None:
    scorer = offline_scorer()
    routed = scorer.score_batch(
        [SourceRecord("f", 0, 6, 0, None, b"[]"), SourceRecord("f", 0, 7, 0, None, GOOD_REVIEW)]
    ).routed
    assert orjson.loads(output_line(routed[0])) == {
        "line": 7,
        "error": {
            "kind": "not_object",
            "reason": "expected a JSON object (ReasoningTrace), got list",
        },
    }
    assert output_line(routed[1]) == routed[1].value


# --- kp-scorer score ----------------------------------------------------------------------


def test_cli_score_file(mixed_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["score", str(mixed_file), "--no-embedder", "--quiet", "--threshold", "0.7"])
    captured = capsys.readouterr()
    assert rc == 0
    check_mixed_output(output_records(captured.out))
    decisions = [r["score"]["decision"] for r in output_records(captured.out) if "score" in r]
    assert decisions == ["rejected", "accepted"]
    assert "scored 5 lines" in captured.err
    assert "accepted=1, rejected=1, dead_letter=3" in captured.err
    assert "mean score" in captured.err


def test_cli_default_threshold(mixed_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", str(mixed_file), "--no-embedder", "--quiet"]) == 0
    captured = capsys.readouterr()
    decisions = [r["score"]["decision"] for r in output_records(captured.out) if "score" in r]
    assert decisions == ["rejected", "rejected"]  # 0.66875 and 0.724 are below 0.75
    assert all(
        r["score"]["threshold"] == 0.75 for r in output_records(captured.out) if "score" in r
    )
    assert "accepted=0, rejected=2, dead_letter=3" in captured.err


def test_cli_score_file_whose_name_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Latin-1 file name ("caf\xe9.jsonl") is named with its byte replaced in each output's
    source; every line failed to be written (a surrogate is no UTF-8) and the command ended
    in a traceback."""
    path = tmp_path / os.fsdecode(b"caf\xe9.jsonl")
    path.write_bytes(GOOD_REVIEW + b"\n")
    assert main(["score", str(path), "--no-embedder", "--quiet"]) == 0
    (record,) = output_records(capsys.readouterr().out)
    assert record["source"]["topic"] == f"{tmp_path}/caf\ufffd.jsonl"


def test_cli_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(MIXED)))
    assert main(["score", "-", "--no-embedder", "--quiet"]) == 0
    check_mixed_output(output_records(capsys.readouterr().out))


def test_cli_partition_by(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agents.jsonl"
    path.write_bytes(
        jsonl(
            *(
                orjson.dumps(make_trace(metadata={"agent_id": agent}))
                for agent in ("x", "y", "x", "z")
            )
        )
    )
    args = ["score", str(path), "--no-embedder", "--quiet", "--partition-by", "metadata.agent_id"]
    assert main(args) == 0
    records = output_records(capsys.readouterr().out)
    assert [r["source"]["partition"] for r in records] == [0, 1, 0, 2]
    assert all(r["source"]["topic"] == str(path) for r in records)


def test_cli_profiles_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = tmp_path / "profiles.json"
    profiles.write_bytes(
        orjson.dumps(
            {"default": {"complexity": 0.0, "novelty": 0.0, "tool_diversity": 0.0, "outcome": 1.0}}
        )
    )
    path = tmp_path / "t.jsonl"
    path.write_bytes(jsonl(GOOD_FINANCE))
    assert main(["score", str(path), "--no-embedder", "--quiet", "--profiles", str(profiles)]) == 0
    (record,) = output_records(capsys.readouterr().out)
    assert record["score"]["profile"] == "default"  # finance is not in the file
    assert record["score"]["score"] == pytest.approx(0.92, abs=1e-9)


def test_cli_invalid_profiles_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = tmp_path / "profiles.json"
    profiles.write_bytes(
        orjson.dumps(
            {"default": {"complexity": 0.5, "novelty": 0.5, "tool_diversity": 0.5, "outcome": 0.5}}
        )
    )
    path = tmp_path / "t.jsonl"
    path.write_bytes(jsonl(GOOD_FINANCE))
    assert main(["score", str(path), "--no-embedder", "--quiet", "--profiles", str(profiles)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "sum to 2.0" in captured.err.replace("\n", " ")


def test_cli_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", str(tmp_path / "absent.jsonl"), "--no-embedder", "--quiet"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_bad_threshold_is_a_settings_error(
    mixed_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["score", str(mixed_file), "--no-embedder", "--quiet", "--threshold", "1.5"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--threshold: " in err  # the flag given, not a variable that was never set
    assert "KP_ACCEPT_THRESHOLD" not in err


def test_cli_subprocess_end_to_end(mixed_file: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KP_")}
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "score", str(mixed_file), "--no-embedder", "--quiet"],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr.decode()
    check_mixed_output(output_records(result.stdout.decode()))
    assert b"scored 5 lines" in result.stderr


@pytest.mark.skipif(not EXAMPLES.is_file(), reason="examples/traces.jsonl not present")
def test_every_example_trace_scores(capsys: pytest.CaptureFixture[str]) -> None:
    lines = EXAMPLES.read_bytes().splitlines()
    assert main(["score", str(EXAMPLES), "--no-embedder", "--quiet"]) == 0
    records = output_records(capsys.readouterr().out)
    assert len(records) == len(lines)
    errors = [r for r in records if "error" in r]
    assert errors == []
    for item in records:
        assert 0.0 <= item["score"]["score"] <= 1.0
        assert item["score"]["novelty_source"] == "no_embedder"
