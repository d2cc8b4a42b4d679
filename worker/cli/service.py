"""``kp-scorer worker`` (the stream worker, through faust's own command line) and
``kp-scorer settings`` (what it would run with)."""

from __future__ import annotations

import copy
import sys
from typing import Any

import click

from worker.cli import main as cli
from worker.memory import keep_large_blocks_mapped
from worker.settings import UNSET_MEANS, Settings, by_variable

# What kp-scorer gives faust's worker before the operator's own flags: shown as their defaults.
FAUST_DEFAULTS: dict[str, dict[str, Any]] = {
    "with_web": {"default": False},
    "loglevel": {"show_default": "KP_LOG_LEVEL"},
}


class FaustWorkerCommand(cli.Command):
    """``worker``: its flags are faust's worker's, passed through; its help lists them as
    faust defines them (so they never drift), with the defaults kp-scorer gives."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        from faust.cli.faust import cli as faust

        command = faust.commands["worker"]
        faust_ctx = click.Context(command, info_name="worker")
        rows = []
        for param in command.get_params(faust_ctx):
            if param.name == "help":
                continue
            shown = copy.copy(param)
            shown.opts = [opt for opt in param.opts if opt not in ctx.help_option_names]
            for name, value in FAUST_DEFAULTS.get(param.name or "", {}).items():
                setattr(shown, name, value)
            record = shown.get_help_record(faust_ctx)
            if record is not None:
                rows.append(record)
        with formatter.section("Faust worker flags (passed through)"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # The worker warns of unknown variables in its own JSON log, once logging is set up.
        return click.Command.invoke(self, ctx)


@click.command(
    cls=FaustWorkerCommand,
    help="Run the stream worker against KAFKA_BOOTSTRAP_SERVERS. Its settings are the "
    "environment's (`kp-scorer settings` shows them); it logs JSON lines on stderr at "
    "KP_LOG_LEVEL (faust's --loglevel and --logfile leave that log as it is) and serves "
    "/metrics, /healthz and /readyz on KP_METRICS_PORT.",
    short_help="run the stream worker against KAFKA_BOOTSTRAP_SERVERS (Faust flags pass through)",
    options_metavar="[OPTIONS] [FAUST WORKER FLAGS]...",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.pass_context
def worker(ctx: click.Context) -> int:
    """Run the stream worker through faust's own command line (its flags pass through)."""
    faust_args = list(ctx.args)
    settings = cli.checked_settings(logs="json")
    cli.warn_unknown_variables(as_log=True)
    keep_large_blocks_mapped()  # before the model is loaded
    from worker.io import http
    from worker.io.app import create_app

    try:
        listener = http.listen(settings.metrics_port) if settings.metrics_port else None
    except http.MetricsPortUnavailable as exc:
        cli.log.error(str(exc), extra={"port": exc.port, "variable": "KP_METRICS_PORT"})
        return cli.EXIT_METRICS_PORT
    app = create_app(settings, metrics_listener=listener)
    if not any(arg.startswith(("--loglevel", "-l")) for arg in faust_args):
        faust_args = ["--loglevel", cli.FAUST_LOG_LEVELS[settings.log_level], *faust_args]
    # --quiet: no startup banner on stdout; the worker writes JSON log lines only.
    sys.argv = ["kp-scorer", "--quiet", "worker", "--without-web", *faust_args]
    app.main()
    return 0


def in_use(settings: Settings) -> dict[str, object]:
    """The settings by variable name, with what is resolved at start-up filled in (the model
    file and hash the worker loads, its model threads): an operator asking "which model, how
    many threads?" gets the answer, not ``None``."""
    from worker.embedding.files import packaged_model

    values = by_variable(settings)
    values["KP_EMBED_CONCURRENCY"] = settings.resolved_embed_concurrency
    packaged = packaged_model() if settings.model_path is None else None
    if packaged is not None:  # none installed: no model is in use
        values["KP_MODEL_PATH"] = packaged.path
        values["KP_MODEL_SHA256"] = settings.model_sha256 or packaged.sha256
    return values


@click.command(
    cls=cli.Command, help="print the effective settings by variable name (secrets masked)"
)
@cli.json_option("one JSON object keyed by variable")
def settings(as_json: bool) -> int:
    # A broken profiles file is a broken configuration: checked as any command's.
    values = in_use(cli.checked_settings(logs=None))
    if as_json:
        cli.print_json(values, default=str)
        return 0
    for name, value in values.items():
        if value is None:
            meaning = UNSET_MEANS.get(name)
            value = f"(unset: {meaning})" if meaning else "(unset)"
        print(f"{name} = {value}")
    sys.stdout.flush()
    return 0
