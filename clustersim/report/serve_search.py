"""The figure of a serving capacity search (``clustersim serve-search``): the
throughput-latency Pareto front.

It reads the search's table (one row per simulated candidate, from
:mod:`clustersim.serve.capacity`), never the simulator: each candidate's output
tokens per second per dollar-hour against its TTFT p90 and its TPOT p90, those that
met the SLO filled, the others hollow, the SLO's targets dashed, the pick starred, and
the Pareto front (no other candidate is both faster and more tokens per dollar) drawn
through its points.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from clustersim.report.figures import FigureSpec, new_figure, render, short

__all__ = ["SearchData", "pareto_front", "pareto_png"]

THROUGHPUT = "output_tokens_per_s_per_usd_hour"
AXES = (
    ("ttft_p90_s", "TTFT p90", 1.0, "s", "ttft_s"),
    ("tpot_p90_s", "TPOT p90", 1e3, "ms", "tpot_s"),
)
COLORS = {
    "trn2": "#DD8452",
    "trn1": "#C44E52",
    "inf2": "#8172B2",
    "p5": "#4C72B0",
    "p5en": "#55A868",
}


@dataclass(frozen=True)
class SearchData:
    """A capacity search's table and its settings (``serve_search.json``)."""

    frame: pd.DataFrame
    meta: Mapping[str, Any]


def pareto_front(latency: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both: lower latency and higher
    throughput (ties kept once), in order of latency."""
    order = np.lexsort((-throughput, latency))
    front, best = [], -np.inf
    for i in order:
        if throughput[i] > best:
            front.append(int(i))
            best = throughput[i]
    return np.asarray(front, dtype=int)


def _family(instance: str) -> str:
    return instance.split(".", maxsplit=1)[0]


def _draw(data: SearchData) -> Figure | None:
    frame = data.frame
    sim = frame[frame["status"].isin(["pick", "meets", "misses"])]
    sim = sim[np.isfinite(sim[THROUGHPUT].to_numpy(float))]
    if sim.empty:
        return None
    meta = data.meta
    slo = meta["slo"]
    fig = new_figure(10.0, 4.4)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (col, name, scale, unit, target) in zip(axes, AXES, strict=True):
        pts = sim[np.isfinite(sim[col].to_numpy(float))]
        x = pts[col].to_numpy(float) * scale
        y = pts[THROUGHPUT].to_numpy(float)
        for fam in sorted({_family(i) for i in pts["instance"]}):
            mask = np.array([_family(i) == fam for i in pts["instance"]])
            met = pts["meets_slo"].to_numpy(bool)
            color = COLORS.get(fam, "#8C8C8C")
            ax.scatter(x[mask & met], y[mask & met], color=color, s=28, label=fam, zorder=3)
            ax.scatter(x[mask & ~met], y[mask & ~met], facecolors="none", edgecolors=color, s=28,
                       zorder=3)  # fmt: skip
        front = pareto_front(x, y)
        ax.step(x[front], y[front], where="post", color="#333333", lw=1.2, zorder=2,
                label="Pareto front")  # fmt: skip
        pick = (pts["status"] == "pick").to_numpy(bool)
        if pick.any():
            ax.scatter(x[pick], y[pick], marker="*", s=220, color="gold", edgecolors="black",
                       zorder=4, label="pick")  # fmt: skip
        ax.axvline(slo[target] * scale, color="#C44E52", ls="--", lw=1, label="SLO target")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{name} ({unit}, log scale)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("output tokens/s per $/hour")
    handles, labels = axes[1].get_legend_handles_labels()
    axes[1].legend(handles, labels, loc="best", fontsize=8)
    fig.suptitle(
        short(
            f"{meta['scenario']}: {meta['model']} at {meta['rate_per_s']:g} requests/s; "
            f"hollow: missed the SLO",
            100,
        )
    )
    return fig


PARETO = FigureSpec(
    "pareto",
    "Throughput against latency",
    "Each simulated candidate's output tokens per second per dollar-hour against its TTFT "
    "and TPOT p90; filled: met the SLO; the line: the Pareto front.",
    _draw,
)


def pareto_png(frame: pd.DataFrame, meta: Mapping[str, Any]) -> bytes:
    """The Pareto figure as PNG bytes (a note, when no candidate was simulated)."""
    spec: FigureSpec[SearchData] = FigureSpec(
        PARETO.name, PARETO.title, PARETO.caption, lambda d: _draw(d) or _empty()
    )
    rendered = render(spec, SearchData(frame, meta))
    return rendered.png if rendered is not None else b""


def _empty() -> Figure:
    fig = new_figure(6.0, 2.0)
    fig.text(0.5, 0.5, "no candidate was simulated", ha="center", va="center")
    return fig
