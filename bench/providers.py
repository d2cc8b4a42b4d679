"""Embedding speed and fidelity on each onnxruntime execution provider this machine has.

    python bench/providers.py [--texts 1024] [--batch-sizes 1,8,64] [--providers A,B]

The sample traces' texts (examples/traces.jsonl, each made unique) embedded by the packaged
model as the worker loads it (`KP_EMBED_PROVIDERS` = one provider, then CPU behind it), one
batch after another on one thread: texts/s per provider and batch size, and how far each
provider's vectors lie from the CPU's (largest |difference| of a component, smallest cosine).
The CPU's vectors are the reference scores' own; another provider's differ in their last bits,
so it is an operator's choice, like the int8 engine (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import _machine
import numpy as np
import onnxruntime as ort

from worker.core.trace import parse_trace
from worker.embedding import EmbedderConfig, open_embedder
from worker.embedding.protocol import FloatArray

CPU = "CPUExecutionProvider"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces.jsonl"


def sample_texts(count: int) -> list[str]:
    """The sample traces' embedding texts, repeated to ``count``, each made unique."""
    lines = EXAMPLES.read_bytes().splitlines()
    texts = [parse_trace(line).embedding_text() for line in lines if line.strip()]
    return [f"{texts[i % len(texts)]} ({i})" for i in range(count)]


def embed_timed(provider: str, batch_size: int, texts: list[str]) -> tuple[float, FloatArray]:
    """(texts/s after one warm-up pass, the vectors)."""
    providers = (provider,) if provider == CPU else (provider, CPU)
    embedder = open_embedder(EmbedderConfig(batch_size=batch_size, providers=providers))
    try:
        embedder.embed(texts[: batch_size * 4])  # warm-up: kernels, allocations
        started = time.perf_counter()
        vectors = embedder.embed(texts)
        return len(texts) / (time.perf_counter() - started), vectors
    finally:
        embedder.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--providers", help="comma-separated (default: every one available)")
    args = parser.parse_args()
    available = ort.get_available_providers()
    providers = args.providers.split(",") if args.providers else available
    print(_machine.machine_line())
    print(f"onnxruntime {ort.__version__}, device {ort.get_device()}, available: {available}")
    texts = sample_texts(args.texts)
    reference: FloatArray | None = None
    for provider in [CPU] + [p for p in providers if p != CPU]:
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            try:
                rate, vectors = embed_timed(provider, batch_size, texts)
            except Exception as exc:  # a provider this machine lists but cannot run
                print(f"{provider} batch {batch_size}: failed: {str(exc)[:200]}")
                continue
            if reference is None:
                reference = vectors
            worst = float(np.abs(vectors - reference).max())
            cosine = float((vectors * reference).sum(axis=1).min())
            print(
                f"{provider:<26} batch {batch_size:>3}: {rate:8.1f} texts/s; against CPU batch "
                f"1: max |diff| {worst:.2e}, min cosine {cosine:.7f}"
            )


if __name__ == "__main__":
    main()
