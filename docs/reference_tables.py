"""The tables of docs/output.md and docs/commands.md that list what the code defines.

The dead-letter kinds come from ``worker.core.errors.ERROR_KINDS`` and the flags from the
``kp-scorer`` click commands, so a page cannot name a kind or a flag that does not exist or
miss one; only each kind's meaning is written here (a flag's is its ``--help`` text).
``python docs/reference_tables.py`` rewrites each table in its page, between its
``<!-- begin NAME -->`` and ``<!-- end NAME -->`` lines, and a test fails when a page's
table differs. (docs/configuration.md is generated whole: docs/configuration_page.py.)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from worker.core.errors import ERROR_KINDS

DOCS = Path(__file__).resolve().parent

# What each dead-letter kind means (Markdown, one line). Links are relative to docs/.
_BELOW = "[below](#input-that-cannot-pass-through-as-it-is)"
KIND_MEANINGS: dict[str, str] = {
    "empty": "no value: empty, or a tombstone (which stays one)",
    "too_large": ("over `KP_MAX_MESSAGE_BYTES`, or more `{` and `[` than `KP_MAX_JSON_CONTAINERS`"),
    "framing": (
        "a Schema Registry frame cut short or holding no document, or a plain value under "
        "`KP_INPUT_FRAMING=confluent`"
    ),
    "invalid_encoding": "not UTF-8 text",
    "invalid_json": "not one JSON document",
    "duplicate_key": "an object holding the same key twice",
    "not_object": "JSON, but not an object",
    "schema": (
        "not a reasoning trace (`schemas/reasoning-trace.schema.json`); the reason starts "
        "with the JSON path"
    ),
    "integer_out_of_range": (f"an integer beyond 64 bits, in any field ({_BELOW})"),
    "unreadable": (f"in a batch the Kafka client cannot read ({_BELOW})"),
    "internal": (
        "a valid trace the scorer failed on, or whose output the Kafka client refused for "
        "another reason than its size"
    ),
    "output_too_large": (
        "a valid trace whose scored output would exceed `KP_MAX_OUTPUT_BYTES`, or that the Kafka "
        "client refuses as too large"
    ),
}


def dead_letter_kinds() -> str:
    """Every ``kp-error-kind``, in the code's order, with its meaning."""
    undocumented = [kind for kind in ERROR_KINDS if kind not in KIND_MEANINGS]
    stale = [kind for kind in KIND_MEANINGS if kind not in ERROR_KINDS]
    if undocumented or stale:
        raise KeyError(f"kinds without a meaning: {undocumented}; meanings of no kind: {stale}")
    rows = [f"| `{kind}` | {KIND_MEANINGS[kind]} |" for kind in ERROR_KINDS]
    return "| `kp-error-kind` | the input record |\n|---|---|\n" + "\n".join(rows) + "\n"


def commands() -> Iterator[tuple[str, click.Command, click.Context]]:
    """``kp-scorer`` and every command and group under it as typed (``kp-scorer score``,
    ``kp-scorer model build``), with a context to read it in; each is loaded as typing its
    name loads it."""
    from worker.cli.main import kp_scorer

    def walk(
        group: click.Group, parent: click.Context, prefix: str
    ) -> Iterator[tuple[str, click.Command, click.Context]]:
        for name in group.list_commands(parent):
            command = group.get_command(parent, name)
            assert command is not None, name
            ctx = click.Context(command, info_name=name, parent=parent, **command.context_settings)
            yield f"{prefix} {name}", command, ctx
            if isinstance(command, click.Group):
                yield from walk(command, ctx, f"{prefix} {name}")

    root = click.Context(kp_scorer, info_name="kp-scorer", **kp_scorer.context_settings)
    yield "kp-scorer", kp_scorer, root
    yield from walk(kp_scorer, root, "kp-scorer")


def options(command: click.Command, ctx: click.Context) -> list[click.Option]:
    """A command's options, ``--help`` apart (every command has it)."""
    return [
        param
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and param.name != "help"
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _value(option: click.Option, ctx: click.Context) -> str:
    if option.is_flag:
        return ""
    metavar = option.make_metavar(ctx) if option.metavar is None else option.metavar
    return f"`{metavar}`"


def _meaning(option: click.Option, ctx: click.Context) -> str:
    """The option's help as ``--help`` shows it: click adds its default, and that it is
    required."""
    record = option.get_help_record(ctx)
    return _cell(" ".join((record[1] if record else "").split()))


def command_flags() -> str:
    """One table per command: each flag, the value it takes and its help text."""
    blocks = []
    for name, command, ctx in commands():
        flags = options(command, ctx)
        if not flags and isinstance(command, click.Group):
            continue  # a group of commands, and no flag before them
        if not flags:
            passed = "; Faust's worker flags pass through (`--help` lists them)"
            worker = name == "kp-scorer worker"
            blocks.append(f"`{name}`: no flag of its own{passed if worker else ''}.")
            continue
        rows = [f"`{name}`:", "", "| flag | value | meaning |", "|---|---|---|"]
        for option in flags:
            names = ", ".join(f"`{opt}`" for opt in [*option.opts, *option.secondary_opts])
            rows.append(f"| {names} | {_value(option, ctx)} | {_meaning(option, ctx)} |")
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks) + "\n"


# Each page's generated tables, by the name in its markers.
TABLES: dict[str, dict[str, Callable[[], str]]] = {
    "output.md": {"dead-letter-kinds": dead_letter_kinds},
    "commands.md": {"command-flags": command_flags},
}


def begin(name: str) -> str:
    return f"<!-- begin {name}: generated by `python docs/reference_tables.py`; edit that -->\n"


def end(name: str) -> str:
    return f"<!-- end {name} -->\n"


def written(page: str, name: str) -> str:
    """The table ``name`` as the page has it (KeyError: the page has no such table)."""
    _, sep, rest = page.partition(begin(name))
    table, sep_end, _rest = rest.partition(end(name))
    if not sep or not sep_end:
        raise KeyError(f"no table {name!r} between {begin(name).strip()} and {end(name).strip()}")
    return table


def with_tables(page: str, tables: dict[str, Callable[[], str]]) -> str:
    """The page with each of its tables generated afresh."""
    for name, generate in tables.items():
        old = written(page, name)
        page = page.replace(begin(name) + old + end(name), begin(name) + generate() + end(name))
    return page


def main() -> int:
    for file, tables in TABLES.items():
        path = DOCS / file
        page = path.read_text()
        new = with_tables(page, tables)
        if new != page:
            path.write_text(new)
            print(f"rewrote docs/{file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
