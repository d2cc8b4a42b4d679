"""The mutant runner: apply each promise's mutant to a scratch copy and run its guards there.

Exit status 0 only when the unmutated copy passes every mapped test and every mutant applies
and is killed. ``--check`` only checks that every mutant still applies (no tests run);
``--markdown`` prints the table of promises (``tests/mutants/PROMISES.md``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .catalog import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
# What a scratch copy holds: the package, its schemas, the tests and pytest's configuration.
COPIED = ("worker", "schemas", "tests", "pyproject.toml")
# A mutant that makes a mapped test hang is killed by this timeout (pytest-timeout), not
# waited on.
TEST_TIMEOUT_SECONDS = 120
# pytest -rfE: "FAILED <node id> - <message>"; a parametrized id may hold spaces.
# (captured log lines also start with "ERROR": a node id starts with the test's path).
FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (tests/\S+?\.py(?:::.*?)?)(?: - .*)?$", re.MULTILINE)


class NoLongerApplies(Exception):
    """A mutant's snippet is not in its file exactly once: the catalog must follow the code."""


@dataclass
class Outcome:
    name: str
    promise: str
    verdict: str  # killed, SURVIVED, ERROR
    killer: str
    seconds: float
    output: str = ""


def problems(root: Path = ROOT, mutants: Iterable[Mutant] = MUTANTS) -> list[str]:
    """Why any mutant cannot be applied to ``root`` or names a test that is not there."""
    found = []
    names: set[str] = set()
    for mutant in mutants:
        if mutant.name in names:
            found.append(f"mutant {mutant.name} is defined twice")
        names.add(mutant.name)
        path = root / mutant.path
        count = path.read_text().count(mutant.old) if path.is_file() else 0
        if count != 1:
            where = "snippet not found" if count == 0 else f"snippet found {count} times"
            found.append(f"mutant {mutant.name} no longer applies: {where} in {mutant.path}")
        for test in mutant.tests:
            file, _, function = test.partition("::")
            source = root / file
            if not source.is_file():
                found.append(f"mutant {mutant.name}: no test file {file}")
            elif function and f"def {function}(" not in source.read_text():
                found.append(f"mutant {mutant.name}: no test {function} in {file}")
    return found


def apply(mutant: Mutant, copy: Path) -> None:
    path = copy / mutant.path
    source = path.read_text()
    if source.count(mutant.old) != 1:
        raise NoLongerApplies(f"mutant {mutant.name} no longer applies: snippet not found")
    path.write_text(source.replace(mutant.old, mutant.new))


def scratch_copy(destination: Path) -> Path:
    """The files a test run needs (no .venv, no .git), symlinks kept as links."""
    destination.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source,
                destination / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"),
            )
        else:
            shutil.copy2(source, destination / name)
    return destination


def environment(copy: Path) -> dict[str, str]:
    """The copy's package first on the path, ahead of the editable install of the checkout;
    the worker processes that broker tests start inherit it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(copy), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    return env


def imported_from(copy: Path) -> Path:
    """Where ``import worker`` resolves in the copy's environment."""
    answer = subprocess.run(
        [sys.executable, "-c", "import worker; print(worker.__file__)"],
        cwd=copy,
        env=environment(copy),
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(answer.stdout.strip()).resolve()


def run_tests(copy: Path, tests: Sequence[str]) -> tuple[int, str, float]:
    """pytest in this process's interpreter, in the copy, stopping at the first failure."""
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "0",
            "-x",
            "-q",
            "-rfE",
            "--timeout",
            str(TEST_TIMEOUT_SECONDS),
            *tests,
        ],
        cwd=copy,
        env=environment(copy),
        capture_output=True,
        text=True,
    )
    return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def judge(name: str, promise: str, returncode: int, output: str, seconds: float) -> Outcome:
    """pytest's exit status 1 is a kill; 0 a survival; anything else (no tests collected, a
    usage error, an interruption) is an error of the table, never counted as a kill."""
    if returncode == 1:
        failed = FAILED_LINE.search(output)
        killer = failed.group(1) if failed else "(failed)"
        return Outcome(name, promise, "killed", killer, seconds)
    if returncode == 0:
        return Outcome(name, promise, "SURVIVED", "-", seconds, output)
    return Outcome(name, promise, "ERROR", f"pytest exit {returncode}", seconds, output)


def run_mutant(mutant: Mutant, scratch: Path) -> Outcome:
    copy = scratch_copy(scratch / mutant.name)
    try:
        apply(mutant, copy)
    except NoLongerApplies as exc:
        return Outcome(mutant.name, mutant.promise, "ERROR", str(exc), 0.0)
    try:
        return judge(mutant.name, mutant.promise, *run_tests(copy, mutant.tests))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def run_baseline(mutants: Sequence[Mutant], scratch: Path) -> Outcome:
    """Every mapped test file on the unmutated copy: a kill means something only if these pass."""
    copy = scratch_copy(scratch / "unmutated")
    files = list(dict.fromkeys(test.partition("::")[0] for m in mutants for test in m.tests))
    outcome = judge("(unmutated)", "the guards pass on the unmutated code", *run_tests(copy, files))
    if outcome.verdict == "SURVIVED":  # all passed: what a baseline should do
        outcome.verdict, outcome.killer, outcome.output = "passed", f"{len(files)} files", ""
    elif outcome.verdict == "killed":
        outcome.verdict = "FAILED"
    return outcome


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def markdown() -> str:
    """The table of promises, as kept in tests/mutants/PROMISES.md."""
    lines = [
        "# Promises and their guards",
        "",
        "Generated by `python -m tests.mutants --markdown` from `tests/mutants/catalog.py`;",
        "`python -m tests.mutants` (a step of `.ci/run`) applies each mutant to a scratch copy",
        "and fails unless the listed tests kill it. Moving guarded code? Move the mutant's",
        "snippet with it (`python -m tests.mutants --check` names those that no longer apply).",
        "",
        "| promise | mutant | what it breaks | where | guarded by |",
        "|---|---|---|---|---|",
    ]
    for m in MUTANTS:
        guards = "<br>".join(f"`{test}`" for test in m.tests)
        lines.append(f"| {m.promise} | `{m.name}` | {m.why} | `{m.path}` | {guards} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--only", nargs="+", metavar="MUTANT", help="run these mutants only")
    parser.add_argument("--check", action="store_true", help="check the catalog; run nothing")
    parser.add_argument("--markdown", action="store_true", help="print PROMISES.md")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(), end="")
        return 0
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    if found or args.check:
        return 1 if found else 0
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.only and len(mutants) != len(set(args.only)):
        print(f"unknown mutant in {args.only}", file=sys.stderr)
        return 2

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kp-mutants-") as directory:
        scratch = Path(directory)
        probe = scratch_copy(scratch / "probe")
        where = imported_from(probe)
        if not where.is_relative_to(probe.resolve()):
            print(f"the scratch copy imports worker from {where}, not the copy", file=sys.stderr)
            return 1
        shutil.rmtree(probe)
        # The slowest first (broker tests), so the two lanes finish together.
        ordered = sorted(mutants, key=lambda m: not any("/chaos/" in t for t in m.tests))
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            baseline = pool.submit(run_baseline, mutants, scratch)
            runs = [pool.submit(run_mutant, mutant, scratch) for mutant in ordered]
            outcomes = {outcome.name: outcome for outcome in (r.result() for r in runs)}
            base = baseline.result()
    total = time.monotonic() - started

    rows = [("promise", "mutant", "killed by", "seconds")]
    rows += [
        (o.promise, o.name, o.killer if o.verdict == "killed" else o.verdict, f"{o.seconds:.1f}")
        for o in (outcomes[m.name] for m in mutants)
    ]
    rows.append((base.promise, base.name, f"{base.verdict} ({base.killer})", f"{base.seconds:.1f}"))
    print(table(rows))
    bad = [o for o in outcomes.values() if o.verdict != "killed"]
    if base.verdict != "passed":
        bad.append(base)
    for outcome in bad:
        print(f"\n--- {outcome.name}: {outcome.verdict} {outcome.killer}", file=sys.stderr)
        print(outcome.output[-4000:], file=sys.stderr)
    killed = len(outcomes) - sum(o.verdict != "killed" for o in outcomes.values())
    print(
        f"\n{killed} of {len(outcomes)} mutants killed; unmutated copy {base.verdict}; "
        f"{total:.1f} s in all with {args.jobs} jobs"
    )
    return 1 if bad else 0
