"""``kp-scorer model build``: the model file the worker loads, built once, offline.

The build (the ``kp_model_build`` package, beside the worker, not in it) is imported only
when a model is built: it loads onnxruntime and onnx, which the other commands' start-up
should not pay for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from worker.cli import main as cli

# The recipes of kp_model_build.int8.RECIPES (tests check the two agree).
RECIPE_HELP = {
    "dynamic-per-channel": "every weight MatMul in int8",
}


@click.group(cls=cli.SuggestingGroup, help="build the model file the worker loads")
def model() -> None:
    """``model build [--int8 RECIPE] [--from MODEL] -o FILE``."""


@model.command(
    cls=cli.Command,
    short_help="write a ready model file and its FILE.json sidecar (what it was built from); "
    "point KP_MODEL_PATH at FILE",
    help="Build the model the worker loads as it is. Without --int8: the packaged "
    "model, streamlined (the same vectors). With --int8: its integer-arithmetic engine "
    "(faster, slightly different novelty: docs/model.md, 'A faster model'); the worker "
    "loads such a model only with KP_EMBED_BATCH_SIZE=1.",
)
@click.option(
    "--int8",
    metavar="RECIPE",
    type=click.Choice(sorted(RECIPE_HELP)),
    help="derive the int8 engine by this recipe: "
    + "; ".join(f"{name} ({summary})" for name, summary in RECIPE_HELP.items()),
)
@click.option(
    "--from",
    "source",
    type=cli.FILE_PATH,
    metavar="MODEL",
    help="the ONNX model to build from (default: the packaged model)",
)
@click.option(
    "-o",
    "--output",
    type=cli.FILE_PATH,
    required=True,
    metavar="FILE",
    help="the model file to write; its sidecar is FILE.json",
)
def build(int8: str | None, source: Path | None, output: Path) -> int:
    """Build, then print the sidecar's record on stdout; a failure is one line and exit 1."""
    from kp_model_build import QuantizeError
    from kp_model_build.model_file import build_model

    try:
        built = build_model(output, recipe=int8, source=source)
    except QuantizeError as exc:
        print(f"kp-scorer model build: {exc}", file=sys.stderr)
        return 1
    cli.print_json(built.record)
    note = f"wrote {built.path} and {built.sidecar}; set KP_MODEL_PATH={built.path}"
    print(note, file=sys.stderr)
    return 0
