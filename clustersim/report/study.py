"""Reports of studies (``clustersim sweep``): ``clustersim report DIR`` on a study
directory (one with ``study.json``) writes ``pareto.png``, ``sensitivity.png``,
``distributions.png`` (each when it applies) and ``report.html`` into it. Reads the
study's files only.

The jobs are split one way: :mod:`~clustersim.report.study_data` reads and analyses,
:mod:`~clustersim.report.study_figures` draws, :mod:`~clustersim.report.study_html`
lays out the page, and this module writes the files.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.report.figures import render_all
from clustersim.report.study_data import is_study_dir, load_study_dir
from clustersim.report.study_figures import STUDY_FIGURES
from clustersim.report.study_html import render_study
from clustersim.trace.io import atomic_write_bytes, atomic_write_text

__all__ = ["is_study_dir", "write_study_report"]


def write_study_report(src: Path, out: Path | None = None) -> list[Path]:
    """Draw the study's figures and ``report.html`` into ``out`` (default: the study dir)."""
    data = load_study_dir(src)
    out = out or src
    out.mkdir(parents=True, exist_ok=True)
    figures = render_all(STUDY_FIGURES, data)
    written: list[Path] = []
    drawn = {f.name for f in figures}
    for fig in figures:
        atomic_write_bytes(out / fig.filename, fig.png)
        written.append(out / fig.filename)
    for spec in STUDY_FIGURES:  # a figure that no longer applies must not linger
        if spec.name not in drawn:
            (out / f"{spec.name}.png").unlink(missing_ok=True)
    atomic_write_text(out / "report.html", render_study(data, figures))
    written.append(out / "report.html")
    return written
