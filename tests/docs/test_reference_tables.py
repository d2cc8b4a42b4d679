"""The docs' lists of what the code defines agree with the code.

docs/output.md's dead-letter kinds and docs/commands.md's flags are tables generated from the
code (docs/reference_tables.py); the flags named anywhere else in docs/commands.md, and in a
`kp-scorer ...` command line on any page, are flags of that command. (The dead-letter schema's
kinds: tests/unit/core/test_output_schemas.py; the metrics of docs/operations.md:
tests/unit/test_deploy.py; the configuration page: test_configuration_page.py.)
"""

from __future__ import annotations

import importlib.util
import re

import click
import pytest

from worker.cli.main import Group
from worker.core.errors import ERROR_KINDS

from support.paths import REPO

DOCS = REPO / "docs"
_spec = importlib.util.spec_from_file_location("reference_tables", DOCS / "reference_tables.py")
assert _spec is not None and _spec.loader is not None
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

GENERATED = [(page, name) for page, names in tables.TABLES.items() for name in names]
# A long flag as prose writes it (`--from-topics`, --from-time=...).
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# A flag in a command line: long, or short (`-o`).
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)")


def commands() -> dict[str, tuple[click.Command, click.Context]]:
    return {name: (command, ctx) for name, command, ctx in tables.commands()}


def flags_of(command: click.Command, ctx: click.Context) -> set[str]:
    """Every flag a command takes, --help included."""
    return {
        opt
        for param in command.get_params(ctx)
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
    }


@pytest.mark.parametrize(("page", "name"), GENERATED)
def test_the_table_is_the_generated_text(page: str, name: str) -> None:
    assert tables.written((DOCS / page).read_text(), name) == tables.TABLES[page][name](), (
        f"docs/{page}'s {name} table differs from the code: regenerate it with "
        "`python docs/reference_tables.py`"
    )


def test_the_kinds_table_lists_every_kind_in_the_codes_order() -> None:
    table = tables.written((DOCS / "output.md").read_text(), "dead-letter-kinds")
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE)
    assert listed == list(ERROR_KINDS)


def test_a_kind_without_a_meaning_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    meanings = dict(tables.KIND_MEANINGS)
    del meanings["framing"]
    monkeypatch.setattr(tables, "KIND_MEANINGS", meanings)
    with pytest.raises(KeyError, match="framing"):
        tables.dead_letter_kinds()
    monkeypatch.setattr(tables, "KIND_MEANINGS", {**tables.KIND_MEANINGS, "gone": "x"})
    with pytest.raises(KeyError, match="gone"):
        tables.dead_letter_kinds()


def test_the_walk_finds_every_command_including_groups_and_lazy_ones() -> None:
    found = commands()
    assert {f"kp-scorer {name}" for name in Group.modules} <= set(found)
    assert "kp-scorer model build" in found


def test_every_flag_of_every_command_is_on_the_commands_page() -> None:
    page = (DOCS / "commands.md").read_text()
    missing = sorted(
        f"{name} {opt}"
        for name, (command, ctx) in commands().items()
        for option in tables.options(command, ctx)
        for opt in (*option.opts, *option.secondary_opts)
        if f"`{opt}`" not in page
    )
    assert not missing, f"docs/commands.md does not name: {missing}"


def test_the_commands_page_names_no_flag_that_does_not_exist() -> None:
    page = (DOCS / "commands.md").read_text()
    every = set().union(*(flags_of(command, ctx) for command, ctx in commands().values()))
    unknown = sorted(set(LONG_FLAG.findall(page)) - every)
    assert not unknown, f"docs/commands.md names flags no kp-scorer command has: {unknown}"


def command_lines() -> list[tuple[str, str]]:
    """Each `kp-scorer ...` command line on a docs page (code spans and shell blocks), less
    its comment: (page, line)."""
    found = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        spans = re.findall(r"`(kp-scorer [^`]+)`", text)
        blocks = re.findall(r"^```(?:bash|sh|console)?\n(.*?)^```", text, re.M | re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        lines = [line.lstrip("$ ") for line in lines]
        for line in [*spans, *(line for line in lines if line.startswith("kp-scorer "))]:
            found.append((path.name, line.split(" #", 1)[0]))
    return found


def test_every_command_line_in_the_docs_uses_flags_of_its_command() -> None:
    from faust.cli.faust import cli as faust

    found = commands()
    faust_worker = faust.commands["worker"]
    passed_through = flags_of(faust_worker, click.Context(faust_worker))
    wrong = []
    lines = command_lines()
    assert len(lines) > 20, "the docs' command lines are found"
    root_flags = flags_of(*found["kp-scorer"])
    for page, line in lines:
        line = line.split(" | ", 1)[0]  # what is piped to is another command
        words = line.split()
        name = next(
            n for n in (" ".join(words[:3]), " ".join(words[:2]), "kp-scorer") if n in found
        )
        if name == "kp-scorer" and re.fullmatch(r"[a-z][a-z-]*", words[1] if words[1:] else "-"):
            wrong.append(f"{page}: {line!r}: no command {words[1]!r}")
            continue
        known = flags_of(*found[name]) | (root_flags if name == "kp-scorer" else set())
        known |= passed_through if name == "kp-scorer worker" else set()
        for flag in FLAG.findall(line[len(name) :]):
            if flag not in known:
                wrong.append(f"{page}: {line!r}: {name} has no {flag}")
    assert not wrong, wrong
