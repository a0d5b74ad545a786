"""The generic panel of ``topology.png``: an imported fabric graph without torus coordinates,
laid out by networkx (a seeded spring layout), every link coloured and widened by the
busier of its two directions' mean utilisation.

Graphs of up to :data:`MAX_NODES` nodes are drawn whole; larger ones show the busiest
domain's chips and the nodes one hop from them.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from clustersim.report.topology_tiers import (
    ROW_H,
    TIER_LABEL_W,
    Scale,
    bar_legend,
    link_cmap,
    place_axes,
    tier_panel,
    vmax,
)

__all__ = ["MAX_NODES", "graph_figure"]

MAX_NODES = 160
_LABELS_UP_TO = 48


def _cables(links: pd.DataFrame) -> pd.DataFrame:
    """One row per pair of linked nodes: the busier direction's mean utilisation."""
    real = links[links["src"].astype(str) != links["dst"].astype(str)]
    a = real["src"].astype(str).to_numpy()
    b = real["dst"].astype(str).to_numpy()
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    frame = pd.DataFrame({"a": lo, "b": hi, "util": real["mean_util"].to_numpy()})
    out: pd.DataFrame = frame.groupby(["a", "b"], as_index=False, sort=True).agg(
        util=("util", "max")
    )
    return out


def _shown(links: pd.DataFrame, cables: pd.DataFrame, domain: int) -> set[str]:
    nodes = set(cables["a"]) | set(cables["b"])
    if len(nodes) <= MAX_NODES:
        return nodes
    chips = links[(links["src_domain"] == domain) & (links["src_chip"] >= 0)]
    near = set(chips["src"].astype(str))
    near |= set(links[links["src"].astype(str).isin(near)]["dst"].astype(str))
    return set(sorted(near)[:MAX_NODES])


def graph_panel(ax: Axes, links: pd.DataFrame, domain: int) -> str:
    """Draw the graph on ``ax``; return what it shows, for the title."""
    cables = _cables(links)
    shown = _shown(links, cables, domain)
    cables = cables[cables["a"].isin(shown) & cables["b"].isin(shown)]
    chips = set(links.loc[links["src_chip"] >= 0, "src"].astype(str))
    g = nx.Graph()
    g.add_nodes_from(sorted(shown))
    g.add_edges_from(zip(cables["a"], cables["b"], strict=True))
    pos = nx.spring_layout(g, seed=0)
    util = cables["util"].to_numpy()
    scale = Scale(Normalize(0.0, vmax(util)), link_cmap())
    colors, widths = scale.colors(util), scale.widths(util)
    for (a, b), color, width in zip(zip(cables["a"], cables["b"], strict=True), colors, widths,
                                    strict=True):  # fmt: skip
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.plot([x0, x1], [y0, y1], color=color, linewidth=float(width), zorder=1)
    for is_chip, marker, size in ((True, "o", 40), (False, "s", 70)):
        names = [n for n in g.nodes if (n in chips) == is_chip]
        if names:
            xy = np.asarray([pos[n] for n in names])
            ax.scatter(xy[:, 0], xy[:, 1], marker=marker, s=size, color="#4C72B0" if is_chip
                       else "#55A868", edgecolors="white", zorder=2,
                       label="chip" if is_chip else "switch or NIC")  # fmt: skip
    if g.number_of_nodes() <= _LABELS_UP_TO:
        for name, (x, y) in pos.items():
            ax.annotate(name, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    bar = ax.figure.colorbar(
        ScalarMappable(norm=scale.norm, cmap=scale.cmap), ax=ax, fraction=0.03, pad=0.01
    )
    bar.set_label("mean utilisation", fontsize=8)
    whole = g.number_of_nodes() == len(set(_cables(links)[["a", "b"]].to_numpy().ravel()))
    return "the whole graph" if whole else f"domain {domain} and its neighbours"


def graph_figure(links: pd.DataFrame, domain: int, tiers: pd.DataFrame, *, folded: bool) -> Figure:
    width = 11.0
    graph_h = 5.0
    bars_h = ROW_H * len(tiers) + 0.1
    height = 0.55 + graph_h + 0.9 + 0.35 + bars_h + 1.0 + 0.3 * folded
    fig = Figure(figsize=(width, height), dpi=100)
    ax = place_axes(fig, 0.4, 0.85, width - 0.8, graph_h)
    what = graph_panel(ax, links, domain)
    ax.set_title(f"the imported fabric graph ({what}), spring layout", fontsize=10, loc="left")
    top = 0.55 + graph_h + 0.9
    bars = place_axes(fig, TIER_LABEL_W + 0.3, top + 0.35, width - TIER_LABEL_W - 0.6, bars_h)
    tier_panel(bars, tiers, folded=folded)
    bar_legend(fig, bars, folded=folded)
    return fig
