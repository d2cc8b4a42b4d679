"""The `kp-scorer report` page in a real browser: headless Chromium (Debian's ``chromium``,
installed by tests/support/debian.py where missing) opens the file with no network, every
chart is drawn with a size and marks on it, the page logs no error, and a screenshot of the
whole page is taken.

``REPORT_SCREENSHOT=PATH`` also writes the screenshot there (how docs/report.png is made:
``REPORT_SCREENSHOT=docs/report.png python -m pytest -n 0 tests/unit/cli/test_report_browser.py``).
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from worker.cli.main import main

from support.browser import visit
from support.debian import headless_browser
from support.scored_corpus import model_scorer, replicate, scored_examples

SCREENSHOT = os.environ.get("REPORT_SCREENSHOT")
CHARTS = ["score_by_domain", "acceptance", "dimensions", "novelty_sources", "dead_letters"]
# Per chart: its SVG's size as laid out, and how many shapes it draws.
MEASURE = """
Array.from(document.querySelectorAll("figure.chart")).map((figure) => {
  const svg = figure.querySelector("svg");
  const box = svg ? svg.getBoundingClientRect() : { width: 0, height: 0 };
  return {
    name: figure.dataset.chart,
    width: box.width,
    height: box.height,
    shapes: svg ? svg.querySelectorAll("path, rect, line, use").length : 0,
    texts: svg ? svg.querySelectorAll("text").length : 0,
  };
})
"""


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


@pytest.mark.timeout(900)  # a fresh machine installs Chromium first
def test_every_chart_renders_in_chromium_without_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = headless_browser()
    monkeypatch.chdir(tmp_path)  # the page names its source as given: scored.jsonl
    outputs, errors = scored_examples(model_scorer())
    corpus = tmp_path / "scored.jsonl"
    corpus.write_bytes(replicate(outputs, errors, 600))
    page = tmp_path / "report.html"
    flags = ["--threshold", "0.6", "--domain-threshold", "finance=0.7"]
    assert main(["report", corpus.name, *flags, "--output", str(page), "--quiet"]) == 0

    seen = visit(browser, page.resolve().as_uri(), MEASURE)

    assert not seen.errors, seen.errors
    assert [chart["name"] for chart in seen.value] == CHARTS
    for chart in seen.value:
        assert chart["width"] > 300 and chart["height"] > 100, chart
        assert chart["shapes"] > 10 and chart["texts"] > 3, chart
    from PIL import Image  # matplotlib's own dependency, so there with the report extra

    image = Image.open(io.BytesIO(seen.png))
    assert image.width == 1100 and image.height > 2000, image.size
    assert len(image.convert("L").getcolors(256) or []) > 20, "a blank screenshot"
    (tmp_path / "report.png").write_bytes(seen.png)
    if SCREENSHOT:
        shutil.copyfile(tmp_path / "report.png", SCREENSHOT)


@pytest.mark.timeout(900)
def test_a_page_error_is_seen(tmp_path: Path) -> None:
    """The check above can fail: a page that logs an error, or fails to load an image."""
    browser = headless_browser()
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="missing.png">'
        '<script>console.error("drawn badly")</script></body></html>'
    )
    seen = visit(browser, page.as_uri(), "1")
    assert any("drawn badly" in error for error in seen.errors), seen.errors
    assert any("missing.png" in error for error in seen.errors), seen.errors
