"""Reports from a run's results: PNG figures, a self-contained ``report.html`` and ``trace.json``.

``write_report`` serves both ``clustersim run`` (results still in memory) and
``clustersim report DIR`` (results loaded back with ``load_run``);
``write_comparison`` puts several runs side by side. matplotlib and Jinja2 are
imported here and nowhere in the simulator.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from clustersim.report.data import RunData, comm_table, load_run, utilisation
from clustersim.trace.chrome import DEFAULT_MAX_EVENTS, DEFAULT_MAX_RANKS, write_chrome_trace
from clustersim.trace.io import atomic_write_bytes, atomic_write_text

__all__ = [
    "FIGURE_MODULES",
    "RunData",
    "comm_table",
    "load_run",
    "utilisation",
    "write_comparison",
    "write_report",
]

_LINKED_FILES = (
    "summary.json",
    "trace.json",
    "trace.parquet",
    "links.parquet",
    "engines.parquet",
    "resolved_scenario.yaml",
)
# Modules whose ``@figure``/``@comparison_figure`` functions make up the reports, in
# order. A new family of figures (topology links, failures) is a module added here.
FIGURE_MODULES: tuple[str, ...] = (
    "clustersim.report.figures",
    "clustersim.report.topology",
    "clustersim.report.reliability",
    "clustersim.report.engines",
    "clustersim.report.compare",
)


def _load_figures() -> None:
    for name in FIGURE_MODULES:
        importlib.import_module(name)


def _span_text(ranks: Sequence[int]) -> str:
    r = list(ranks)
    if len(r) > 2 and r == list(range(r[0], r[0] + len(r))):
        return f"{r[0]}-{r[-1]}"
    return ", ".join(map(str, r[:12])) + (", ..." if len(r) > 12 else "")


def write_report(
    data: RunData,
    out: Path,
    *,
    html: bool = True,
    chrome: bool = True,
    max_trace_events: int = DEFAULT_MAX_EVENTS,
    max_trace_ranks: int = DEFAULT_MAX_RANKS,
) -> list[Path]:
    """Write ``trace.json`` (with ``chrome`` and a trace), the PNGs and ``report.html`` (with
    ``html``) into ``out``; return the paths written.

    A run whose step failed (``step_failed``) has no report page: call it with
    ``html=False`` for the trace alone.
    """
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    trace_note = ""
    injections = data.summary.get("injections") or []
    failed = data.summary.get("step_failed") or None
    # A step that failed before any op finished still has its failure to show.
    if chrome and data.frame is not None and (len(data.frame) or injections):
        info = write_chrome_trace(
            out / "trace.json",
            data.frame,
            data.layout(),
            memory_gib_per_chip=data.summary.get("memory_gib_per_chip"),
            chip_name=str(data.summary.get("chip", "chip")),
            max_events=max_trace_events,
            max_ranks=max_trace_ranks,
            other={
                "scenario": data.name,
                "clustersim_version": str(data.summary.get("clustersim_version", "")),
            },
            injections=injections,
            step_failed=failed,
            engines=data.engines,
        )
        written.append(info.path)
        trace_note = (
            f"trace.json (open it in Perfetto, ui.perfetto.dev, or chrome://tracing) shows "
            f"ranks {_span_text(info.ranks_shown)} of {info.ranks_total}: "
            f"{info.rows_shown:,} of {info.rows_total:,} ops, {info.events:,} events"
            + (" (capped)" if info.capped else "")
            + "."
        )
    if not html:
        return written
    from clustersim.report.figures import FIGURES, render_all
    from clustersim.report.html import render_report

    _load_figures()
    figures = render_all(FIGURES, data)
    drawn = {f.name for f in figures}
    for fig in figures:
        atomic_write_bytes(out / fig.filename, fig.png)
        written.append(out / fig.filename)
    for spec in FIGURES:  # a figure that no longer applies must not linger from a past run
        if spec.name not in drawn:
            (out / f"{spec.name}.png").unlink(missing_ok=True)
    files = [f for f in _LINKED_FILES if (out / f).exists()]
    if data.source is None and "summary.json" not in files:
        files.insert(0, "summary.json")  # `run` writes it last, after the report
    page = render_report(data, figures, files=files, trace_note=trace_note)
    atomic_write_text(out / "report.html", page)
    written.append(out / "report.html")
    return written


def write_comparison(runs: Sequence[RunData], out: Path) -> list[Path]:
    """Write comparison figures and ``report.html`` for several runs into ``out``."""
    from clustersim.report.compare import unique_labels
    from clustersim.report.figures import COMPARISON_FIGURES, render_all
    from clustersim.report.html import render_comparison

    _load_figures()
    unique_labels(runs)
    out.mkdir(parents=True, exist_ok=True)
    figures = render_all(COMPARISON_FIGURES, runs)
    written: list[Path] = []
    for fig in figures:
        atomic_write_bytes(out / fig.filename, fig.png)
        written.append(out / fig.filename)
    atomic_write_text(out / "report.html", render_comparison(runs, figures))
    written.append(out / "report.html")
    return written
