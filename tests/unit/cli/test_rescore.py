"""`kp-scorer rescore` on files: recorded novelty + new settings == scoring from scratch."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from worker import __version__
from worker.cli.main import main
from worker.cli.rescore import rescore_stream
from worker.cli.score import score_lines
from worker.core.cache import PartitionCaches
from worker.core.records import LineRecords, SourceRecord
from worker.core.rescoring import (
    NotRescored,
    Rescored,
    Rescorer,
    RescoreSummary,
    rescored_record,
)
from worker.core.scorer import Scorer, Thresholds, build_scorer
from worker.core.scoring import BUILTIN_PROFILES, ProfileSet, profiles_from_mapping
from worker.settings import load_settings

from support.paths import EXAMPLES, REPO
from support.traces import make_trace

BUILTIN = ProfileSet(BUILTIN_PROFILES)
NEW_PROFILES = {
    "default": {"complexity": 0.3, "novelty": 0.3, "tool_diversity": 0.2, "outcome": 0.2},
    "finance": {"complexity": 0.1, "novelty": 0.2, "tool_diversity": 0.1, "outcome": 0.6},
    "code": {"complexity": 0.25, "novelty": 0.25, "tool_diversity": 0.25, "outcome": 0.25},
}
NEW_THRESHOLD = 0.5
NEW_DOMAIN_THRESHOLDS = {"finance": 0.7, "medical": 0.4}


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


@pytest.fixture(scope="module")
def model_scorer() -> Scorer:
    scorer = build_scorer(load_settings())
    assert scorer.embedder is not None, scorer.embedder_reason
    return scorer


def score_file(scorer: Scorer, lines: list[bytes]) -> list[bytes]:
    """What `kp-scorer score` writes for these lines, with fresh caches."""
    scorer.caches = PartitionCaches(1000)
    out = io.StringIO()
    score_lines(scorer, lines, out, LineRecords("traces.jsonl", None))
    return [line.encode() for line in out.getvalue().splitlines()]


def example_lines() -> list[bytes]:
    return [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def recorded(model_scorer: Scorer) -> list[bytes]:
    """The examples scored with the default settings and the model: real recorded novelty."""
    return score_file(model_scorer, example_lines())


@pytest.fixture(scope="module")
def from_scratch(model_scorer: Scorer) -> list[bytes]:
    """The same traces scored from scratch with the new settings (same model, same order)."""
    scorer = Scorer(
        profiles=profiles_from_mapping(NEW_PROFILES),
        thresholds=Thresholds(NEW_THRESHOLD, NEW_DOMAIN_THRESHOLDS),
        caches=PartitionCaches(1000),
        embedder=model_scorer.embedder,
    )
    return score_file(scorer, example_lines())


def without_rescore_of(line: bytes) -> dict[str, Any]:
    document = orjson.loads(line)
    assert document["scorer"].pop("rescore_of") == __version__
    return document


def jsonl(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def rescore_all(rescorer: Rescorer, lines: list[bytes]) -> tuple[bytes, RescoreSummary]:
    out = io.BytesIO()
    summary = rescore_stream(rescorer, io.BytesIO(jsonl(lines)), out)
    return out.getvalue(), summary


def test_unchanged_settings_reproduce_every_recorded_output(recorded: list[bytes]) -> None:
    assert {orjson.loads(line)["score"]["novelty_source"] for line in recorded} == {
        "embedding",
        "empty_cache",
    }
    output, summary = rescore_all(Rescorer(BUILTIN), recorded)
    lines = output.splitlines()
    assert len(lines) == len(recorded)
    for before, after in zip(recorded, lines, strict=True):
        # Bit-identical: the whole document, scores included, bar the added scorer field.
        assert orjson.dumps(without_rescore_of(after)) == before
    assert summary.rescored == summary.identical == len(recorded)
    assert summary.accepted_to_rejected == summary.rejected_to_accepted == 0


def test_new_settings_give_exactly_what_scoring_from_scratch_gives(
    recorded: list[bytes], from_scratch: list[bytes]
) -> None:
    rescorer = Rescorer(profiles_from_mapping(NEW_PROFILES), NEW_THRESHOLD, NEW_DOMAIN_THRESHOLDS)
    output, summary = rescore_all(rescorer, recorded)
    lines = output.splitlines()
    assert [without_rescore_of(line) for line in lines] == [
        orjson.loads(line) for line in from_scratch
    ]
    flips: dict[str, list[int]] = {}
    for before, after in zip(recorded, from_scratch, strict=True):
        was, now = orjson.loads(before), orjson.loads(after)
        domain = was["trace"]["metadata"]["task_domain"]
        counts = flips.setdefault(domain, [0, 0])
        if (was["score"]["decision"], now["score"]["decision"]) == ("accepted", "rejected"):
            counts[0] += 1
        elif (was["score"]["decision"], now["score"]["decision"]) == ("rejected", "accepted"):
            counts[1] += 1
    assert sum(a + b for a, b in flips.values()) > 0, "the new settings must flip something"
    report = summary.to_json()
    for domain, (to_rejected, to_accepted) in flips.items():
        assert report["domains"][domain]["accepted_to_rejected"] == to_rejected
        assert report["domains"][domain]["rejected_to_accepted"] == to_accepted
    assert sum(report["score_delta"]["histogram"][i]["records"] for i in range(11)) == 50


def test_cli_file_mode_writes_scratch_lines_to_stdout_and_summary_to_stderr(
    tmp_path: Path, recorded: list[bytes], from_scratch: list[bytes], capsys
) -> None:
    source = tmp_path / "scored.jsonl"
    source.write_bytes(jsonl(recorded))
    profiles = tmp_path / "profiles.json"
    profiles.write_bytes(orjson.dumps(NEW_PROFILES))
    args = ["rescore", str(source), "--profiles", str(profiles), "--threshold", "0.5"]
    args += [f"--domain-threshold={d}={t}" for d, t in NEW_DOMAIN_THRESHOLDS.items()]
    assert main([*args, "--quiet"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.encode().splitlines()
    assert [without_rescore_of(line) for line in lines] == [
        orjson.loads(line) for line in from_scratch
    ]
    assert "flipped rejected -> accepted" in captured.err
    assert "score change (rescore - recorded)" in captured.err

    # The same through stdin, records to a file: the JSON summary then goes to stdout.
    written = tmp_path / "rescored.jsonl"
    stdin = io.TextIOWrapper(io.BytesIO(jsonl(recorded)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", stdin)
        assert main([*args[:1], "-", *args[2:], "--output", str(written), "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert written.read_bytes() == captured.out.encode()
    assert report["source"] == "stdin"
    assert report["records"] == report["rescored"] == 50
    assert report["settings"]["domain_thresholds"] == NEW_DOMAIN_THRESHOLDS
    assert report["decisions"]["after"]["accepted"] == sum(
        b'"decision":"accepted"' in line for line in from_scratch
    )


@pytest.mark.parametrize("field", ["novelty_source", "decision"])
@pytest.mark.parametrize("value", [[], {}, ["accepted"]], ids=["array", "object", "listed"])
def test_a_recorded_field_of_the_wrong_json_type_is_incomplete_not_a_crash(
    recorded: list[bytes], field: str, value: Any
) -> None:
    """An edited output whose decision or novelty source is an array or an object is answered
    with the field it lacks, like any other malformed field (it used to stop `rescore`)."""
    document = orjson.loads(recorded[5])
    document["score"][field] = value
    result = Rescorer(BUILTIN).rescore(document)
    assert isinstance(result, NotRescored)
    assert result.reason == "incomplete"
    assert f"score.{field}" in result.detail
    output, summary = rescore_all(Rescorer(BUILTIN), [orjson.dumps(document)])
    assert orjson.loads(output)["unrescorable"]["reason"] == "incomplete"
    assert summary.to_json()["unrescorable"] == {"incomplete": 1}


def test_unrescorable_lines_are_reported_in_place_and_counted(recorded: list[bytes]) -> None:
    good = orjson.loads(recorded[5])
    no_model = score_file(build_scorer(load_settings(), use_embedder=False), [example_lines()[0]])
    lacking = orjson.loads(recorded[6])
    del lacking["score"]["novelty_source"]
    older = orjson.loads(recorded[7])
    del older["scorer"]
    tampered = orjson.loads(recorded[8])
    tampered["trace"]["steps"] = tampered["trace"]["steps"] * 2  # other complexity
    invalid = orjson.loads(recorded[9])  # from a version whose schema allowed confidence 2
    invalid["trace"]["outcome"]["confidence"] = 2
    invalid["scorer"]["version"] = "0.0.9"
    edited = orjson.loads(recorded[11])
    del edited["trace"]["steps"]
    error_line = orjson.dumps({"line": 4, "error": {"kind": "invalid_json", "reason": "x"}})
    lines = [
        recorded[5],
        error_line,
        no_model[0],
        orjson.dumps(lacking),
        b"{not json",
        orjson.dumps(make_trace()),  # a trace, not a scored output
        orjson.dumps(older),
        orjson.dumps(tampered),
        orjson.dumps(invalid),
        b"",
        recorded[10] + b"\r",
        orjson.dumps(edited),
    ]
    output, summary = rescore_all(Rescorer(BUILTIN), lines)
    out = [orjson.loads(line) for line in output.splitlines()]
    assert len(out) == len(lines)
    assert out[0]["score"] == good["score"]
    assert output.splitlines()[1] == error_line  # never scored: passed through as it came
    reasons = {i + 1: o["unrescorable"]["reason"] for i, o in enumerate(out) if "unrescorable" in o}
    assert reasons == {
        3: "no_embedder",
        4: "incomplete",
        5: "not_an_output",
        6: "not_an_output",
        7: "incomplete",
        8: "dimensions_differ",
        9: "invalid_trace",
        10: "not_an_output",
        12: "invalid_trace",
    }
    assert all(out[n - 1]["line"] == n for n in reasons)
    # Reasons of the output schema: the path and what is wrong there.
    assert out[3]["unrescorable"]["detail"] == "score: missing required field 'novelty_source'"
    assert out[3]["unrescorable"]["scorer_version"] == __version__
    assert out[6]["unrescorable"]["detail"] == "(root): missing required field 'scorer'"
    assert out[6]["unrescorable"]["scorer_version"] is None
    assert "complexity" in out[7]["unrescorable"]["detail"]
    assert orjson.loads(recorded[10])["score"] == out[10]["score"]
    report = summary.to_json()
    assert "confidence" in out[8]["unrescorable"]["detail"]
    assert out[8]["unrescorable"]["scorer_version"] == "0.0.9"
    assert out[11]["unrescorable"]["detail"] == "trace: missing required field 'steps'"
    assert report["records"] == 12
    assert report["rescored"] == 2
    assert report["dead_letters"] == 1
    assert report["unrescorable"] == {
        "dimensions_differ": 1,
        "incomplete": 2,
        "invalid_trace": 2,
        "no_embedder": 1,
        "not_an_output": 3,
    }
    assert [e["at"] for e in report["unrescorable_examples"]] == [f"line {n}" for n in reasons]


@pytest.mark.parametrize(
    ("path", "value", "detail"),
    [
        (("source", "offset"), None, "source: missing required field 'offset'"),
        (("score", "score"), 1.5, "score.score: 1.5 must be at most 1"),
        (("note",), "added", "(root): unexpected field(s) ['note']"),
    ],
    ids=["missing", "out-of-range", "unexpected"],
)
def test_an_output_that_breaks_the_output_schema_is_incomplete_with_path_and_reason(
    recorded: list[bytes], path: tuple[str, ...], value: Any, detail: str
) -> None:
    """Re-scoring checks a recorded output with the output schema: a field only the schema
    asks for (checked field by field, re-scoring saw only the ones it reads) is no longer
    carried into a re-scored output that breaks the schema. Its error comes before the
    trace's (broken too here)."""
    document = orjson.loads(recorded[5])
    *parents, name = path
    parent = document
    for key in parents:
        parent = parent[key]
    if value is None:
        del parent[name]
    else:
        parent[name] = value
    document["trace"]["metadata"]["visibility"] = "public"
    result = Rescorer(BUILTIN).rescore(document)
    assert isinstance(result, NotRescored)
    assert (result.reason, result.detail) == ("incomplete", detail)


@pytest.mark.parametrize("version", [__version__, "0.0.9"], ids=["this-version", "another"])
def test_a_trace_that_breaks_todays_schema_is_not_rescored_whoever_recorded_it(
    recorded: list[bytes], version: str
) -> None:
    """Today's trace rules apply to every recorded output: one naming this version was not
    checked again, so a rule added since it was scored (or an edited output) gave a score to a
    trace the worker now dead-letters. The broken field leaves every dimension as recorded."""
    document = orjson.loads(recorded[5])
    document["trace"]["metadata"]["visibility"] = "public"
    document["scorer"]["version"] = version
    result = Rescorer(BUILTIN).rescore(document)
    assert isinstance(result, NotRescored)
    assert (result.reason, result.scorer_version) == ("invalid_trace", version)
    assert "metadata.visibility" in result.detail


def test_blocks_of_any_size_give_the_same_output_and_line_numbers(recorded: list[bytes]) -> None:
    rescorer = Rescorer(profiles_from_mapping(NEW_PROFILES), 0.6)
    data = jsonl([*recorded * 4, b"oops", *recorded])[:-1]  # no newline at the end
    results = []
    for block_bytes in (1000, 8192, 1 << 20):  # 1000: lines span blocks
        out = io.BytesIO()
        summary = rescore_stream(rescorer, io.BytesIO(data), out, block_bytes=block_bytes)
        results.append((out.getvalue(), summary.to_json()))
    assert results[0] == results[1] == results[2]
    output, report = results[0]
    assert len(output.splitlines()) == 50 * 5 + 1
    assert report["unrescorable_examples"][0]["at"] == "line 201"
    assert orjson.loads(output.splitlines()[200])["line"] == 201


def test_rescored_outputs_follow_the_scored_trace_schema(recorded: list[bytes]) -> None:
    registry = Registry()
    for path in (REPO / "schemas").glob("*.json"):
        schema = orjson.loads(path.read_bytes())
        registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
        registry = registry.with_resource(path.name, Resource.from_contents(schema))
    check = Draft202012Validator(
        orjson.loads((REPO / "schemas" / "scored-trace.schema.json").read_bytes()),
        registry=registry,
    )
    output, _ = rescore_all(Rescorer(BUILTIN, 0.3), recorded)
    for line in output.splitlines():
        errors = list(check.iter_errors(orjson.loads(line)))
        assert not errors, errors[0].message
    wrong = orjson.loads(output.splitlines()[0])
    wrong["scorer"]["rescore_of"] = 1
    assert not check.is_valid(wrong)


def test_published_record_keeps_key_and_headers_with_the_new_verdict(
    recorded: list[bytes],
) -> None:
    headers = (("origin", b"test"), ("kp-decision", b"rejected"), ("kp-score", b"0.5"))
    record = SourceRecord("kp.traces.rejected", 1, 7, 0, b"key", recorded[0], headers)
    result = Rescorer(BUILTIN, 0.0).rescore_value(record.value)
    assert isinstance(result, Rescored)
    routed = rescored_record(record, result)
    assert routed.key == b"key"
    assert routed.decision.value == "accepted"
    assert dict(routed.headers) == {
        "origin": b"test",
        "kp-decision": b"accepted",
        "kp-score": repr(result.breakdown.score).encode(),
        "kp-scorer-version": __version__.encode(),
        "kp-rescore-of": __version__.encode(),
    }


def test_rescore_of_names_the_original_scoring_across_rescores(recorded: list[bytes]) -> None:
    once = Rescorer(BUILTIN, 0.4).rescore_value(recorded[0])
    assert isinstance(once, Rescored)
    again = orjson.loads(once.value)
    again["scorer"]["rescore_of"] = "0.0.9"
    twice = Rescorer(BUILTIN).rescore(again)
    assert isinstance(twice, Rescored)
    assert orjson.loads(twice.value)["scorer"]["rescore_of"] == "0.0.9"
    assert twice.before_score == once.breakdown.score


@pytest.mark.parametrize(
    "args",
    [
        ["rescore", "x.jsonl", "--from-topics"],
        ["rescore", "x.jsonl", "--partitions", "0"],
        ["rescore", "--output-prefix", "what-if"],
    ],
)
def test_cli_rejects_mixed_modes(args: list[str], capsys) -> None:
    assert main(args) == 2
    assert "kp-scorer" in capsys.readouterr().err


def test_cli_rejects_a_bad_domain_threshold(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["rescore", "x.jsonl", "--domain-threshold", "finance=1.5"])
    assert "DOMAIN=THRESHOLD" in capsys.readouterr().err


def test_replay_bins_score_changes_as_rescore_does() -> None:
    """Both commands print the same "score change" table: [low, high) bins, the last one
    closed, "unchanged" around 0."""
    from worker.cli.replay import ReplaySummary
    from worker.core.rescoring import delta_bin, delta_rows

    deltas = [-1.0, -0.2, -0.15, -1e-12, 0.0, 0.01, 0.2, 0.9999, 1.0]
    replay = ReplaySummary()
    for delta in deltas:
        replay.histogram[delta_bin(delta)] += 1
    rows = dict(replay.delta_histogram())
    assert rows["[-1.00, -0.20)"] == 1  # -1.0
    assert rows["[-0.20, -0.10)"] == 2  # -0.2 and -0.15: a bin's low edge is inside it
    assert rows["unchanged"] == 2  # -1e-12 and 0.0
    assert rows["[+0.01, +0.05)"] == 1
    assert rows["[+0.20, +1.00)"] == 3  # 0.2, 0.9999 and 1.0: the last bin is closed
    assert sum(rows.values()) == len(deltas)
    assert [(label, count) for label, _, _, count in delta_rows(replay.histogram)] == list(
        replay.delta_histogram()
    )


def test_domains_are_printed_as_written_not_as_console_markup(
    model_scorer: Scorer, tmp_path: Path, capsys
) -> None:
    """A producer chooses task_domain: one that reads as console markup ("[/]" stopped the
    command with a MarkupError; "[bold]b" lost its brackets) is printed as it is, as is the
    path of the file read."""
    lines = []
    for index, domain in enumerate(["[/]", "[bold]b", "[red]"]):
        trace = orjson.loads(example_lines()[index])
        trace["metadata"]["task_domain"] = domain
        lines.append(orjson.dumps(trace))
    source = tmp_path / "runs[/x].jsonl"  # a path holding a closing tag, "[/x]"
    source.parent.mkdir()
    source.write_bytes(jsonl(score_file(model_scorer, lines)))
    assert main(["rescore", str(source), "--quiet"]) == 0
    err = capsys.readouterr().err
    for shown in ("[/]", "[bold]b", "[red]", f"from {source}:"):
        assert shown in err, err


@pytest.mark.parametrize("command", ["rescore", "report"])
def test_output_over_the_file_read_is_refused(
    command: str, recorded: list[bytes], tmp_path: Path, capsys
) -> None:
    """`rescore scored.jsonl --output scored.jsonl` emptied the file before reading it (and
    exited 0: "rescored 0 of 0 records"); `report` wrote its page over it."""
    source = tmp_path / "scored.jsonl"
    source.write_bytes(jsonl(recorded))
    (tmp_path / "link.jsonl").symlink_to(source)
    assert main([command, str(source), "--output", str(tmp_path / "link.jsonl")]) == 2
    assert "is the FILE being read" in capsys.readouterr().err
    assert source.read_bytes() == jsonl(recorded)
