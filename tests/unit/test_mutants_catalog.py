"""The table of promises keeps up with the code: every mutant still applies exactly once and
names tests that exist, and tests/mutants/PROMISES.md is the table as generated. (Whether each
mutant is killed is the mutant runner's job: ``python -m tests.mutants``, a step of .ci/run.)"""

from __future__ import annotations

from mutants.catalog import MUTANTS, Mutant
from mutants.runner import ROOT, markdown, problems


def test_every_mutant_applies_and_names_existing_tests() -> None:
    assert problems() == []


def test_a_mutant_whose_snippet_moved_is_reported_not_skipped() -> None:
    moved = Mutant("moved", "a promise", "worker/core/output.py", "no such code", "x", (), "")
    assert problems(mutants=[moved]) == [
        "mutant moved no longer applies: snippet not found in worker/core/output.py"
    ]


def test_every_mutant_changes_its_file_and_is_guarded() -> None:
    for mutant in MUTANTS:
        assert mutant.old != mutant.new and mutant.tests and mutant.promise, mutant.name


def test_promises_md_is_the_generated_table() -> None:
    assert (ROOT / "tests/mutants/PROMISES.md").read_text() == markdown(), (
        "regenerate it: python -m tests.mutants --markdown > tests/mutants/PROMISES.md"
    )
