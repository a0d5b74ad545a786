"""The engine-utilisation figure (``chip_model: engines``): how busy each engine of a
rank's cores is over the step (``engine_busy`` in ``summary.json``), and a window of
the engine timeline of the first representative core (``engines.parquet``)."""

from __future__ import annotations

from matplotlib.figure import Figure

from clustersim.report.data import RunData
from clustersim.report.figures import figure, new_figure, suptitle, time_unit

__all__ = ["engine_utilisation"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "hbm")
ENGINE_COLORS = {
    "tensor": "#4C72B0",
    "vector": "#55A868",
    "scalar": "#DD8452",
    "gpsimd": "#8172B2",
    "dma": "#937860",
    "hbm": "#8C8C8C",
}
WINDOW_CHUNKS = 400
"""Chunks of the timeline panel: enough for a layer's ops, few enough to read."""


@figure(
    "engines",
    "Engine utilisation",
    "Share of the step each engine of a rank's cores works, and its HBM share is busy "
    "(left; engine model). Right: the first ops of the first representative core, one "
    "row per engine, each bar a chunk of an op's tiles, solid as far as the engine worked "
    "and pale where it waited for tiles from upstream: overlap across engines is the "
    "pipelining the roofline model cannot show.",
)
def engine_utilisation(data: RunData) -> Figure | None:
    busy = data.summary.get("engine_busy")
    if not busy:
        return None
    fig = new_figure(11.0, 3.8)
    frame = data.engines
    with_timeline = frame is not None and len(frame) > 0
    axes = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 2.2]}) if with_timeline else None
    left = axes[0] if axes is not None else fig.add_subplot()
    names = [e for e in ENGINES if e in busy]
    values = [float(busy[e]) for e in names]
    left.barh(names[::-1], values[::-1], color=[ENGINE_COLORS[e] for e in names[::-1]])
    for y, v in enumerate(values[::-1]):
        left.text(min(v, 1.0) + 0.01, y, f"{v:.0%}", va="center", fontsize=8)
    left.set_xlim(0, 1.15)
    left.set_xlabel("busy share of the step")
    left.set_title("engines of one rank")
    if axes is not None and frame is not None:
        right = axes[1]
        first = frame[frame["rank"] == frame["rank"].iloc[0]].nsmallest(WINDOW_CHUNKS, "start_s")
        t0 = float(first["start_s"].min())
        scale, unit = time_unit(float(first["end_s"].max()) - t0)
        rows = [e for e in ENGINES if e in set(first["engine"].astype(str))]
        for y, eng in enumerate(rows):
            sel = first[first["engine"].astype(str) == eng]
            for s, e, b in zip(
                sel["start_s"].tolist(), sel["end_s"].tolist(), sel["busy_s"].tolist(),
                strict=True,
            ):  # fmt: skip
                # Opacity is the share of the chunk the engine worked; the rest it waited.
                share = min(b / (e - s), 1.0) if e > s else 1.0
                right.broken_barh(
                    [((s - t0) * scale, (e - s) * scale)], (y - 0.4, 0.8),
                    color=ENGINE_COLORS[eng], alpha=0.15 + 0.85 * share, linewidth=0,
                )  # fmt: skip
        right.set_yticks(range(len(rows)), rows)
        right.invert_yaxis()
        right.set_xlabel(f"time since the first op ({unit})")
        rank = int(first["rank"].iloc[0])
        right.set_title(f"rank {rank}: first {len(first)} chunks of tiles")
    suptitle(fig, data, "engine utilisation")
    return fig
