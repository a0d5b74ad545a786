"""Figures that compare runs side by side (e.g. Trn2 against H100 on the same model)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from clustersim.report.data import RunData
from clustersim.report.figures import (
    PART_COLORS,
    bottom_legend,
    comparison_figure,
    cost_panels,
    memory_bars,
    new_figure,
    short,
    stacked_bars,
    time_unit,
)

__all__ = ["unique_labels"]


def unique_labels(runs: Sequence[RunData]) -> None:
    """Label runs by scenario name, adding the directory where two names collide."""
    names = [r.name for r in runs]
    for r in runs:
        dup = names.count(r.name) > 1
        r.custom_label = f"{r.name} ({r.source.name})" if dup and r.source is not None else ""
    labels = [r.label for r in runs]
    for i, r in enumerate(runs):
        if labels.count(r.label) > 1:
            r.custom_label = f"{r.label} #{i + 1}"


def _height(n: int) -> float:
    return 1.9 + 0.55 * n


@comparison_figure(
    "compare_step",
    "Step time",
    "Each run's step time split into compute, exposed communication, pipeline bubble, "
    "optimizer and the rest.",
)
def compare_step(runs: Sequence[RunData]) -> Figure | None:
    scale, unit = time_unit(max(r.step_time_s for r in runs))
    fig = new_figure(11.0, _height(len(runs)))
    ax, ax_pct = fig.subplots(1, 2, sharey=True, width_ratios=[3, 2])
    labels = [r.label for r in runs]
    parts = [{k: float(v) * scale for k, v in r.summary["breakdown_s"].items()} for r in runs]
    stacked_bars(ax, labels, parts, PART_COLORS, unit=f"time per step ({unit})")
    for i, r in enumerate(runs):
        ax.text(r.step_time_s * scale, i, f" {r.step_time_s * scale:.3g} {unit}", va="center")
    ax.set_xlim(0, max(r.step_time_s for r in runs) * scale * 1.18)
    ax.set_title("seconds", fontsize=10)
    # The same parts as shares of each step, so runs of very different size compare too.
    shares = [{k: 100.0 * v / max(sum(p.values()), 1e-300) for k, v in p.items()} for p in parts]
    stacked_bars(ax_pct, labels, shares, PART_COLORS, unit="% of step")
    ax_pct.set_xlim(0, 100)
    ax_pct.set_title("share of the step", fontsize=10)
    bottom_legend(fig, *ax.get_legend_handles_labels(), ncol=5)
    fig.suptitle("Step time by part", fontweight="bold", fontsize=12)
    return fig


@comparison_figure(
    "compare_efficiency",
    "Throughput and utilisation",
    "Tokens per second, and MFU and HFU (model and hardware FLOPs utilisation against the "
    "chips' dense peak).",
)
def compare_efficiency(runs: Sequence[RunData]) -> Figure | None:
    if any(r.is_trace for r in runs):  # a trace workload has no tokens or model FLOPs
        return None
    fig = new_figure(10.0, 3.6)
    labels = [short(r.label, 24) for r in runs]
    x = np.arange(len(runs))
    ax = fig.add_subplot(1, 2, 1)
    tps = [float(r.summary.get("tokens_per_s", 0.0)) for r in runs]
    bars = ax.bar(x, tps, color="#4C72B0", width=0.55)
    for b, v in zip(bars, tps, strict=True):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:,.0f}", ha="center", va="bottom")
    ax.set_ylabel("tokens per second")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.set_title("throughput", fontsize=10)
    ax.set_ylim(0, max(*tps, 1.0) * 1.2)
    ax = fig.add_subplot(1, 2, 2)
    w = 0.38
    for k, (key, color) in enumerate((("mfu", "#55A868"), ("hfu", "#8172B2"))):
        vals = [100.0 * float(r.summary.get(key, 0.0)) for r in runs]
        bars = ax.bar(x + (k - 0.5) * w, vals, width=w, color=color, label=key.upper())
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}%", ha="center", va="bottom",
                    fontsize=9)  # fmt: skip
    ax.set_ylabel("% of dense peak FLOP/s")
    ax.set_ylim(0, 100)
    ax.set_title("MFU and HFU", fontsize=10)
    ax.legend(loc="upper right")
    for a in fig.axes:
        a.set_xticks(x)
        a.set_xticklabels(labels, rotation=0 if len(runs) <= 3 else 20)
    fig.suptitle("Throughput and FLOPs utilisation", fontweight="bold", fontsize=12)
    return fig


@comparison_figure(
    "compare_cost",
    "Cost",
    "Price of each cluster per hour, and the cost of a million trained tokens.",
)
def compare_cost(runs: Sequence[RunData]) -> Figure | None:
    if not all("cost" in r.summary for r in runs):
        return None
    fig = new_figure(10.0, 3.6)
    cost_panels(fig, runs)
    per = "step" if any(r.is_trace for r in runs) else "million tokens"
    fig.suptitle(f"Cost: $ per hour and $ per {per}", fontweight="bold", fontsize=12)
    return fig


@comparison_figure(
    "compare_memory",
    "Memory per chip",
    "HBM per chip on each run's most loaded stage, by category, against each chip's capacity.",
)
def compare_memory(runs: Sequence[RunData]) -> Figure | None:
    if not all(r.summary.get("memory_gib_per_chip") for r in runs):
        return None
    fig = new_figure(10.0, _height(len(runs)) + 0.3)
    ax = fig.add_subplot()
    memory_bars(fig, ax, runs)
    fig.suptitle("HBM per chip", fontweight="bold", fontsize=12)
    return fig
