"""``kp-scorer check``: can this installation score and read what producers send?

Run where the worker will run (the image build runs it) before it takes traffic: it loads
and verifies the model as the worker does, embeds one text, and round-trips every Kafka
compression codec through aiokafka's own codec functions, since a consumer that cannot read
one batch stops on it at every restart. Prints what it checked and the versions that matter
as JSON on stdout; any failure is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import replace
from importlib import metadata
from typing import Any

import click
import numpy as np

from worker.cli import main as cli
from worker.embedding import DIMENSIONS, EmbedderConfig, EmbedderUnavailable, open_embedder
from worker.embedding.files import resolve_model
from worker.logs import one_line
from worker.settings import Settings
from worker.version import __version__

# Every codec a Kafka record batch may carry (the batch attribute's compression bits).
KAFKA_CODECS = ("gzip", "snappy", "lz4", "zstd")
# Distributions whose versions decide what the worker computes and what it can read.
VERSIONED = ("onnxruntime", "tokenizers", "numpy", "aiokafka", "faust-streaming", "cramjam")
_CHECK_TEXT = "An agent read the failing test, fixed the stale cache entry and reran the suite."
# Repetitive and varied enough that every codec really compresses it.
_CODEC_SAMPLE = b"".join(
    b'{"step": %d, "thought": "kp-scorer codec check"}\n' % i for i in range(400)
)


class CheckFailed(Exception):
    """One thing the installation cannot do; the message says what and why."""


def versions() -> dict[str, str | None]:
    """kp-scorer, Python and each distribution in VERSIONED (None: not installed)."""
    found: dict[str, str | None] = {"kp-scorer": __version__, "python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_codecs() -> list[str]:
    """Round-trip a sample through aiokafka's encoder and decoder of every Kafka codec."""
    from aiokafka import codec

    for name in KAFKA_CODECS:
        if not getattr(codec, f"has_{name}")():
            raise CheckFailed(
                f"aiokafka cannot read {name}-compressed batches (it needs the cramjam "
                "package: pip install cramjam)"
            )
        encode: Callable[[bytes], bytes] = getattr(codec, f"{name}_encode")
        decode: Callable[[bytes], bytes] = getattr(codec, f"{name}_decode")
        try:
            compressed = encode(_CODEC_SAMPLE)
            restored = decode(compressed)
        except Exception as exc:
            raise CheckFailed(f"{name} codec failed: {one_line(exc)}") from exc
        if bytes(restored) != _CODEC_SAMPLE:
            raise CheckFailed(f"{name} codec does not give back what it compressed")
        if len(compressed) >= len(_CODEC_SAMPLE):
            raise CheckFailed(f"{name} codec does not compress")
    return list(KAFKA_CODECS)


def check_model(settings: Settings) -> dict[str, Any]:
    """Load and verify the model exactly as the worker does (required here), embed a text."""
    config = replace(EmbedderConfig.from_settings(settings), concurrency=1)
    try:
        embedder = open_embedder(config)
    except EmbedderUnavailable as exc:
        raise CheckFailed(str(exc)) from None
    try:
        vector = embedder.embed([_CHECK_TEXT])
    finally:
        embedder.close()
    norm = float(np.linalg.norm(vector))
    if vector.shape != (1, DIMENSIONS) or not np.isfinite(vector).all() or abs(norm - 1) > 1e-3:
        raise CheckFailed(
            f"model: embedding a text gave shape {vector.shape} and norm {norm:.4f}, "
            f"expected (1, {DIMENSIONS}) and 1"
        )
    model = resolve_model(config)
    return {
        "id": embedder.model_id,
        "path": str(settings.model_path) if settings.model_path else "packaged",
        "sha256_checked": model.sha256 is not None,  # given, or the sidecar's
        "engine": model.engine,  # "int8" for a built int8 model
        "embedding_dimensions": DIMENSIONS,
    }


def run_check(settings: Settings) -> dict[str, Any]:
    """The report: every check runs, so one report names every problem (``failures``)."""
    report: dict[str, Any] = {"versions": versions(), "compression_type": settings.compression_type}
    failures = []
    for name, check in (("codecs", check_codecs), ("model", lambda: check_model(settings))):
        try:
            report[name] = check()
        except CheckFailed as exc:
            report[name] = None
            failures.append(str(exc))
    missing = [name for name, version in report["versions"].items() if version is None]
    if missing:
        failures.append(f"not installed: {', '.join(missing)}")
    report["ok"] = not failures
    if failures:
        report["failures"] = failures
    return report


@click.command(
    cls=cli.Command,
    help="verify this installation: model loads and embeds, every Kafka codec reads; "
    "versions and results as JSON",
)
def check() -> int:
    report = run_check(cli.checked_settings())
    cli.print_json(report)
    if not report["ok"]:
        cli.say(f"kp-scorer check: FAILED: {'; '.join(report['failures'])}")
        return cli.EXIT_CHECK_FAILED
    return 0
