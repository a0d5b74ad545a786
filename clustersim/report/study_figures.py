"""Figures of a study report, drawn like the run figures (Agg canvas, no pyplot state)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from clustersim.report.figures import FigureSpec, new_figure, short
from clustersim.report.study_data import (
    StudyData,
    distribution_stats,
    is_numeric,
    levels_of,
    pareto_mask,
    pareto_points,
    sample_groups,
    short_key,
)

__all__ = ["STUDY_FIGURES", "axis_title"]

STUDY_FIGURES: list[FigureSpec[StudyData]] = []
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3", "#8C8C8C"]
MAX_PANELS = 6
MAX_LABELS = 12

_TITLES = {
    "step_time_s": "step time (s)",
    "time_to_train_h": "time to train (h)",
    "cost.usd_per_million_tokens": "$ per million tokens",
    "cost.usd_per_hour": "$ per hour",
    "mfu": "MFU",
    "hfu": "HFU",
    "tokens_per_s": "tokens per second",
    "memory_gib_per_chip.total": "memory per chip (GiB)",
    "energy.kwh_per_million_tokens": "kWh per million tokens",
    "reliability.goodput": "goodput",
    "reliability.ettr": "ETTR (effective training time ratio)",
    "reliability.interruptions": "interruptions",
    "reliability.cost.usd_per_million_useful_tokens": "$ per million useful tokens",
}


def axis_title(column: str) -> str:
    return _TITLES.get(column, column)


Draw = Callable[[StudyData], Figure | None]


def _register(name: str, title: str, caption: str) -> Callable[[Draw], Draw]:
    def add(fn: Draw) -> Draw:
        STUDY_FIGURES.append(FigureSpec(name, title, caption, fn))
        return fn

    return add


def _finite(frame: pd.DataFrame, *cols: str) -> pd.DataFrame:
    if not all(c in frame.columns and is_numeric(frame[c]) for c in cols):
        return frame.iloc[0:0]
    mask = np.ones(len(frame), dtype=bool)
    for c in cols:
        mask &= np.isfinite(frame[c].to_numpy(dtype=float))
    return frame[mask]


@_register(
    "pareto",
    "Pareto front",
    "Every point that ran, by time and cost; the front (filled, joined) holds the points "
    "that no other point beats on both. Labels give the front points' axis values.",
)
def pareto(data: StudyData) -> Figure | None:
    x, y = data.x, data.y
    ok, keys = pareto_points(data)
    if len(ok) < 2 or ok[x].nunique() < 2 or ok[y].nunique() < 2:
        return None  # no trade-off to draw
    xs, ys = ok[x].to_numpy(dtype=float), ok[y].to_numpy(dtype=float)
    front = pareto_mask(xs, ys)
    fig = new_figure(9.0, 5.4)
    ax = fig.add_subplot()
    ax.scatter(xs[~front], ys[~front], s=28, color="#BDBDBD", label="dominated", zorder=2)
    order = np.argsort(xs[front])
    fx, fy = xs[front][order], ys[front][order]
    ax.step(fx, fy, where="post", color=COLORS[3], lw=1.2, zorder=3)
    ax.scatter(fx, fy, s=46, color=COLORS[3], label="Pareto front", zorder=4)
    rows = ok[front].iloc[order].to_dict("records")
    for px, py, row in list(zip(fx, fy, rows, strict=True))[:MAX_LABELS]:
        ax.annotate(short(data.label(row, keys), 40), (px, py), xytext=(6, 4),
                    textcoords="offset points", fontsize=8)  # fmt: skip
    ax.set_xlabel(axis_title(x))
    ax.set_ylabel(axis_title(y))
    ax.margins(x=0.15, y=0.12)
    ax.legend(loc="upper right")
    n_failed = len(data.failed)
    note = f"; {n_failed} failed point{'s' * (n_failed != 1)} not shown" if n_failed else ""
    ax.set_title(f"{short(data.name, 60)}: {len(ok)} points{note}", fontsize=10)
    fig.suptitle("Cost against time (both lower is better)", fontweight="bold", fontsize=12)
    return fig


def _sensitivity_panel(ax: Axes, data: StudyData, key: str, metric: str) -> None:
    ok = _finite(data.ok, metric)
    col = ok[key]
    vals = ok[metric].to_numpy(dtype=float)
    if is_numeric(col):
        xs = col.to_numpy(dtype=float)
        ax.scatter(xs, vals, s=14, color=COLORS[0], alpha=0.55, zorder=2)
        levels = levels_of(col)
        if levels is col:  # a few distinct values: join their means
            means = ok.groupby(key)[metric].mean()
            ax.plot(means.index.to_numpy(dtype=float), means.to_numpy(dtype=float), "-o",
                    color=COLORS[3], ms=4, zorder=3)  # fmt: skip
        positive = xs[np.isfinite(xs)]
        if len(positive) and positive.min() > 0 and positive.max() / positive.min() >= 16:
            ax.set_xscale("log", base=2 if np.all(np.log2(positive) % 1 == 0) else 10)
        ticks = np.unique(positive)
        spread = np.diff(ticks) / max(float(np.ptp(ticks)), 1e-300)
        if levels is col and (ax.get_xscale() == "log" or spread.min(initial=1.0) >= 0.06):
            ax.set_xticks(ticks)  # ticks at the values the axis takes, when they do not crowd
            ax.set_xticklabels([f"{t:g}" for t in ticks], fontsize=8)
            ax.minorticks_off()
    else:
        cats = list(dict.fromkeys(col.astype(str)))
        pos = {c: i for i, c in enumerate(cats)}
        xs = np.array([pos[c] for c in col.astype(str)], dtype=float)
        ax.scatter(xs, vals, s=14, color=COLORS[0], alpha=0.55, zorder=2)
        cat_means = [float(np.nanmean(vals[xs == i])) for i in range(len(cats))]
        ax.plot(range(len(cats)), cat_means, "-o", color=COLORS[3], ms=4, zorder=3)
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels([short(c, 14) for c in cats], rotation=30 if len(cats) > 3 else 0,
                           fontsize=8)  # fmt: skip


@_register(
    "sensitivity",
    "Sensitivity along each axis",
    "Each metric (rows) against each axis (columns): every point as a dot, and the mean "
    "over the other axes at each value of this one as the line.",
)
def sensitivity_figure(data: StudyData) -> Figure | None:
    keys = data.axis_keys(("grid", "zip", "random"), lead=True)[:MAX_PANELS]
    metrics = data.metrics
    if not keys or not metrics or len(data.ok) < 2:
        return None
    ncols, nrows = len(keys), len(metrics)
    fig = new_figure(max(3.2 * ncols, 6.0), 2.5 * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex="col")
    for j, key in enumerate(keys):
        for i, metric in enumerate(metrics):
            ax = axes[i][j]
            _sensitivity_panel(ax, data, key, metric)
            if j == 0:
                ax.set_ylabel(axis_title(metric), fontsize=9)
            if i == nrows - 1:
                ax.set_xlabel(short_key(key, keys), fontsize=9)
            ax.tick_params(labelsize=8)
    fig.suptitle(f"Sensitivity: {short(data.name, 60)}", fontweight="bold", fontsize=12)
    return fig


@_register(
    "distributions",
    "Monte Carlo distributions",
    "Histogram of each metric over the Monte Carlo samples (seeds or random draws), one "
    "colour per combination of the other axes; the shaded band is the 95% confidence "
    "interval of the mean (Student t), the dashed line the mean.",
)
def distributions(data: StudyData) -> Figure | None:
    metrics = data.metrics
    if not data.has_samples or not metrics or len(data.ok) < 2:
        return None
    groups = sample_groups(data)
    ncols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / ncols)
    fig = new_figure(4.0 * ncols, 3.0 * nrows + 1.0)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, metric in enumerate(metrics):
        ax = axes[k // ncols][k % ncols]
        all_vals = _finite(data.ok, metric)[metric].to_numpy(dtype=float)
        lo, hi = (float(all_vals.min()), float(all_vals.max())) if len(all_vals) else (0.0, 1.0)
        bins = np.linspace(lo, hi, 21) if hi > lo else np.linspace(lo - 0.5, lo + 0.5, 3)
        for g, (label, frame) in enumerate(groups):
            vals = frame[metric].to_numpy(dtype=float)
            color = COLORS[g % len(COLORS)]
            ax.hist(vals[np.isfinite(vals)], bins=bins, histtype="stepfilled", alpha=0.35,
                    color=color, label=short(label, 30))  # fmt: skip
            st = distribution_stats(vals.tolist())
            if st["n"] >= 1:
                ax.axvspan(st["ci_low"], st["ci_high"], color=color, alpha=0.25, lw=0)
                ax.axvline(st["mean"], color=color, ls="--", lw=1.2)
        ax.set_xlabel(axis_title(metric), fontsize=9)
        ax.set_ylabel("points", fontsize=9)
        ax.tick_params(labelsize=8)
    for k in range(len(metrics), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    if len(groups) > 1:
        axes[0][0].legend(fontsize=8, loc="upper right")
    n = len(data.ok)
    fig.suptitle(f"Distributions over {n} samples: {short(data.name, 50)}", fontweight="bold",
                 fontsize=12)  # fmt: skip
    return fig
