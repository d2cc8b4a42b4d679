"""`kp-scorer report`: one self-contained HTML page of how recorded outputs score.

The page draws the numbers of ``report --json`` (``ScoreReport.report_json``) with matplotlib
(the optional extra ``report``), each chart an inline SVG, so the page needs no network and
no script to be read. Trace content never appears on it: only domains, scores, dimensions,
novelty sources and dead-letter kinds.
"""

from __future__ import annotations

import html
import io
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from worker.core.score_report import DIMENSIONS
from worker.version import __version__

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

EXTRA = "report"
MAX_DOMAINS_DRAWN = 8  # more lines than this are unreadable; the tables and --json have all
GRID_EVERY = 5  # acceptance table rows: every 5th threshold of the JSON's grid, 0.00, 0.05, ...


class PlottingUnavailableError(RuntimeError):
    """matplotlib is not installed: the page needs the ``report`` extra."""


def figure_class() -> type[Figure]:
    """matplotlib's Figure, drawn by the SVG backend (no display, no pyplot state)."""
    try:
        import matplotlib
    except ImportError:
        raise PlottingUnavailableError(
            f"the HTML report draws its charts with matplotlib, which is not installed: "
            f"pip install 'kp-scorer[{EXTRA}]' (or use --json for the numbers alone)"
        ) from None
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: smaller, and the browser's own font
            "svg.hashsalt": "kp-scorer",  # the same ids on every run
            # Domains are producers' text: "$...$" in one is drawn as written, not typeset as
            # math (an unknown command such as "$\\foo$" would stop the whole page).
            "text.parse_math": False,
            "font.family": "sans-serif",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
        }
    )
    from matplotlib.figure import Figure

    return Figure


def _svg(figure: Figure) -> str:
    out = io.StringIO()
    # No metadata block: it names a date (the page would differ run to run) and web addresses.
    figure.savefig(
        out, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None}
    )
    text = out.getvalue()
    return text[text.index("<svg") :]  # inline: no XML declaration or DOCTYPE


def _note_empty(axes: Axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, alpha=0.6)


def score_chart(figure_type: type[Figure], numbers: dict[str, Any], domains: list[str]) -> str:
    """One small histogram per domain (shared axes), its threshold marked."""
    rows = max(1, (len(domains) + 1) // 2)
    height = 0.7 + 1.5 * rows
    figure = figure_type(figsize=(8, height))  # laid out by hand: a layout engine costs 0.3 s
    figure.subplots_adjust(
        left=0.07, right=0.98, top=1 - 0.3 / height, bottom=0.45 / height, hspace=0.45
    )
    grid = figure.subplots(rows, 2, sharex=True, sharey=True, squeeze=False)
    for index, axes in enumerate(grid.flat):
        if index >= len(domains):
            axes.set_axis_off()
            continue
        domain = numbers["domains"][domains[index]]
        score = domain["score"]
        axes.stairs(score["counts"], score["edges"], fill=True, alpha=0.8, color=f"C{index}")
        axes.axvline(domain["threshold"], color="black", linestyle="--", linewidth=1)
        axes.set_title(f"{domains[index]} ({score['records']})", fontsize=9, loc="left")
        axes.set_xlim(0, 1)
    if not domains:
        _note_empty(grid[0][0], "no scored records")
    for axes in grid[-1]:
        axes.set_xlabel("score")
    return _svg(figure)


def dimension_chart(figure_type: type[Figure], numbers: dict[str, Any]) -> str:
    figure = figure_type(figsize=(8, 4.4))
    figure.subplots_adjust(left=0.07, right=0.98, top=0.94, bottom=0.06, hspace=0.4)
    for axes, name in zip(figure.subplots(2, 2).flat, DIMENSIONS, strict=True):
        dimension = numbers["dimensions"][name]
        axes.stairs(dimension["counts"], dimension["edges"], fill=True, alpha=0.75)
        mean = dimension["mean"]
        axes.set_title(name if mean is None else f"{name} (mean {mean:.3f})", fontsize=9)
        axes.set_xlim(0, 1)
        axes.set_ylim(bottom=0)
        if not numbers["scored"]:
            _note_empty(axes, "no scored records")
    return _svg(figure)


def _bar_chart(figure_type: type[Figure], counts: dict[str, int], xlabel: str, empty: str) -> str:
    height = 0.8 + 0.32 * max(len(counts), 2)
    figure = figure_type(figsize=(8, height))
    figure.subplots_adjust(left=0.18, right=0.95, top=1 - 0.1 / height, bottom=0.5 / height)
    axes = figure.subplots()
    names = list(counts)[::-1]  # largest on top
    values = [counts[n] for n in names]
    if names:
        axes.bar_label(axes.barh(names, values, height=0.6), padding=3, fontsize=8)
    else:
        axes.set_yticks([])
        _note_empty(axes, empty)
    axes.set_xlabel(xlabel)
    axes.grid(axis="y", visible=False)
    return _svg(figure)


def acceptance_chart(figure_type: type[Figure], numbers: dict[str, Any], domains: list[str]) -> str:
    figure = figure_type(figsize=(8, 4))
    figure.subplots_adjust(left=0.08, right=0.98, top=0.93, bottom=0.11)
    axes = figure.subplots()
    threshold = numbers["thresholds"]["default"]

    def draw(name: str, curve: dict[str, Any], **style: Any) -> Any:
        records, steps = curve["records"], curve["steps"]
        if not records:
            return None
        xs = [0.0, *steps["threshold"], 1.0]
        ys = [100 * a / records for a in (*steps["accepted"], 0, 0)]
        (line,) = axes.step(xs, ys, where="post", label=name, **style)
        return line.get_color()

    draw("all domains", numbers["acceptance"], color="black", linewidth=2.2)
    colors = {d: draw(d, numbers["domains"][d]["acceptance"], linewidth=1.2) for d in domains}
    axes.axvline(threshold, color="black", linestyle="--", linewidth=1)
    axes.annotate(
        f"threshold {threshold:g}",
        (threshold, 101),
        fontsize=8,
        ha="center",
        va="bottom",
        annotation_clip=False,
    )
    for domain, color in colors.items():
        own = numbers["domains"][domain]["threshold"]
        if own != threshold:
            axes.axvline(own, color=color, linestyle=":", linewidth=1.4)
    if numbers["domains"]:
        axes.legend(loc="upper right", fontsize=8, frameon=False)
    else:
        _note_empty(axes, "no scored records")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 100)
    axes.set_xlabel("accept threshold (accepted when score >= threshold)")
    axes.set_ylabel("accepted, % of scored records")
    return _svg(figure)


# -- the page --------------------------------------------------------------------------------
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 62rem; color: #222;
       padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 0.9rem; }
table { border-collapse: collapse; font-size: 0.9rem; margin: 0.5rem 0; }
th, td { padding: 0.2rem 0.7rem; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
figure.chart { margin: 0.5rem 0 1.5rem; }
figure.chart svg { max-width: 100%; height: auto; }
figcaption, .note { color: #555; font-size: 0.85rem; }
.wide { overflow-x: auto; }  /* a column per domain: scrolls rather than overflows the page */
"""


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _chart(name: str, title: str, svg: str, caption: str) -> str:
    return (
        f'<h2>{html.escape(title)}</h2><figure class="chart" data-chart="{name}">{svg}'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def render_html(numbers: dict[str, Any], source: str, now: datetime | None = None) -> str:
    """The page of ``report --json``'s numbers: summary tables, then the charts (raises
    PlottingUnavailableError)."""
    figure = figure_class()
    scored = numbers["scored"]
    accepted = numbers["accepted_at_configured_thresholds"]
    summary_rows: list[list[Any]] = [
        ["records read", numbers["records"]],
        ["scored", scored],
        ["accepted at the configured thresholds", f"{accepted} ({_percent(accepted, scored)})"],
        ["dead letters", numbers["dead_letters"]["total"]],
        *([f"not re-scored: {reason}", count] for reason, count in numbers["not_scored"].items()),
    ]
    domain_rows = [
        [
            name,
            domain["score"]["records"],
            f"{domain['threshold']:g}",
            domain["accepted_at_threshold"],
            _percent(domain["accepted_at_threshold"], domain["score"]["records"]),
            f"{domain['score']['mean']:.3f}",
            f"{domain['score']['median']:.3f}",
        ]
        for name, domain in numbers["domains"].items()
    ]
    drawn = list(numbers["domains"])[:MAX_DOMAINS_DRAWN]
    # Every domain, not only those drawn: the table is where a domain past the 8th has its
    # acceptance at each threshold.
    curves = [numbers["acceptance"], *(d["acceptance"] for d in numbers["domains"].values())]
    grid_rows = [
        [
            f"{point['threshold']:.2f}",
            *(_percent(curve["grid"][row]["accepted"], curve["records"]) for curve in curves),
        ]
        for row, point in enumerate(numbers["acceptance"]["grid"])
        if row % GRID_EVERY == 0
    ]
    thresholds = numbers["thresholds"]
    configured = ", ".join(
        [
            f"default {thresholds['default']:g}",
            *(f"{d} {t:g}" for d, t in thresholds["domains"].items()),
        ]
    )
    generated = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        _chart(
            "score_by_domain",
            "Score distribution by domain",
            score_chart(figure, numbers, drawn),
            "Scores as `rescore` computes them with the settings in force, in bins of 0.02; "
            "dashed: the domain's threshold."
            + (
                f" The {len(drawn)} largest of {len(numbers['domains'])} domains (all of them in "
                "the Domains and Acceptance tables and in --json)."
                if len(drawn) < len(numbers["domains"])
                else ""
            ),
        ),
        _chart(
            "acceptance",
            "Acceptance by threshold",
            acceptance_chart(figure, numbers, drawn),
            "Share of scored records accepted (score >= threshold) for every threshold from 0 "
            "to 1, over all domains and per domain, exact from the scores. Dashed: the default "
            "threshold; dotted, in a domain's colour: its own threshold.",
        ),
        _chart(
            "dimensions",
            "Dimensions",
            dimension_chart(figure, numbers),
            "Each dimension's values over the scored records, in bins of 0.05.",
        ),
        _chart(
            "novelty_sources",
            "Novelty sources",
            _bar_chart(figure, numbers["novelty_sources"], "records", "none"),
            "embedding: measured against the recent traces of the same input partition "
            "(one novelty cache per partition, whatever their domains); empty_cache: that "
            "cache held no live trace (the partition's first, or all expired): novelty 0.5; "
            "no_embedder: scored without a model: novelty 0.5.",
        ),
        _chart(
            "dead_letters",
            "Dead letters by kind",
            _bar_chart(figure, numbers["dead_letters"]["by_kind"], "records", "no dead letters"),
            "Records that could not be scored, by the kind of error (kp-error-kind).",
        ),
    ]
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kp-scorer report: {html.escape(source)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>Score report</h1>
<p class="meta">{html.escape(source)} · thresholds: {html.escape(configured)} ·
kp-scorer {html.escape(__version__)} · {generated}</p>
{_table(["", ""], summary_rows)}
<h2>Domains</h2>
{_table(["domain", "scored", "threshold", "accepted", "share", "mean", "median"], domain_rows)}
{"".join(sections)}
<h2>Acceptance table</h2>
<p class="note">Share of scored records accepted at each threshold, every domain.</p>
<div class="wide">{_table(["threshold", "all domains", *numbers["domains"]], grid_rows)}</div>
</body>
</html>
"""
