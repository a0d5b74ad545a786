"""Report figures, drawn with matplotlib's object API on the Agg canvas (no pyplot state).

Each figure is a function from the data to a ``Figure`` (or ``None`` when it does
not apply, such as a timeline without a trace), registered under the file name
it is saved as. New figures (link utilisation on the topology, failures over a
long horizon) are one more decorated function, here or in a module listed in
``clustersim.report.FIGURE_MODULES``::

    @figure("links", "Link utilisation", "Busy fraction of each link.")
    def _links(data: RunData) -> Figure | None: ...

Every figure stands on its own: a title naming the scenario, axis units and a
legend. Text is never parsed as mathtext, so ``$`` in a scenario name is safe.

This module draws one run's figures (the pipeline timeline, the utilisation map,
the step-time breakdown, memory and cost); the registry, the rendering and the
helpers every figure shares are :mod:`clustersim.report.figure_registry`'s, and
importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from clustersim.report.data import COMPUTE_RESOURCES, RunData, utilisation
from clustersim.report.figure_registry import (
    COMPARISON_FIGURES,
    DPI,
    FIGURES,
    MEMORY_COLORS,
    PART_COLORS,
    PHASE_COLORS,
    RC,
    TRACE_PHASE_COLORS,
    FigureSpec,
    Rendered,
    bottom_legend,
    comparison_figure,
    figure,
    new_figure,
    render,
    render_all,
    short,
    suptitle,
    time_unit,
)
from clustersim.report.injections import applied_injections, mark_injections
from clustersim.trace.chrome import labels

__all__ = [
    "COMPARISON_FIGURES",
    "DPI",
    "FIGURES",
    "MEMORY_COLORS",
    "PART_COLORS",
    "PHASE_COLORS",
    "RC",
    "TRACE_PHASE_COLORS",
    "FigureSpec",
    "Rendered",
    "bottom_legend",
    "comparison_figure",
    "figure",
    "new_figure",
    "render",
    "render_all",
    "short",
    "suptitle",
    "time_unit",
]


def _num(value: float, reference: float) -> str:
    """``value`` to 3 significant digits, or 0 when it is rounding noise next to ``reference``."""
    return "0" if abs(value) < 1e-9 * abs(reference) else f"{value:.3g}"


# -- pipeline timeline ----------------------------------------------------------------


def _timeline_ranks(data: RunData, frame: pd.DataFrame) -> list[int]:
    """A few ranks per stage: the first and last traced rank of each (fewer with many stages);
    of a trace workload, up to 8 ranks spread over all."""
    if data.is_trace:
        traced = np.unique(frame["rank"].to_numpy())
        pick = np.linspace(0, len(traced) - 1, 8).round().astype(np.int64)
        return sorted({int(r) for r in traced[pick]})
    layout = data.layout()
    by_stage: dict[int, list[int]] = {}
    for r in sorted(frame["rank"].unique().tolist()):
        by_stage.setdefault(layout.stage(r), []).append(int(r))
    stages = sorted(by_stage)
    per_stage = 2 if len(stages) <= 6 else 1
    if len(stages) > 12:
        stages = [stages[i] for i in np.linspace(0, len(stages) - 1, 12).round().astype(int)]
    out: list[int] = []
    for s in stages:
        ranks = by_stage[s]
        out += sorted({ranks[0], ranks[-1]})[:per_stage]
    return out


def _spans(
    frame: pd.DataFrame, exposed: np.ndarray, bubble: np.ndarray, phases: Sequence[str]
) -> pd.DataFrame:
    """Time spans (start, end, cat) of one rank's timeline, adjacent equal spans merged;
    compute spans are those of ``phases``."""
    start, end = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    phase, res = labels(frame["phase"]), labels(frame["resource"])
    comm = np.array([":" in r or r in ("p2p", "wait") for r in res.tolist()], dtype=bool)
    compute = ~comm & np.isin(phase, tuple(phases))
    parts = [
        pd.DataFrame({"start": start[compute], "end": end[compute], "cat": phase[compute]}),
        # The bubble part of a receive comes first (waiting for the sender), then the transfer.
        pd.DataFrame({"start": start, "end": start + bubble, "cat": "bubble"})[bubble > 0],
        pd.DataFrame({"start": end - exposed, "end": end, "cat": "comm"})[exposed > 0],
    ]
    spans = pd.concat(parts, ignore_index=True).sort_values("start", kind="stable")
    if spans.empty:
        return spans
    tol = max(float(end.max()) / 5000.0, 0.0)
    cat = spans["cat"].to_numpy()
    s, e = spans["start"].to_numpy(), spans["end"].to_numpy()
    prev_end = np.maximum.accumulate(np.concatenate([[-np.inf], e[:-1]]))
    new = np.concatenate([[True], cat[1:] != cat[:-1]]) | (s - prev_end > tol)
    run = np.cumsum(new)
    return (
        pd.DataFrame({"run": run, "start": s, "end": e, "cat": cat})
        .groupby("run")
        .agg(start=("start", "min"), end=("end", "max"), cat=("cat", "first"))
    )


@figure(
    "timeline",
    "Pipeline timeline",
    "What a few ranks of each stage do over the step: forward, backward and recompute "
    "compute, exposed communication, and pipeline bubbles (waiting for another stage).",
)
def timeline(data: RunData) -> Figure | None:
    frame = data.frame
    if frame is None or frame.empty:
        return None
    layout = data.layout()
    colors = PHASE_COLORS
    if data.is_trace:  # the node types the trace has
        present = set(labels(frame["phase"]).tolist()) | {"comm"}
        colors = {k: c for k, c in TRACE_PHASE_COLORS.items() if k in present}
    ranks = _timeline_ranks(data, frame)
    # Exposure comes from the whole trace: a receive needs its sender, shown or not.
    keep = frame["rank"].isin(ranks).to_numpy()
    sub = frame[keep].reset_index(drop=True)
    exposed_all, bubble_all = data.exposure()
    exposed, bubble = exposed_all[keep], bubble_all[keep]
    t_end = float(sub["end_s"].max())
    scale, unit = time_unit(t_end)
    legend_row = 0.3 if applied_injections(data.summary) else 0.0  # their legend's second row
    fig = new_figure(
        11.0, 1.9 + 0.5 * len(ranks) + legend_row, margins=(1.55, 1.35, 0.75, 0.95 + legend_row)
    )
    ax = fig.add_subplot()
    rank_col = sub["rank"].to_numpy()
    for row, rank in enumerate(ranks):
        mask = rank_col == rank
        rows = sub[mask]
        spans = _spans(rows, exposed[mask], bubble[mask], list(colors))
        for cat, color in colors.items():
            sel = spans[spans["cat"] == cat]
            if sel.empty:
                continue
            _rects(ax, sel["start"].to_numpy() * scale, sel["end"].to_numpy() * scale, row, color)
        _label_microbatches(ax, rows, row, scale, t_end * scale)
        # Thin communication slivers blend into the compute around them; say the shares.
        shown = spans["end"].sum() - spans["start"].sum()
        shares = (
            f"comm {100.0 * float(exposed[mask].sum()) / t_end:.0f}%\n"
            f"bubble {100.0 * float(bubble[mask].sum()) / t_end:.0f}%\n"
            f"idle {max(100.0 * (1.0 - shown / t_end), 0.0):.0f}%"
        )
        ax.text(1.01, row, shares, fontsize=7.5, va="center", ha="left",
                transform=ax.get_yaxis_transform())  # fmt: skip
    ax.set_yticks(range(len(ranks)))
    stage = "" if data.is_trace else "stage {} · "
    ax.set_yticklabels([f"{stage.format(layout.stage(r))}rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlim(0, t_end * scale)
    ax.set_xlabel(f"time ({unit})")
    handles = [
        Patch(facecolor=c, label={"comm": "exposed comm"}.get(k, k)) for k, c in colors.items()
    ]
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="idle"))
    legend = [*handles, *mark_injections(ax, data.summary, scale)]
    bottom_legend(fig, legend, ncol=7)
    parts = data.summary["breakdown_s"]
    step = data.step_time_s
    ax.set_title(
        f"step {step * scale:.3g} {unit}: bubble {parts.get('bubble', 0.0) / step:.1%}, "
        f"exposed comm {parts.get('exposed_comm', 0.0) / step:.1%} "
        f"(mean over all ranks; {len(ranks)} of {data.summary['ranks']} ranks shown)",
        fontsize=9,
        fontweight="normal",
        loc="left",
    )
    suptitle(fig, data, "timeline" if data.is_trace else "pipeline timeline")
    return fig


def _rects(ax: Axes, x0: np.ndarray, x1: np.ndarray, row: int, color: str) -> None:
    """Rectangles [x0, x1] x row±0.38 as one collection (broken_barh converts units per bar)."""
    y0, y1 = row - 0.38, row + 0.38
    verts = np.empty((len(x0), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = x0
    verts[:, 2, 0] = verts[:, 3, 0] = x1
    verts[:, 0, 1] = verts[:, 3, 1] = y0
    verts[:, 1, 1] = verts[:, 2, 1] = y1
    rects = PolyCollection(cast("Sequence[np.ndarray]", verts), facecolors=color, linewidths=0)
    ax.add_collection(rects, autolim=False)


def _label_microbatches(ax: Axes, rows: pd.DataFrame, y: int, scale: float, width: float) -> None:
    # Label each microbatch's compute (not the receive that waits for it).
    compute = np.isin(labels(rows["resource"]), COMPUTE_RESOURCES)
    sel = rows[rows["phase"].isin(["fwd", "bwd"]) & (rows["microbatch"] >= 0) & compute]
    if sel.empty:
        return
    ext = sel.groupby(["step", "phase", "microbatch"], observed=True).agg(
        t0=("start_s", "min"), t1=("end_s", "max")
    )
    for (_step, phase, mb), t0, t1 in zip(
        ext.index.tolist(), ext["t0"].tolist(), ext["t1"].tolist(), strict=True
    ):
        if (t1 - t0) * scale < 0.025 * width:
            continue
        label = f"{'F' if phase == 'fwd' else 'B'}{mb}"
        ax.text((t0 + t1) / 2 * scale, y, label, ha="center", va="center", fontsize=7, color="w")


# -- utilisation heat map -------------------------------------------------------------


@figure(
    "utilisation",
    "Engine and link utilisation",
    "Share of the traced time each rank spends per resource: compute columns count the "
    "ops each engine bounded; communication columns the time with an op of that group "
    "in flight (hidden or exposed).",
)
def utilisation_map(data: RunData) -> Figure | None:
    matrix, unit = utilisation(data)
    if matrix.empty:
        return None
    rows, cols = matrix.shape
    fig = new_figure(
        max(6.5, 1.2 * cols + 3.0), min(2.4 + 0.2 * rows, 11.0), margins=(0.8, 0.85, 0.7, 0.65)
    )
    ax = fig.add_subplot()
    img = ax.imshow(
        matrix.to_numpy() * 100.0, aspect="auto", cmap="viridis", vmin=0, vmax=100,
        interpolation="nearest",
    )  # fmt: skip
    ax.set_xticks(range(cols))
    ax.set_xticklabels(list(matrix.columns))
    step = max(1, int(np.ceil(rows / 32)))
    ax.set_yticks(range(0, rows, step))
    ax.set_yticklabels([str(i) for i in matrix.index[::step]])
    ax.set_ylabel(unit)
    ax.set_xlabel("resource")
    ax.spines[:].set_visible(False)
    if rows <= 16:
        values = matrix.to_numpy()
        for i in range(rows):
            for j in range(cols):
                v = float(values[i, j]) * 100.0
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=8,
                        color="black" if v > 60 else "white")  # fmt: skip
    bar = fig.colorbar(img, ax=ax, fraction=0.05, pad=0.03)
    bar.set_label("busy, % of traced time")
    noun = unit.split(" ")[0]
    what = f"{rows} {noun}s" + (", sampled" if "sampled" in unit else "")
    what += " (mean of each chip's ranks)" if noun == "chip" else ""
    col = "compute" if data.is_trace else "tensor"
    share = float(matrix[col].mean()) if col in matrix.columns else 0.0
    ax.set_title(
        f"{what} x {cols} resources; mean {col}{'' if data.is_trace else '-engine'} share "
        f"{share:.0%}",
        fontsize=9,
        fontweight="normal",
        loc="left",
    )
    suptitle(fig, data, "busy time per resource")
    return fig


# -- step-time breakdown --------------------------------------------------------------


def stacked_bars(
    ax: Axes,
    labels: Sequence[str],
    values: Sequence[dict[str, float]],
    colors: dict[str, str],
    *,
    unit: str,
    totals: Sequence[float] | None = None,
    value_fmt: str | None = None,
) -> None:
    """Horizontal stacked bars, one per label.

    Segments wide enough are labelled with their share of ``totals`` (default: the
    bar's sum), or with their value formatted by ``value_fmt``.
    """
    y = np.arange(len(labels))
    left = np.zeros(len(labels))
    totals_ = np.array(totals if totals is not None else [sum(v.values()) for v in values])
    for key, color in colors.items():
        widths = np.array([v.get(key, 0.0) for v in values])
        if not widths.any():
            continue
        ax.barh(y, widths, left=left, color=color, label=key.replace("_", " "), height=0.6)
        for i, (x0, w) in enumerate(zip(left, widths, strict=True)):
            share = w / totals_[i] if totals_[i] > 0 else 0.0
            if share >= 0.07:
                text = value_fmt.format(w) if value_fmt else f"{share:.0%}"
                ax.text(x0 + w / 2, i, text, ha="center", va="center",
                        color="white", fontsize=9, fontweight="bold")  # fmt: skip
        left += widths
    ax.set_yticks(y)
    ax.set_yticklabels([short(s, 40) for s in labels])
    ax.set_ylim(len(labels) - 0.4, -0.6)
    ax.set_xlabel(unit)


@figure(
    "breakdown",
    "Step-time breakdown",
    "Where the step goes, averaged over ranks: compute, communication not hidden behind "
    "compute, pipeline bubble, optimizer and the rest (waiting for slower ranks).",
)
def breakdown(data: RunData) -> Figure | None:
    parts = {k: float(v) for k, v in data.summary["breakdown_s"].items()}
    step = data.step_time_s
    scale, unit = time_unit(step)
    fig = new_figure(9.5, 2.9, margins=(0.3, 0.35, 0.45, 1.15))
    ax = fig.add_subplot()
    scaled = {k: v * scale for k, v in parts.items()}
    stacked_bars(ax, ["step"], [scaled], PART_COLORS, unit=f"time per step ({unit})")
    ax.set_yticks([])
    handles = [
        Patch(
            facecolor=PART_COLORS.get(k, "#999999"),
            label=f"{k.replace('_', ' ')}: {_num(v * scale, step * scale)} {unit} ({v / step:.1%})",
        )
        for k, v in parts.items()
    ]
    bottom_legend(fig, handles, ncol=3)
    ax.set_xlim(0, step * scale)
    suptitle(fig, data, f"where the {step * scale:.4g} {unit} step goes")
    return fig


# -- memory ---------------------------------------------------------------------------


def memory_bars(fig: Figure, ax: Axes, runs: Sequence[RunData]) -> None:
    labels = [r.label for r in runs]
    mems = [{k: float(v) for k, v in r.summary["memory_gib_per_chip"].items()} for r in runs]
    stacked_bars(ax, labels, mems, MEMORY_COLORS, unit="GiB per chip",
                 totals=[m.get("capacity", 0.0) for m in mems], value_fmt="{:.1f}")  # fmt: skip
    for i, m in enumerate(mems):
        cap = m.get("capacity", 0.0)
        ax.plot([cap, cap], [i - 0.4, i + 0.4], color="black", linewidth=2.0)
        ax.text(cap, i, f" capacity\n {cap:.0f} GiB", va="center", ha="left", fontsize=8)
        ax.text(m.get("total", 0.0), i, f" {m.get('total', 0.0):.1f} GiB", va="center",
                fontsize=9)  # fmt: skip
    ax.set_xlim(0, max(m.get("capacity", 0.0) for m in mems) * 1.14)
    if len(runs) == 1:
        m = mems[0]
        handles = [
            Patch(facecolor=c, label=f"{k} {m.get(k, 0.0):.1f} GiB")
            for k, c in MEMORY_COLORS.items()
        ]
        bottom_legend(fig, handles, ncol=4)
    else:
        bottom_legend(fig, *ax.get_legend_handles_labels(), ncol=4)


@figure(
    "memory",
    "Memory per chip",
    "HBM per chip on the most loaded pipeline stage, by category, against the chip's capacity "
    "(percentages are of capacity).",
)
def memory(data: RunData) -> Figure | None:
    mem = data.summary.get("memory_gib_per_chip")
    if not mem:
        return None
    fig = new_figure(9.5, 3.0, margins=(0.3, 0.35, 0.45, 0.95))
    ax = fig.add_subplot()
    memory_bars(fig, ax, [data])
    ax.set_yticks([])
    total, cap = float(mem.get("total", 0.0)), float(mem.get("capacity", 0.0))
    share = f" ({total / cap:.0%})" if cap else ""
    suptitle(fig, data, f"HBM per chip, {total:.1f} of {cap:.0f} GiB{share}")
    return fig


# -- cost -----------------------------------------------------------------------------


def cost_panels(fig: Figure, runs: Sequence[RunData]) -> None:
    labels = [short(r.label, 24) for r in runs]
    per_h = [float(r.summary["cost"]["usd_per_hour"]) for r in runs]
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860"]
    if any(r.is_trace for r in runs):  # a trace has no tokens: the price of a step
        per = [h * r.step_time_s / 3600.0 for h, r in zip(per_h, runs, strict=True)]
        second = (per, "$ per step", "${:,.4g}/step")
    else:
        per = [float(r.summary["cost"]["usd_per_million_tokens"]) for r in runs]
        second = (per, "$ per million tokens", "${:,.3f}/M tok")
    for k, (vals, unit, fmt) in enumerate(((per_h, "$ per hour (whole cluster)", "${:,.2f}/h"),
                                           second)):  # fmt: skip
        ax = fig.add_subplot(1, 2, k + 1)
        x = np.arange(len(runs))
        bars = ax.bar(x, vals, color=[colors[i % len(colors)] for i in x], width=0.55)
        ax.set_xlim(-0.5 - 0.5 / len(runs), len(runs) - 0.5 + 0.5 / len(runs))
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v, fmt.format(v), ha="center",
                    va="bottom", fontsize=9)  # fmt: skip
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=0 if len(runs) <= 3 else 20, ha="center")
        ax.set_ylabel(unit)
        ax.set_ylim(0, max(vals) * 1.2 if max(vals) > 0 else 1.0)
        ax.set_title(unit.split(" (")[0], fontsize=10)


@figure(
    "cost",
    "Cost",
    "The cluster's price per hour and what a million trained tokens cost at the simulated "
    "throughput.",
)
def cost(data: RunData) -> Figure | None:
    if "cost" not in data.summary:
        return None
    fig = new_figure(9.5, 3.4, margins=(0.85, 0.2, 0.65, 0.45))
    fig.subplots_adjust(wspace=0.35)
    cost_panels(fig, [data])
    c, tps = data.summary["cost"], float(data.summary.get("tokens_per_s") or 0.0)
    rate = f"{data.step_time_s * 1e3:,.4g} ms a step" if data.is_trace else f"{tps:,.0f} tokens/s"
    suptitle(fig, data, f"cost ({c.get('pricing', '')} pricing, {rate})")
    return fig
