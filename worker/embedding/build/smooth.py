"""SmoothQuant for the int8 engine: calibrate activation ranges, move outliers into weights.

Activation rounding is large here because a few hidden channels carry values 10-40x the
rest (up to ~30 against an RMS of ~0.7), and one uint8 scale per tensor must cover them.
The ``smooth-*`` recipes divide those channels by a power of two before quantizing and
multiply the matching weight rows by it (exact in fp32), calibrated once at derivation on
built-in sentences. They use uint8 weights: on CPUs without VNNI the faster uint8 x int8
kernel sums pairs of products in saturating int16, and the smoothed activations hit that
limit often enough to cost most of the fidelity gained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from worker.embedding.build import QuantizeError
from worker.embedding.encoder import Encoder, load_tokenizer
from worker.embedding.protocol import EmbedderUnavailable
from worker.embedding.session import SessionFactory
from worker.logs import one_line
from worker.settings import DEFAULT_TOKENIZER_PATH

if TYPE_CHECKING:
    import onnx

# Calibration sentences for the activation ranges. The outlier channels are a property of
# the model, not of the text, so a few varied sentences (prose, code, numbers, several
# languages, very short) find them; these are deliberately unlike the bench corpus.
CALIBRATION_TEXTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Please review the attached invoice and confirm the payment date before Friday.",
    "def parse(value): return int(value.strip()) if value else None",
    "The patient reported mild headaches after starting the new medication last week.",
    "Kubernetes restarted the pod three times because it ran out of memory.",
    "Quarterly revenue grew 12% while operating margin fell to 18.4%.",
    "Customer asks why the refund has not arrived after two weeks.",
    "SELECT id, total FROM orders WHERE created_at >= '2025-01-01' GROUP BY id;",
    "El contrato se renueva automáticamente salvo aviso con treinta días de antelación.",
    "東京の天気は明日は晴れ、最高気温は二十度の予報です。",
    "我们需要在周五之前完成数据迁移并验证结果。",
    "Die Lieferung verzögert sich um zwei Tage wegen eines Streiks.",
    "Check the logs first, then roll back the deployment if the error rate keeps rising.",
    "A short note.",
    "ok",
    "Summarise the main findings of the paper in three bullet points, citing the tables.",
    "The committee postponed the vote because two members could not attend the meeting, "
    "and the chair asked for written comments on the draft budget by the end of the month.",
    "Error 503: upstream connect error or disconnect/reset before headers. Retrying in 5s.",
    "Plan: 1) reproduce the bug, 2) write a failing test, 3) fix it, 4) run the suite.",
    "She painted the old fence a bright shade of green and planted tulips along the path.",
    "Temperature 38.5 C, heart rate 102 bpm, blood pressure 135/85 mmHg.",
    "Le train de 8 h 15 est annulé; le prochain départ est prévu à 9 h 02.",
    "Migrate the nightly batch job from cron to the workflow scheduler with retries.",
    "Why does the sum of the column return NULL when one of the rows has no discount?",
)
CALIBRATION_TOKENS = 256  # the worker's default KP_EMBED_MAX_TOKENS


def calibrate_absmax(
    model: onnx.ModelProto, matmul_names: set[str]
) -> dict[str, npt.NDArray[np.float32]]:
    """Per-channel max |activation| at the inputs of the named MatMuls, over the built-in
    calibration sentences with the packaged tokenizer, run one at a time (the worker's batch
    size) on one thread."""
    import onnx

    try:
        tokenizer, pad_id = load_tokenizer(DEFAULT_TOKENIZER_PATH, CALIBRATION_TOKENS)
    except EmbedderUnavailable as exc:
        raise QuantizeError(f"{exc} (calibration reads it)") from None
    inputs = list(dict.fromkeys(n.input[0] for n in model.graph.node if n.name in matmul_names))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs
    )
    try:
        session = SessionFactory(intra_op_threads=1).open(probe.SerializeToString())
    except Exception as exc:
        raise QuantizeError(f"calibration model does not load: {one_line(exc)}") from None
    encoder = Encoder(tokenizer, pad_id, CALIBRATION_TOKENS, [i.name for i in session.get_inputs()])
    absmax: dict[str, npt.NDArray[np.float32]] = {}
    for text in CALIBRATION_TEXTS:
        encodings = encoder.encode([text])
        feeds = encoder.feeds(encodings, np.array([len(encodings[0])], dtype=np.int64))
        for name, value in zip(inputs, session.run(inputs, feeds), strict=True):
            channel_max = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            absmax[name] = np.maximum(absmax.get(name, channel_max), channel_max)
    return absmax


def smooth(
    model: onnx.ModelProto,
    matmul_names: set[str],
    absmax: dict[str, npt.NDArray[np.float32]],
    alpha: float,
) -> None:
    """SmoothQuant: X W = (X / s) (s W), with s = max|X|^a / max|W|^(1-a) per input channel,
    rounded to a power of two so that both scalings are exact in float32.

    One ``Mul`` by 1/s is inserted per smoothed activation and feeds only the quantized
    MatMuls; other readers of the activation (the residual path) still see it unscaled.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes = [n for n in graph.node if n.name in matmul_names]
    weight_max: dict[str, npt.NDArray[np.float32]] = {}
    for node in nodes:
        rows = np.abs(numpy_helper.to_array(inits[node.input[1]])).max(axis=1)
        weight_max[node.input[0]] = np.maximum(weight_max.get(node.input[0], rows), rows)
    scales = {
        name: np.exp2(
            np.round(
                alpha * np.log2(np.maximum(absmax[name], 1e-5))
                - (1 - alpha) * np.log2(np.maximum(wmax, 1e-5))
            )
        ).astype(np.float32)
        for name, wmax in weight_max.items()
    }
    inserted: dict[str, str] = {}
    scaled_weights: set[str] = set()
    ordered = []
    for node in graph.node:
        if node.name in matmul_names:
            source = node.input[0]
            if source not in inserted:
                inverse = f"{source}_smooth_inverse"
                inserted[source] = f"{source}_smoothed"
                graph.initializer.append(
                    numpy_helper.from_array((1 / scales[source]).astype(np.float32), inverse)
                )
                ordered.append(
                    helper.make_node(
                        "Mul", [source, inverse], [inserted[source]], f"{source}_smooth"
                    )
                )
            if node.input[1] in scaled_weights:
                raise QuantizeError(f"weight {node.input[1]} is shared by two MatMuls")
            scaled_weights.add(node.input[1])
            weight = inits[node.input[1]]
            scaled = numpy_helper.to_array(weight) * scales[source][:, None]
            weight.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), weight.name))
            node.input[0] = inserted[source]
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
