"""The public Python API (``from worker import ...``), tested as a caller uses it.

Only the public names are imported here: what these tests need is what a caller has.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import orjson
import pytest

import worker
import worker.api
from worker import (
    DeadLetter,
    Decision,
    NotRescored,
    ScoredTrace,
    SettingsError,
    TraceScorer,
    load_settings,
    rescore_output,
)

from support.paths import EXAMPLES, REPO
from support.traces import code_review_example, make_trace

# The public surface. A name added to ``__all__`` must be added here on purpose (it is then
# public, documented and kept); a name that disappears breaks callers.
PUBLIC = [
    "DeadLetter",
    "Decision",
    "Dimensions",
    "NotRescored",
    "Partition",
    "ScoreResult",
    "ScoredTrace",
    "Settings",
    "SettingsError",
    "TraceInput",
    "TraceScorer",
    "load_settings",
    "rescore_output",
]


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


@pytest.fixture(scope="module")
def scorer() -> Iterator[TraceScorer]:
    with TraceScorer(load_settings({})) as scorer:
        assert scorer.embedder_available, scorer.embedder_reason
        yield scorer


@pytest.fixture(scope="module")
def no_model() -> Iterator[TraceScorer]:
    with TraceScorer(load_settings({}), use_embedder=False) as scorer:
        yield scorer


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KP_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args, "--quiet"],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result


BAD_LINES = [
    b'{"@type": "ReasoningTrace", oops',
    orjson.dumps(make_trace(steps=[])),
    b"",
    b'{"a": 1, "a": 2}',
    b"[1, 2]",
]


@pytest.fixture(scope="module")
def scored_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """The sample traces with bad lines among them, and what `kp-scorer score` wrote."""
    path = tmp_path_factory.mktemp("api") / "traces.jsonl"
    lines = EXAMPLES.read_bytes().splitlines()
    lines[3:3] = BAD_LINES
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, cli("score", str(path)).stdout.splitlines()


def test_the_surface_is_the_documented_list() -> None:
    assert sorted(worker.api.__all__) == sorted(PUBLIC)
    assert sorted(worker.__all__) == sorted([*PUBLIC, "__version__"])
    for name in PUBLIC:
        assert getattr(worker, name) is getattr(worker.api, name), name
    with pytest.raises(AttributeError):
        worker.Scorer  # noqa: B018  (an internal name is not reachable from the package)


def test_scores_equal_kp_scorer_score_byte_for_byte(
    scorer: TraceScorer, scored_file: tuple[Path, list[bytes]]
) -> None:
    path, written = scored_file
    lines = path.read_bytes().splitlines()
    batch = scorer.score_many(lines, scorer.partition(str(path)))
    one_by_one_partition = scorer.partition(str(path))
    one_by_one = [scorer.score(line, one_by_one_partition) for line in lines]
    assert batch == one_by_one
    assert len(batch) == len(written) == 55
    kinds = []
    for number, (result, line) in enumerate(zip(batch, written, strict=True), start=1):
        output = orjson.loads(line)
        if isinstance(result, DeadLetter):
            assert output == {
                "line": number,
                "error": {"kind": result.kind, "reason": result.reason},
            }
            kinds.append(result.kind)
            continue
        assert result.value == line  # the exact line `score` writes
        score = output["score"]
        assert (result.score, result.decision, result.threshold) == (
            score["score"],
            score["decision"],
            score["threshold"],
        )
        assert (result.profile, result.novelty_source, list(result.overrides)) == (
            score["profile"],
            score["novelty_source"],
            score["overrides"],
        )
        assert result.dimensions.novelty == score["dimensions"]["novelty"]
        assert result.domain == output["trace"]["metadata"]["task_domain"]
    assert kinds == ["invalid_json", "schema", "empty", "duplicate_key", "not_object"]
    sources = {r.novelty_source for r in batch if isinstance(r, ScoredTrace)}
    assert sources == {"empty_cache", "embedding"}  # novelty was measured, not a stand-in


@pytest.mark.parametrize(
    ("trace", "kind"),
    [
        (b"", "empty"),
        ("not json", "invalid_json"),
        (b'{"x": "\xff"}', "invalid_encoding"),
        ('{"x": "\ud800"}', "invalid_encoding"),
        ({"steps": {1: 2}}, "invalid_json"),
        ({"@type": "ReasoningTrace"}, "schema"),
        (make_trace(steps=[]), "schema"),
        (b'{"a": 1, "a": 2}', "duplicate_key"),
        (b"[]", "not_object"),
        (b"[" * 200_000, "too_large"),  # over KP_MAX_JSON_CONTAINERS
        (b"x" * 1_100_000, "too_large"),  # over KP_MAX_MESSAGE_BYTES
    ],
)
def test_bad_input_is_a_dead_letter_never_an_exception(
    no_model: TraceScorer, trace: Any, kind: str
) -> None:
    partition = no_model.partition()
    result = no_model.score(trace, partition)
    assert isinstance(result, DeadLetter)
    assert (result.kind, result.decision, result.accepted) == (kind, Decision.DEAD_LETTER, False)
    assert result.reason
    # The partition goes on: the next good trace is scored, at the next offset.
    after = no_model.score(code_review_example(), partition)
    assert isinstance(after, ScoredTrace)
    assert orjson.loads(after.value)["source"]["offset"] == 1


@pytest.mark.parametrize(
    ("value", "kind", "named"),
    [
        (math.nan, "invalid_json", "extra.nested[1]: nan"),
        (-math.inf, "invalid_json", "extra.nested[1]: -inf"),
        (2**70, "integer_out_of_range", "extra.nested[1]: integer 1180591620717411303424"),
    ],
)
def test_a_mapping_with_a_number_json_cannot_carry_is_a_dead_letter_by_path(
    no_model: TraceScorer, value: float, kind: str, named: str
) -> None:
    """NaN and the infinities were written as null, and the trace scored with a value it never
    held (as bytes they are invalid_json); an integer beyond 64 bits gets the worker's kind."""
    trace = {**code_review_example(), "extra": {"nested": [1, value]}}
    result = no_model.score(trace, no_model.partition())
    assert isinstance(result, DeadLetter)
    assert result.kind == kind
    assert named in result.reason
    scored = no_model.score({**code_review_example(), "extra": None}, no_model.partition())
    assert isinstance(scored, ScoredTrace)  # a null of the caller's own is data


@pytest.mark.parametrize(
    ("event_time", "error"),
    [(1_735_000_000_000.5, TypeError), ("1735000000000", TypeError), (2**63, ValueError)],
)
def test_an_event_time_that_no_record_can_have_is_refused_before_scoring(
    no_model: TraceScorer, event_time: Any, error: type[Exception]
) -> None:
    """A float (``time.time() * 1000``) was published as the source timestamp, which the
    scored-trace schema says is an integer; 2**63 stopped a scorer with a model. Nothing of
    the batch is scored, and its offsets are not used up."""
    partition = no_model.partition()
    trace = code_review_example()
    with pytest.raises(error, match="event_time_ms"):
        no_model.score_many([trace, trace], partition, event_times_ms=[0, event_time])
    result = no_model.score(trace, partition, event_time_ms=numpy.int64(7))
    assert isinstance(result, ScoredTrace)
    assert orjson.loads(result.value)["source"] == {
        "topic": "api", "partition": 0, "offset": 0, "timestamp": 7
    }  # fmt: skip


@pytest.mark.parametrize(
    ("number", "error"),
    [
        (-1, ValueError),
        (2**31, ValueError),
        (2**64, ValueError),
        (1.0, TypeError),
        ("0", TypeError),
    ],
)
def test_a_partition_number_no_kafka_partition_has_is_refused(
    no_model: TraceScorer, number: Any, error: type[Exception]
) -> None:
    """-1 gave outputs a source partition the scored-trace schema forbids; 2**64 could not
    be written, and every trace of the partition was dead-lettered as internal."""
    with pytest.raises(error, match="number"):
        no_model.partition(number=number)
    for number, written in ((2**31 - 1, 2**31 - 1), (numpy.int32(3), 3), (True, 1)):
        result = no_model.score(code_review_example(), no_model.partition(number=number))
        assert isinstance(result, ScoredTrace)
        assert orjson.loads(result.value)["source"]["partition"] == written


def test_a_trace_at_the_last_leap_second_is_scored_not_raised(no_model: TraceScorer) -> None:
    """RFC 3339 (and the schema) admit 9999-12-31T23:59:60Z; the second after it is past what
    datetime holds, and reading the event time raised OverflowError."""
    trace = make_trace(metadata={"created_at": "9999-12-31T23:59:60Z"})
    result = no_model.score(trace, no_model.partition())
    assert isinstance(result, ScoredTrace)
    assert orjson.loads(result.value)["source"]["timestamp"] == 253_402_300_800_000


def test_a_trace_in_year_0000_is_scored_at_its_time(no_model: TraceScorer) -> None:
    """RFC 3339 (and the schema, so the worker too) admit year 0000, which datetime cannot
    hold: its event time was read as 0, 1970, as if the trace had none."""
    trace = make_trace(metadata={"created_at": "0000-03-01T00:00:00Z"})
    result = no_model.score(trace, no_model.partition())
    assert isinstance(result, ScoredTrace)
    assert orjson.loads(result.value)["source"]["timestamp"] == -62_162_035_200_000


def test_a_required_model_that_cannot_load_is_a_settings_error(tmp_path: Path) -> None:
    """It raised the loader's own exception, a name the public API does not have."""
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not a model")
    settings = load_settings({"KP_MODEL_PATH": str(model), "KP_EMBEDDER_REQUIRED": "true"})
    with pytest.raises(SettingsError, match=r"KP_EMBEDDER_REQUIRED.*cannot be loaded"):
        TraceScorer(settings)
    with TraceScorer(load_settings({"KP_MODEL_PATH": str(model)})) as optional:
        assert not optional.embedder_available  # not required: novelty 0.5, and the reason
        assert "cannot be loaded" in (optional.embedder_reason or "")


def test_not_a_trace_type_is_a_type_error(no_model: TraceScorer) -> None:
    with pytest.raises(TypeError, match="bytes, str or a mapping"):
        no_model.score(42, no_model.partition())  # type: ignore[arg-type]


def test_partitions_do_not_share_novelty(scorer: TraceScorer) -> None:
    trace = code_review_example()
    first, second = scorer.partition(), scorer.partition()
    seen = [scorer.score(trace, first), scorer.score(trace, first), scorer.score(trace, second)]
    assert all(isinstance(r, ScoredTrace) for r in seen)
    sources = [(r.novelty_source, r.dimensions.novelty) for r in seen]  # type: ignore[union-attr]
    assert sources == [("empty_cache", 0.5), ("embedding", 0.0), ("empty_cache", 0.5)]
    assert (len(first), len(second)) == (2, 1)
    with TraceScorer(load_settings({}), use_embedder=False) as other, pytest.raises(ValueError):
        other.score(trace, first)


def test_a_partition_reads_values_as_the_input_framing_says() -> None:
    framed = b"\x00\x00\x00\x00\x07" + orjson.dumps(code_review_example())
    with TraceScorer(load_settings({"KP_INPUT_FRAMING": "json"}), use_embedder=False) as scorer:
        result = scorer.score(framed, scorer.partition())
    assert isinstance(result, DeadLetter) and result.kind == "invalid_json"


def test_event_time_is_what_the_ttl_measures(no_model: TraceScorer) -> None:
    with TraceScorer(load_settings({"KP_CACHE_TTL_SECONDS": "1"})) as scorer:
        partition = scorer.partition()
        trace = code_review_example()
        results = scorer.score_many([trace, trace, trace], partition, event_times_ms=[0, 900, 5000])
    sources = [r.novelty_source for r in results if isinstance(r, ScoredTrace)]
    assert sources == ["empty_cache", "embedding", "empty_cache"]  # 4.1 s later: expired


def test_rescoring_equals_kp_scorer_rescore(scored_file: tuple[Path, list[bytes]]) -> None:
    path, written = scored_file
    outputs = path.with_name("scored.jsonl")
    outputs.write_bytes(b"\n".join(written) + b"\n")
    args = ("--threshold", "0.6", "--domain-threshold", "finance=0.9")
    rescored = cli("rescore", str(outputs), *args).stdout.splitlines()
    settings = load_settings({})
    for line, expected in zip(written, rescored, strict=True):
        result = rescore_output(
            line, settings=settings, threshold=0.6, domain_thresholds={"finance": 0.9}
        )
        if orjson.loads(line).keys() == {"line", "error"}:  # a dead letter: passed through
            assert isinstance(result, NotRescored)
            assert expected == line
            continue
        assert isinstance(result, ScoredTrace)
        assert result.value == expected
        assert result.threshold == (0.9 if result.domain == "finance" else 0.6)
        assert (
            rescore_output(
                orjson.loads(line),
                settings=settings,
                threshold=0.6,
                domain_thresholds={"finance": 0.9},
            )
            == result
        )
    not_output = rescore_output(b"not json")
    assert isinstance(not_output, NotRescored)
    assert not_output.reason == "not_an_output"
    with pytest.raises(SettingsError, match="threshold"):
        rescore_output(written[0], threshold=1.5)


def test_settings_from_a_mapping_validate_as_the_worker_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = {"KP_ACCEPT_THRESHOLD": "2", "KP_DOMAIN_THRESHOLDS": "not json"}
    for name, value in bad.items():
        with pytest.raises(SettingsError) as from_mapping:
            load_settings({name: value})
        monkeypatch.setenv(name, value)
        with pytest.raises(SettingsError) as from_environment:
            load_settings()
        monkeypatch.delenv(name)
        assert str(from_mapping.value) == str(from_environment.value)
        assert name in str(from_mapping.value)
    # The worker's own message, as `kp-scorer settings` prints it.
    env = {**os.environ, "KP_ACCEPT_THRESHOLD": "2"}
    shown = subprocess.run(
        [sys.executable, "-m", "worker.cli", "settings"],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    with pytest.raises(SettingsError) as caught:
        load_settings({"KP_ACCEPT_THRESHOLD": "2"})
    assert shown.returncode == 2
    assert str(caught.value).splitlines()[-1].strip() in shown.stderr.decode()

    monkeypatch.setenv("KP_ACCEPT_THRESHOLD", "0.3")
    assert load_settings().accept_threshold == 0.3
    assert load_settings({}).accept_threshold == 0.75  # a mapping is all that is read
    assert load_settings({"kp_accept_threshold": "0.4"}).accept_threshold == 0.4
    assert load_settings({}, accept_threshold=0.6).accept_threshold == 0.6
    with pytest.raises(SettingsError, match="KP_EMBED_ENGINE"):
        load_settings({"KP_EMBED_ENGINE": "int8"})

    profiles = tmp_path / "profiles.json"
    profiles.write_text('{"finance": {"complexity": 1}}')
    with pytest.raises(SettingsError, match="KP_PROFILES_FILE"):
        TraceScorer(load_settings({"KP_PROFILES_FILE": str(profiles)}), use_embedder=False)


def _api_example() -> tuple[str, str]:
    section = (REPO / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    code = next(text for lang, text in blocks if lang == "python")
    printed = next(text for lang, text in blocks if lang == "text")
    return code, printed


def test_the_api_example_prints_what_the_page_says(monkeypatch: pytest.MonkeyPatch) -> None:
    code, printed = _api_example()
    monkeypatch.chdir(REPO)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/python-api.md", "exec"), {"__name__": "example"})
    assert out.getvalue() == printed


def test_the_api_example_type_checks_strictly(tmp_path: Path) -> None:
    """The API is typed for its callers: the example passes ``mypy --strict``."""
    code, _ = _api_example()
    example = tmp_path / "example.py"
    example.write_text(code)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            "--config-file",
            str(REPO / "pyproject.toml"),
            str(example),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_says_it_is_typed() -> None:
    assert (Path(worker.__file__).parent / "py.typed").is_file()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["worker"]


def test_importing_the_api_loads_no_command_line() -> None:
    """The API sits below the command line: a fresh interpreter importing it loads neither
    click nor rich, nor any module of ``worker.cli``."""
    code = "import json, sys, worker.api; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    loaded = orjson.loads(result.stdout)
    assert "worker.api" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("click", "rich") or "worker.cli" in m] == []
