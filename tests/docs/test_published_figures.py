"""Each published figure has one source: `bench/RESULTS.md` holds the measured figures, each
with its command, and the pages cite it rather than copying numbers that then drift apart.

- The int8 engine's speed-up is quoted on one page, docs/model.md ("A faster model"), as
  RESULTS.md gives it; every other page and manifest comment points there.
- A throughput figure (N traces/s, N texts/s) is quoted in one sentence, docs/operations.md's
  "One worker with 2 CPUs scores L-H traces/s", which is RESULTS.md's backlog figure rounded to
  whole traces; the manifests reason from that figure
  (tests/unit/cli/test_first_contact.py holds them to it).
- A citation of RESULTS.md names a section it has ("Current figures") and a row of its tables
  it has (row "live worker RSS").
- The layouts the README and docs/development.md give name files that exist, and name every
  module of worker/ and kp_model_build/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import REPO

RESULTS = REPO / "bench" / "RESULTS.md"
INT8_PAGE = REPO / "docs" / "model.md"
THROUGHPUT_PAGE = REPO / "docs" / "operations.md"
THROUGHPUT = re.compile(r"(?<![\w.,])(\d[\d,.]*(?:-\d[\d,.]*)?)\s*(?:traces|texts)/s")
# A speed-up factor: 1.45x, ~1.6x, 1.85-1.87x, x0.917.
FACTOR = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?x\b|\bx\d+\.\d+")


def published() -> Iterator[Path]:
    """Every file that quotes figures to a reader: the README, the documentation pages and the
    deployment files (their comments)."""
    yield REPO / "README.md"
    yield from sorted((REPO / "docs").glob("*.md"))
    yield from sorted(
        path for path in (REPO / "deploy").rglob("*") if path.suffix in {".yaml", ".yml"}
    )
    yield REPO / "Dockerfile"
    yield REPO / "docker-compose.yml"


def prose(path: Path) -> str:
    """The file's text as a reader sees it: comment markers gone, code fences dropped."""
    text = path.read_text()
    if path.suffix != ".md":
        text = re.sub(r"^\s*#", "", text, flags=re.M)
    return re.sub(r"```.*?```", "", text, flags=re.S)


def sentences(text: str) -> list[str]:
    """Sentences of paragraphs and list items, each on one line."""
    parts = re.split(r"\n\s*\n|\n(?=\s*- )", text)
    return [
        sentence
        for part in parts
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", " ".join(part.split()))
    ]


def name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_int8_speed_up_is_quoted_on_one_page() -> None:
    quoted = {
        (name(path), factor)
        for path in published()
        for sentence in sentences(prose(path))
        if "int8" in sentence.lower()
        for factor in FACTOR.findall(sentence)
    }
    elsewhere = sorted(found for found in quoted if found[0] != name(INT8_PAGE))
    assert not elsewhere, (
        f"the int8 engine's speed is quoted in {elsewhere}: cite docs/model.md, 'A faster "
        "model', or bench/RESULTS.md instead"
    )
    on_the_page = {factor for _, factor in quoted}
    assert on_the_page, "docs/model.md quotes the int8 engine's speed"
    results = RESULTS.read_text()
    unmeasured = sorted(factor for factor in on_the_page if factor not in results)
    assert not unmeasured, f"docs/model.md quotes factors bench/RESULTS.md does not: {unmeasured}"


def test_a_throughput_figure_is_quoted_in_one_sentence() -> None:
    sentence = re.compile(r"One worker with 2 CPUs scores (\d+)-(\d+) traces/s")
    text = " ".join(prose(THROUGHPUT_PAGE).split())
    (figure,) = sentence.findall(text)
    low, high = (int(value) for value in figure)
    quoted = []
    for path in published():
        for found in THROUGHPUT.finditer(" ".join(prose(path).split())):
            quoted.append((name(path), found.group(1)))
    # Held to the sentence's figure by test_first_contact.py.
    manifests = {
        name(REPO / "docker-compose.yml"),
        *(name(path) for path in (REPO / "deploy").rglob("*.yaml")),
    }
    allowed = {(name(THROUGHPUT_PAGE), f"{low}-{high}")}
    stray = sorted(found for found in quoted if found not in allowed and found[0] not in manifests)
    assert not stray, (
        f"throughput quoted outside docs/operations.md's one sentence: {stray}; cite "
        "bench/RESULTS.md (or that sentence) instead"
    )
    assert quoted.count((name(THROUGHPUT_PAGE), f"{low}-{high}")) == 1, quoted
    # The sentence is RESULTS.md's backlog figure, in whole traces.
    (row,) = [
        line
        for line in RESULTS.read_text().splitlines()
        if line.startswith("| stream worker on a backlog")
    ]
    measured = re.search(r"([\d.]+)-([\d.]+) traces/s", row)
    assert measured, row
    assert (low, high) == (round(float(measured.group(1))), round(float(measured.group(2)))), (
        f"docs/operations.md says {low}-{high} traces/s, bench/RESULTS.md {measured.group(0)}"
    )


def results_headings() -> set[str]:
    return set(re.findall(r"^#+ (.+)$", RESULTS.read_text(), re.M))


def results_rows() -> list[str]:
    """The first cell of each row of RESULTS.md's tables."""
    return [
        line.split("|")[1].strip()
        for line in RESULTS.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ]


@pytest.mark.parametrize("path", list(published()), ids=name)
def test_citations_of_results_name_its_sections_and_rows(path: Path) -> None:
    text = " ".join(prose(path).split())
    sections = re.findall(r"RESULTS\.md`?,? \(?\"([^\"]+)\"", text)
    missing = sorted(set(sections) - results_headings())
    assert not missing, f"{name(path)} cites sections bench/RESULTS.md lacks: {missing}"
    cited_rows = re.findall(r"\brows? \"([^\"]+)\"(?: and \"([^\"]+)\")?", text)
    rows = results_rows()
    for cited in (row for pair in cited_rows for row in pair if row):
        parts = [part.strip() for part in cited.split("...")]
        pattern = re.compile(".*".join(re.escape(part) for part in parts))
        assert any(pattern.match(row) for row in rows), (
            f"{name(path)} cites a row bench/RESULTS.md lacks: {cited!r}"
        )


def worker_packages() -> list[str]:
    return sorted(path.parent.name for path in (REPO / "worker").glob("*/__init__.py"))


def test_the_readme_layout_table_names_every_package_and_existing_files() -> None:
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(worker/\w+/)` \| (.+) \|$", readme, re.M))
    assert sorted(row.split("/")[1] for row in rows) == worker_packages()
    for package, cell in rows.items():
        named = re.findall(r"`(\w+\.py)`", cell)
        missing = [module for module in named if not (REPO / package / module).is_file()]
        assert not missing, f"the README's {package} row names missing modules: {missing}"


def layout_block() -> list[str]:
    text = (REPO / "docs" / "development.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```\n(.*?)^```", section, re.M | re.S)
    return block.splitlines()


def layout_names() -> dict[Path, set[Path]]:
    """Each file docs/development.md's layout names, by the folder it is listed under."""
    named: dict[Path, set[Path]] = {}
    top = folder = REPO
    for line in layout_block():
        entry = re.match(r"^(\S+)", line)
        sub = re.match(r"^  ([\w.]+/)\s", line)
        if entry:
            top = folder = REPO / entry.group(1).rstrip("/")
            if not entry.group(1).endswith("/"):
                folder = REPO
        elif sub:
            folder = top / sub.group(1).rstrip("/")
        elif re.match(r"^  \w+\.py", line):
            folder = top
        for file in re.findall(r"[\w./]*\w\.(?:py|md|json|jsonl|lock|yml)\b", line):
            if "/" in file:
                candidates = [REPO / file, REPO / "worker" / file]
            elif file.endswith(".py"):  # a module is named under its own folder
                candidates = [folder / file]
            else:  # in its folder, below it (tests/: PROMISES.md), or at the top (mkdocs.yml)
                candidates = [folder / file, *sorted(folder.rglob(file)), REPO / file]
            place = next((c for c in candidates if c.exists()), candidates[0])
            named.setdefault(place.parent, set()).add(place)
    return named


def test_the_development_layout_names_existing_files() -> None:
    named = layout_names()
    missing = sorted(
        str(p.relative_to(REPO)) for files in named.values() for p in files if not p.exists()
    )
    assert not missing, f"docs/development.md's layout names files that do not exist: {missing}"


@pytest.mark.parametrize(
    "package", ["worker", *(f"worker/{p}" for p in worker_packages()), "kp_model_build"]
)
def test_the_development_layout_names_every_module(package: str) -> None:
    named = layout_names().get(REPO / package, set())
    modules = {
        path
        for path in (REPO / package).glob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    }
    unnamed = sorted(path.name for path in modules - named)
    assert not unnamed, f"docs/development.md's layout does not name {package}/: {unnamed}"
