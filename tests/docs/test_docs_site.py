"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no
page left out of the navigation; and the README's links point at files and headings that
exist (the README is GitHub's front page, outside the site)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from support.paths import REPO

DOCS = REPO / "docs"


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    pages = sorted(path.stem for path in DOCS.glob("*.md"))
    assert all((tmp_path / "site" / (page if page != "index" else "")).is_dir() for page in pages)
    # Nothing is loaded from another site (a reader offline, or behind a strict proxy).
    remote = re.compile(r'<(?:script|link|img)[^>]+(?:src|href)="(?:https?:)?//[^"]+"')
    html = [page.read_text() for page in (tmp_path / "site").rglob("*.html")]
    loads = {found for text in html for found in remote.findall(text)}
    assert loads == set(), sorted(loads)[:3]


def test_a_broken_link_or_an_unlisted_page_fails_the_build(tmp_path: Path) -> None:
    """The configuration makes each of these a warning, which strict turns into a failure."""
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
    index = project / "docs" / "index.md"
    index.write_text(
        index.read_text() + "\n[gone](gone.md) [no such heading](scoring.md#no-such-heading)\n"
    )
    (project / "docs" / "unlisted.md").write_text("# Unlisted\n")
    built = build(project, tmp_path / "site")
    assert built.returncode != 0
    for problem in ("'gone.md'", "'#no-such-heading'", "- unlisted.md"):
        assert problem in built.stderr, built.stderr


def readme_links() -> list[str]:
    text = (REPO / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code is not links
    return re.findall(r"\]\(([^)\s]+)\)", text)


def headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slugify(title, "-") for title in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_links_resolve() -> None:
    links = readme_links()
    assert "docs/scoring.md" in links
    assert any(link.partition("#")[0] == "bench/RESULTS.md" for link in links)
    for link in links:
        assert not re.match(r"\w+://", link), f"the README links outside the repository: {link}"
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), f"the README links to a missing file: {link}"
        if anchor:
            assert anchor in headings(target), f"the README links to a missing heading: {link}"


# Folders a page may name that are built, not kept: the documentation site's.
GENERATED = {"site/"}


@pytest.mark.parametrize(
    "page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda page: page.name
)
def test_pages_name_only_repository_files_that_exist(page: Path) -> None:
    """Repository files a page names in backticks (`bench/RESULTS.md`, `schemas/...`) exist:
    they are not links (MkDocs would refuse a link out of docs/), so nothing else checks them.
    So do the top-level folders it names (`kp_model_build/`; the model build once was in a
    `build/` the README kept naming after it moved)."""
    text = page.read_text()
    named = re.findall(
        r"`((?:bench|schemas|deploy|worker|tests|examples|docs|kp_model_build)/[\w./-]+)`", text
    )
    named += [folder for folder in re.findall(r"`(\w[\w.-]*/)`", text) if folder not in GENERATED]
    missing = sorted({path for path in named if not (REPO / path.rstrip("/")).exists()})
    assert not missing, f"{page.name} names files that do not exist: {missing}"
