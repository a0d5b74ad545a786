"""Figures are written, readable as PNG, and not blank."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from clustersim.report import load_run
from clustersim.report.compare import unique_labels
from clustersim.report.data import RunData
from clustersim.report.figures import COMPARISON_FIGURES, FIGURES, FigureSpec, figure, render

MIN_VARIANCE = 1e-3  # a blank (single-colour) image has variance 0


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(mpimg.imread(io.BytesIO(png), format="png"))


def _assert_not_blank(png: bytes) -> None:
    assert png.startswith(b"\x89PNG")
    px = _pixels(png)
    assert px.shape[0] > 150 and px.shape[1] > 300
    assert float(px[..., :3].var()) > MIN_VARIANCE


def test_run_writes_every_figure(tiny_run: Path) -> None:
    names = [spec.name for spec in FIGURES]
    assert {"timeline", "utilisation", "breakdown", "memory", "cost"} <= set(names)
    assert len(names) == len(set(names))
    # drawn only for runs with a failures section, and with chip_model: engines
    conditional = {"reliability", "engines"}
    for spec in FIGURES:
        if spec.name in conditional:
            assert not (tiny_run / f"{spec.name}.png").exists()
            continue
        path = tiny_run / f"{spec.name}.png"
        assert path.is_file(), spec.name
        _assert_not_blank(path.read_bytes())


def test_trace_figures_are_skipped_without_a_trace(tiny_run: Path) -> None:
    data = load_run(tiny_run, trace=False)
    skipped = {spec.name for spec in FIGURES if spec.name in ("timeline", "utilisation")}
    assert skipped == {"timeline", "utilisation"}
    assert all(spec.draw(data) is None for spec in FIGURES if spec.name in skipped)


def test_comparison_figures(comparison: Path) -> None:
    names = {s.name for s in COMPARISON_FIGURES}
    assert names >= {"compare_step", "compare_efficiency", "compare_cost", "compare_memory"}
    for name in names:
        _assert_not_blank((comparison / f"{name}.png").read_bytes())


def test_comparison_labels_are_unique(tiny_run: Path) -> None:
    runs = [load_run(tiny_run, trace=False), load_run(tiny_run, trace=False)]
    unique_labels(runs)
    assert len({r.label for r in runs}) == 2


def test_dollar_signs_are_text_not_mathtext(tiny_run: Path) -> None:
    data = load_run(tiny_run, trace=False)
    data.summary["scenario"] = "cost $5 vs $ and a_b^c $x"
    for spec in FIGURES:
        render(spec, data)  # mathtext would fail to parse "$5 vs $"


def test_registry_takes_new_figures(tiny_run: Path) -> None:
    before = list(FIGURES)
    try:

        @figure("extra", "Extra", "A figure added by an extension.")
        def _extra(data: RunData) -> None:
            return None

        assert FIGURES[-1] == FigureSpec(
            "extra", "Extra", "A figure added by an extension.", _extra
        )
        assert render(FIGURES[-1], load_run(tiny_run, trace=False)) is None
    finally:
        FIGURES[:] = before


@pytest.mark.parametrize("ranks", [1, 2])
def test_timeline_with_few_ranks(tiny_run: Path, ranks: int) -> None:
    data = load_run(tiny_run)
    assert data.frame is not None
    keep = data.frame["rank"].isin([0, 32][:ranks])
    data.frame = data.frame[keep].reset_index(drop=True)
    fig = render(FIGURES[0], data)
    assert fig is not None
    _assert_not_blank(fig.png)
