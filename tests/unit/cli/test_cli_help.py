"""What `kp-scorer ... --help` tells an operator, and the flags it describes doing what it says.

- ``kp-scorer worker --help`` lists the faust worker flags the worker passes through, with
  what each does and the defaults kp-scorer gives them (no web server, KP_LOG_LEVEL); those
  flags reach faust's worker as given.
- ``kp-scorer --help`` names every command with its whole description.
- A range has one start and one end: an offset and a time for the same end is a usage error
  naming both flags.
- A section a help points to ("docs/model.md, 'A faster model'") exists; a misspelt command
  is answered with the closest one.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import pytest

from worker.cli.main import kp_scorer, main

from support.paths import REPO


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def help_of(*args: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*args, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_worker_help_lists_the_faust_flags_it_passes_through(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = help_of("worker", capsys=capsys)
    assert "Faust worker flags (passed through)" in shown
    assert "-l, --loglevel [crit|error|warn|info|debug] Logging level to use." in shown
    assert "[default: (KP_LOG_LEVEL)]" in shown
    assert "--with-web / --without-web Enable/disable web server" in shown
    assert "[default: without-web]" in shown
    assert "-p, --web-port" in shown
    assert "--web-host TEXT" in shown
    assert "-h, --help" in shown  # -h is help here, as for every command, not faust's --web-host
    assert "KP_METRICS_PORT" in shown


def test_worker_passes_faust_flags_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.io import app

    started: list[list[str]] = []

    class FaustApp:
        def main(self) -> None:
            started.append(list(sys.argv))

    monkeypatch.setenv("KP_METRICS_PORT", "0")
    monkeypatch.setattr(app, "create_app", lambda *args, **kwargs: FaustApp())
    assert main(["worker", "--web-port", "7000", "-l", "debug"]) == 0
    assert main(["worker"]) == 0
    assert started == [
        ["kp-scorer", "--quiet", "worker", "--without-web", "--web-port", "7000", "-l", "debug"],
        ["kp-scorer", "--quiet", "worker", "--without-web", "--loglevel", "info"],
    ]


def test_help_names_every_command_whole(capsys: pytest.CaptureFixture[str]) -> None:
    shown = "".join(help_of(capsys=capsys).split())  # wrapped anywhere, even at a hyphen
    for name in kp_scorer.list_commands(None):  # type: ignore[arg-type]
        command = kp_scorer.get_command(None, name)  # type: ignore[arg-type]
        assert command is not None
        described = "".join((command.short_help or command.help or "").split())
        assert f"{name}{described}" in shown
    assert "arangeofatopicintoPREFIX.accepted/.rejected/.dead-letter" in shown


@pytest.mark.parametrize(
    ("command", "given"),
    [
        (["replay", "--topic", "t", "--output-prefix", "p"], ["--from-offset", "3"]),
        (["rescore", "--from-topics"], ["--to-offset", "3"]),
        (["report", "--from-topics"], ["--to-offset", "3"]),
    ],
)
def test_a_range_end_is_an_offset_or_a_time(
    command: list[str], given: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    flag = given[0]
    other = flag.replace("offset", "time")
    with pytest.raises(SystemExit) as exited:
        main([*command, *given, other, "2026-01-01T00:00:00Z"])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{other} is not allowed with {flag}" in err


@pytest.mark.parametrize("command", ["replay", "rescore", "report"])
def test_a_partition_named_twice_is_read_once(command: str) -> None:
    """`rescore --from-topics --partitions 0,0` read partition 0 twice and counted (and
    published) each of its outputs twice."""
    found = kp_scorer.get_command(None, command)  # type: ignore[arg-type]
    assert found is not None
    args = ["--topic", "t", "--partitions", "1,0,1,0"]
    args += ["--output-prefix", "p"] if command == "replay" else []
    with found.make_context(command, args) as ctx:
        assert ctx.params["partitions"] == [1, 0]


def range_usage_error(
    command: str,
    flags: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """``command`` reading topic t with the range ``flags``, no broker answering: it must stop
    with a usage error (exit 2) before asking one; its message, on one line."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")  # nothing answers
    args = [command, "--topic" if command == "replay" else "--from-topics"]
    args += ["t", "--output-prefix", "p"] if command == "replay" else []
    with pytest.raises(SystemExit) as exited:
        main([*args, *flags])
    assert exited.value.code == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("command", ["rescore", "report"])
def test_a_domain_threshold_given_twice_is_a_bad_flag(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--domain-threshold code=0.2 --domain-threshold code=0.9` scored with 0.9, where
    KP_DOMAIN_THRESHOLDS refuses a key given twice: which threshold was meant is unknown."""
    flags = ["--domain-threshold", "code=0.2", "--domain-threshold", "x=0.5"]
    with pytest.raises(SystemExit) as exited:
        main([command, str(tmp_path / "absent.jsonl"), *flags, "--domain-threshold", "code=0.9"])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Invalid value for '--domain-threshold': domain 'code' given twice" in err


@pytest.mark.parametrize("command", ["replay", "rescore", "report"])
@pytest.mark.parametrize(
    "given", [",", "", " , ", "-1", "0,-2", " -0 , -3", "1_0", " +1", "0,٣", "²"]
)
def test_a_partition_not_in_plain_digits_is_a_bad_flag_before_the_broker_is_asked(
    command: str, given: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--partitions ,` read every partition, as if the flag were not given; `replay
    --partitions -1` connected to the broker and only then found no partition -1 (with no
    broker: exit 1, "Kafka unreachable"); `1_0` was read as partition 10, ` +1` as 1 and `٣`
    (an Arabic-Indic three) as 3."""
    err = range_usage_error(command, ["--partitions", given], monkeypatch, capsys)
    assert f"Invalid value for '--partitions': expected partitions like 0,1,2: {given!r}" in err


@pytest.mark.parametrize("command", ["replay", "rescore", "report"])
@pytest.mark.parametrize(
    ("flag", "given"), [("--from-offset", "-1"), ("--to-offset", "-5"), ("--from-offset", "1_0")]
)
def test_an_offset_not_in_plain_digits_is_a_bad_flag_before_the_broker_is_asked(
    command: str,
    flag: str,
    given: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`replay --from-offset -1` read the whole topic, as from its beginning, and
    `--to-offset -5` read nothing, both with exit 0; `1_0` was read as offset 10."""
    err = range_usage_error(command, [flag, given], monkeypatch, capsys)
    assert f"Invalid value for '{flag}': expected an offset like 0 or 1000: {given!r}" in err


@pytest.mark.parametrize("given", ["0", "1000", " 7 "])
def test_an_offset_in_plain_digits_is_read(given: str) -> None:
    found = kp_scorer.get_command(None, "report")  # type: ignore[arg-type]
    assert found is not None
    with found.make_context("report", ["--from-topics", "--from-offset", given]) as ctx:
        assert ctx.params["from_offset"] == int(given)


@pytest.mark.parametrize("command", ["replay", "rescore", "report"])
@pytest.mark.parametrize(
    "given",
    [
        ["--from-offset", "2", "--to-offset", "1"],
        ["--to-offset", "1", "--from-offset", "2"],
        ["--from-offset", "5", "--to-offset", "5"],
    ],
)
def test_an_offset_range_with_no_offset_in_it_is_a_usage_error(
    command: str,
    given: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`replay --from-offset 2 --to-offset 1` read nothing and said "replayed 0 records" with
    exit 0, after making its output topics."""
    err = range_usage_error(command, given, monkeypatch, capsys)
    start, end = given[given.index("--from-offset") + 1], given[given.index("--to-offset") + 1]
    assert f"--to-offset {end} is not after --from-offset {start}" in err


def test_an_offset_range_of_one_offset_is_read() -> None:
    found = kp_scorer.get_command(None, "report")  # type: ignore[arg-type]
    assert found is not None
    args = ["--from-topics", "--to-offset", "4", "--from-offset", "3"]
    with found.make_context("report", args) as ctx:
        assert (ctx.params["from_offset"], ctx.params["to_offset"]) == (3, 4)


def help_texts() -> dict[str, str]:
    """The help of every command and subcommand, by its name as typed."""
    texts = {}
    for name in kp_scorer.list_commands(None):  # type: ignore[arg-type]
        command = kp_scorer.get_command(None, name)  # type: ignore[arg-type]
        assert command is not None
        texts[name] = command.help or ""
        if isinstance(command, click.Group):
            for sub, inner in command.commands.items():
                texts[f"{name} {sub}"] = inner.help or ""
    return texts


def test_the_sections_that_help_points_to_exist() -> None:
    """`model build --help` sent a reader to "README, 'A faster model'", a section that
    moved to docs/model.md: every "FILE, 'Heading'" in a help names a heading there."""
    pointers = [
        (command, file, heading)
        for command, text in help_texts().items()
        for file, heading in re.findall(r"(README|[\w/]+\.md), '([^']+)'", " ".join(text.split()))
    ]
    assert ("model build", "docs/model.md", "A faster model") in pointers
    for command, file, heading in pointers:
        path = REPO / ("README.md" if file == "README" else file)
        headings = re.findall(r"^#+ (.+?)\s*$", path.read_text(), flags=re.MULTILINE)
        assert heading in headings, f"{command} --help: {file} has no heading {heading!r}"


@pytest.mark.parametrize(
    ("args", "suggested"),
    [(["scroe"], "score"), (["reprot"], "report"), (["model", "biuld"], "build")],
)
def test_a_misspelt_command_gets_the_closest_one(
    args: list[str], suggested: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"Error: No such command {args[-1]!r}. Did you mean {suggested!r}?" in err


def test_a_command_like_no_other_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["xyzzy"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "No such command 'xyzzy'." in err
    assert "Did you mean" not in err
