"""``kp-scorer check`` and what it guards: an installation reads every Kafka codec.

- The base dependencies (no extras) bring what aiokafka's codec module needs for snappy, lz4
  and zstd, so the production install never stops on a compressed batch.
- ``check`` passes on a working install and prints versions and what it checked as JSON.
- It fails, with one line on stderr and a non-zero exit, for a codec aiokafka cannot read and
  for a model file that does not verify.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import aiokafka.codec
import orjson
import pytest
from packaging.requirements import Requirement

from worker.cli.check import KAFKA_CODECS
from worker.cli.main import EXIT_CHECK_FAILED, main

from support.paths import REPO


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def run_check(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    code = main(["check"])
    out, err = capsys.readouterr()
    return code, orjson.loads(out), err


def base_dependencies() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {Requirement(line).name for line in project["dependencies"]}


def test_the_base_install_brings_every_codec_aiokafka_reads() -> None:
    """aiokafka 0.14 reads snappy, lz4 and zstd through cramjam alone (aiokafka/codec.py):
    without it in the base dependencies, `pip install .` gives a worker that stops on the
    first such batch."""
    assert hasattr(aiokafka.codec, "cramjam"), "aiokafka's codec module no longer uses cramjam"
    assert "cramjam" in base_dependencies()


def test_check_passes_and_reports_what_it_checked(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, err = run_check(capsys)
    assert code == 0, err
    assert err == ""
    assert report["ok"] is True
    assert report["codecs"] == list(KAFKA_CODECS) == ["gzip", "snappy", "lz4", "zstd"]
    assert report["model"]["sha256_checked"] is True
    assert report["model"]["embedding_dimensions"] == 384
    versions = report["versions"]
    wanted = {"kp-scorer", "python", "onnxruntime", "tokenizers", "numpy", "aiokafka"}
    assert wanted | {"faust-streaming"} <= set(versions)
    assert all(versions.values())


def test_check_fails_without_a_codec(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aiokafka.codec, "cramjam", None)  # as in an install without cramjam
    code, report, err = run_check(capsys)
    assert code == EXIT_CHECK_FAILED
    assert report["ok"] is False and report["codecs"] is None
    assert report["model"] is not None, "the other checks still ran"
    assert err.count("\n") == 1, err
    assert "snappy" in err and "cramjam" in err


def test_check_fails_on_a_model_that_does_not_verify(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not the model")
    monkeypatch.setenv("KP_MODEL_PATH", str(model))
    monkeypatch.setenv("KP_MODEL_SHA256", "0" * 64)
    code, report, err = run_check(capsys)
    assert code == EXIT_CHECK_FAILED
    assert report["ok"] is False and report["model"] is None
    assert report["codecs"] == list(KAFKA_CODECS)
    assert err.count("\n") == 1, err
    assert str(model) in err and "sha256" in err


def test_check_fails_on_a_model_that_does_not_load(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An operator's model without KP_MODEL_SHA256 is not hashed, but must still load."""
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not the model")
    monkeypatch.setenv("KP_MODEL_PATH", str(model))
    code, _, err = run_check(capsys)
    assert code == EXIT_CHECK_FAILED
    assert err.count("\n") == 1 and str(model) in err
