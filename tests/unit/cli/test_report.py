"""`kp-scorer report`: its acceptance numbers are `rescore --threshold T`'s for any T, its
distributions count every record, the page stands alone, and 3,000 recorded outputs take
well under 2 s."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from worker.cli.main import main
from worker.core.score_report import AcceptanceCurve

from support.paths import REPO
from support.scored_corpus import model_scorer, replicate, scored_examples

CORPUS_RECORDS = 3000
CHARTS = {"score_by_domain", "acceptance", "dimensions", "novelty_sources", "dead_letters"}


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 recorded outputs of the examples (real novelty), 2% of them dead letters."""
    outputs, errors = scored_examples(model_scorer())
    path = tmp_path_factory.mktemp("report") / "scored.jsonl"
    path.write_bytes(replicate(outputs, errors, CORPUS_RECORDS))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--quiet"]) == 0
    return orjson.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def curve(numbers: dict[str, Any]) -> AcceptanceCurve:
    steps = numbers["steps"]
    return AcceptanceCurve(numbers["records"], steps["threshold"], steps["accepted"])


def test_acceptance_equals_rescore_at_every_threshold_tried(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_json(capsys, "report", str(corpus), "--json")
    overall = curve(report["acceptance"])
    recorded = overall.thresholds
    # Round numbers, the ends, a recorded score itself (a tie is accepted) and the float
    # just above it (not), the score just above the median.
    tie = recorded[len(recorded) // 2]
    thresholds = [0.0, 0.25, 0.5, tie, math.nextafter(tie, 1.0), 0.6, 0.75, 0.9, 1.0]
    for threshold in thresholds:
        rescored = run_json(
            capsys,
            "rescore",
            str(corpus),
            "--threshold",
            repr(threshold),
            "--output",
            str(tmp_path / "rescored.jsonl"),
            "--json",
        )
        accepted = rescored["decisions"]["after"]["accepted"]
        assert overall.accepted_at(threshold) == accepted, threshold
        for name, tally in rescored["domains"].items():
            domain = curve(report["domains"][name]["acceptance"])
            assert domain.accepted_at(threshold) == tally["accepted_after"], (threshold, name)
        # The same threshold configured: the report's count at the configured thresholds.
        at = run_json(capsys, "report", str(corpus), "--threshold", repr(threshold), "--json")
        assert at["accepted_at_configured_thresholds"] == accepted, threshold
        grid = {row["threshold"]: row for row in at["acceptance"]["grid"]}
        if threshold in grid:
            assert grid[threshold]["accepted"] == accepted
            assert grid[threshold]["share"] == accepted / rescored["rescored"]
    assert overall.accepted_at(tie) > overall.accepted_at(math.nextafter(tie, 1.0))


def test_domain_thresholds_are_the_configured_ones(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--threshold", "0.5", "--domain-threshold", "finance=0.7"]
    report = run_json(capsys, "report", str(corpus), *flags, "--json")
    rescored = run_json(
        capsys, "rescore", str(corpus), *flags, "--output", str(tmp_path / "r.jsonl"), "--json"
    )
    assert report["thresholds"] == {"default": 0.5, "domains": {"finance": 0.7}}
    assert report["domains"]["finance"]["threshold"] == 0.7
    assert report["domains"]["code"]["threshold"] == 0.5
    assert report["accepted_at_configured_thresholds"] == rescored["decisions"]["after"]["accepted"]
    for name, tally in rescored["domains"].items():
        assert report["domains"][name]["accepted_at_threshold"] == tally["accepted_after"], name


def test_distributions_count_every_record(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "report", str(corpus), "--json")
    dead = CORPUS_RECORDS // 50
    assert report["records"] == CORPUS_RECORDS
    assert report["scored"] == CORPUS_RECORDS - dead
    assert report["dead_letters"]["total"] == dead
    assert set(report["dead_letters"]["by_kind"]) == {"invalid_json", "not_object", "schema"}
    assert sum(report["dead_letters"]["by_kind"].values()) == dead
    assert sum(report["score"]["counts"]) == report["scored"]
    assert sum(d["score"]["records"] for d in report["domains"].values()) == report["scored"]
    for name, dimension in report["dimensions"].items():
        assert sum(dimension["counts"]) == report["scored"], name
        assert len(dimension["edges"]) == len(dimension["counts"]) + 1
    assert sum(report["novelty_sources"].values()) == report["scored"]
    assert set(report["novelty_sources"]) <= {"embedding", "empty_cache"}
    grid = report["acceptance"]["grid"]
    assert [row["threshold"] for row in grid] == [i / 100 for i in range(101)]
    assert grid[0]["share"] == 1.0  # every score is >= 0
    shares = [row["share"] for row in grid]
    assert shares == sorted(shares, reverse=True)


def test_the_page_stands_alone_with_every_chart(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(corpus), "--output", str(page), "--quiet"]) == 0
    text = page.read_text()
    assert set(re.findall(r'data-chart="(\w+)"', text)) == CHARTS
    assert text.count("<svg") == len(CHARTS)
    # Nothing fetched: no script, stylesheet or image from elsewhere; the only addresses are
    # the SVG namespaces.
    addresses = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert addresses <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
    assert "<script" not in text and "<link" not in text and "@import" not in text
    # No trace content: objectives of the examples never appear.
    assert "objective" not in text
    assert f"written to {page}" in capsys.readouterr().err


def test_without_matplotlib_the_error_names_the_extra(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    page = tmp_path / "report.html"
    assert main(["report", str(corpus), "--output", str(page), "--quiet"]) == 2
    assert "pip install 'kp-scorer[report]'" in capsys.readouterr().err
    assert not page.exists()
    # The numbers need no plotting library.
    assert run_json(capsys, "report", str(corpus), "--json")["records"] == CORPUS_RECORDS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give a FILE of scored outputs or --from-topics"),
        (["x.jsonl", "--from-topics"], "give a FILE or --from-topics, not both"),
        (["x.jsonl", "--topic", "t"], "--topic need --from-topics"),
    ],
)
def test_cli_rejects_what_it_cannot_read(args: list[str], message: str, capsys) -> None:
    assert main(["report", *args]) == 2
    assert message in capsys.readouterr().err


def test_3000_recorded_outputs_make_the_page_as_an_operator_runs_it(
    corpus: Path, tmp_path: Path
) -> None:
    """The whole process, start-up included; its time is bench/report_time.py's figure."""
    page = tmp_path / "report.html"
    command = [sys.executable, "-m", "worker.cli", "report", str(corpus), "-o", str(page)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    subprocess.run([*command, "--quiet"], check=True, env=env, capture_output=True)
    assert page.stat().st_size > 0


def test_a_file_of_dead_letters_alone_still_makes_every_chart(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = tmp_path / "dead.jsonl"
    dead.write_bytes(b"".join(line + b"\n" for line in corpus.read_bytes().splitlines()[49::50]))
    page = tmp_path / "report.html"
    assert main(["report", str(dead), "--output", str(page), "--quiet"]) == 0
    text = page.read_text()
    assert set(re.findall(r'data-chart="(\w+)"', text)) == CHARTS
    assert "no scored records" in text
    report = run_json(capsys, "report", str(dead), "--json")
    assert report["scored"] == 0 and report["dead_letters"]["total"] == CORPUS_RECORDS // 50
    assert report["acceptance"]["grid"][0] == {"threshold": 0.0, "accepted": 0, "share": None}


def test_domains_are_drawn_as_written_not_as_math(corpus: Path, tmp_path: Path) -> None:
    """A producer chooses task_domain: matplotlib read one between dollar signs as math, so
    "$\\foo$" stopped the report with a ParseFatalException and "$x^2$" was typeset."""
    lines = corpus.read_bytes().splitlines()[:40]
    domains = ["$\\foo$", "a $x^2$ b"]
    edited = []
    for index, line in enumerate(lines):
        document = orjson.loads(line)
        if "trace" in document and index < 20:
            document["trace"]["metadata"]["task_domain"] = domains[index % 2]
        edited.append(orjson.dumps(document))
    scored = tmp_path / "scored.jsonl"
    scored.write_bytes(b"\n".join(edited) + b"\n")
    page = tmp_path / "report.html"
    assert main(["report", str(scored), "--output", str(page), "--quiet"]) == 0
    charts = page.read_text().split('data-chart="score_by_domain"')[1].split("</figure>")[0]
    for domain in domains:
        assert domain in charts


def test_paths_are_printed_as_written(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path holding "[/x]" read as console markup: the report was written, then the line
    saying so stopped the command with a MarkupError (exit 1, a traceback)."""
    source = tmp_path / "runs[/x].jsonl"
    source.parent.mkdir()
    source.write_bytes(b"".join(corpus.read_bytes().splitlines(keepends=True)[:20]))
    page = tmp_path / "runs[/page].html"
    assert main(["report", str(source), "--output", str(page), "--quiet"]) == 0
    assert f"from {source} written to {page}" in " ".join(capsys.readouterr().err.split())


def test_the_acceptance_table_has_every_domain_and_the_captions_say_what_is_shown(
    corpus: Path, tmp_path: Path
) -> None:
    """With more domains than the 8 drawn, the acceptance table kept only those 8 while the
    caption said the tables had all of them; novelty was said to be measured against "the
    domain's recent traces", where the cache is the input partition's."""
    domains = [f"domain-{index:02}" for index in range(11)]
    edited = []
    for index, line in enumerate(corpus.read_bytes().splitlines()[:440]):
        document = orjson.loads(line)
        if "trace" in document:
            document["trace"]["metadata"]["task_domain"] = domains[index % len(domains)]
        edited.append(orjson.dumps(document))
    scored = tmp_path / "scored.jsonl"
    scored.write_bytes(b"\n".join(edited) + b"\n")
    page = tmp_path / "report.html"
    assert main(["report", str(scored), "--output", str(page), "--quiet"]) == 0
    text = page.read_text()
    table = text.split("<h2>Acceptance table</h2>")[1]
    header = re.findall(r"<th>([^<]*)</th>", table.split("</thead>")[0])
    assert header[:2] == ["threshold", "all domains"]
    assert sorted(header[2:]) == domains  # largest first, as in the Domains table
    assert "The 8 largest of 11 domains (all of them in the Domains and Acceptance tables" in text
    assert "domain's recent traces" not in text
    assert "recent traces of the same input partition" in text
