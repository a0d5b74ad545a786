"""Link utilisation drawn on the topology (``topology.png``), from the run's link table.

- **Torus fabrics** (Trn1/Trn2 instances, the Trn2 UltraServer): the chips of one
  scale-up domain (the busiest) at their torus coordinates, every link an arrow
  coloured and widened by its mean utilisation. The two directions of a pair of
  neighbours run side by side; a wrap-around link is drawn as two stubs, one leaving
  its source at the edge of the grid and one entering its target from the other edge.
  A 3D torus gets one panel per Z plane and a panel of its Z rings, aggregated.
- **Switch fabrics** (NVSwitch, NeuronSwitch, NVL72): each chip's up and down link
  to the switch tier, for the busiest domain.
- **Imported graphs** without torus coordinates (``cluster.fabric_file``): the graph
  itself in a spring layout, every cable coloured by its busier direction
  (:mod:`.topology_graph`).
- **Every fabric**: a panel of mean, busiest-link and peak utilisation per tier of
  links (on-chip DMA, torus axes, switch and EFA tiers such as chip to leaf and leaf
  to spine), over the whole cluster.

A folded run loads only the representative groups' links (they carry the traffic
of every replica); the figure says so, draws the other links as not simulated, and
averages each tier over the loaded links.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from clustersim.report.data import RunData
from clustersim.report.figures import figure, short
from clustersim.report.topology_graph import graph_figure
from clustersim.report.topology_tiers import (
    DOWN_COLOR,
    ROW_H,
    TIER_LABEL_W,
    UP_COLOR,
    bar_legend,
    place_axes,
    tier_panel,
    tier_table,
    vmax,
)
from clustersim.report.topology_torus import torus_figure, torus_links
from clustersim.trace.links import LINK_COLUMNS

__all__ = ["tier_table", "topology"]

_MAX_SWITCH_CHIPS = 128


def _busiest_domain(links: pd.DataFrame) -> int:
    """The domain whose links carried the most bytes (the first of those within rounding)."""
    by = links[links["src_domain"] >= 0].groupby("src_domain")["bytes"].sum()
    if by.empty:
        return 0
    top = float(by.max())
    return int(by.index[by.to_numpy() >= top * (1 - 1e-6)][0])


# -- switch ---------------------------------------------------------------------------


def _switch_panel(ax: Axes, links: pd.DataFrame, domain: int) -> bool:
    """Each chip's up and down link to its switch tier in ``domain``; False if none."""
    tier = links["tier"].astype(str).to_numpy()
    kind = links["kind"].astype(str).to_numpy()
    sw = kind == "switch"
    up = links[
        sw & (links["src_chip"] >= 0).to_numpy() & (links["src_domain"] == domain).to_numpy()
    ]
    down = links[
        sw & (links["dst_chip"] >= 0).to_numpy() & (links["dst_domain"] == domain).to_numpy()
    ]
    if up.empty and down.empty:
        return False
    up = up.sort_values("src_chip").head(_MAX_SWITCH_CHIPS)
    down = down.sort_values("dst_chip").head(_MAX_SWITCH_CHIPS)
    chips = sorted(set(up["src_chip"].tolist()) | set(down["dst_chip"].tolist()))
    x = {c: i for i, c in enumerate(chips)}
    w = 0.4
    up_name = str(tier[up.index[0]]).replace("->", " → ") if len(up) else "up"
    down_name = str(tier[down.index[0]]).replace("->", " → ") if len(down) else "down"
    ax.bar([x[c] - w / 2 for c in up["src_chip"]], up["mean_util"] * 100.0, width=w,
           color=UP_COLOR, label=f"up: {up_name}")  # fmt: skip
    ax.bar([x[c] + w / 2 for c in down["dst_chip"]], down["mean_util"] * 100.0, width=w,
           color=DOWN_COLOR, label=f"down: {down_name}")  # fmt: skip
    step = max(1, len(chips) // 24)
    ax.set_xticks(range(0, len(chips), step))
    ax.set_xticklabels([str(c) for c in chips[::step]], fontsize=8)
    ax.set_xlim(-0.6, len(chips) - 0.4)
    top = max(float(up["mean_util"].max()) if len(up) else 0.0,
              float(down["mean_util"].max()) if len(down) else 0.0)  # fmt: skip
    ax.set_ylim(0, max(vmax(np.asarray([top])) * 100.0 * 1.12, 1.0))
    ax.set_xlabel("chip")
    ax.set_ylabel("mean utilisation (%)")
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    ax.grid(axis="y", color="#E5E5E5", linewidth=0.8)
    ax.set_axisbelow(True)
    return True


def _note(fig: Figure, *, folded: bool) -> None:
    if folded:
        fig.text(0.01, 0.008,
                 "Folded run: only the links of the representative groups are simulated; they "
                 "carry every replica's traffic, so their utilisation stands for the links they "
                 "are images of (drawn dotted, not simulated).",
                 fontsize=8, style="italic", va="bottom")  # fmt: skip


@figure(
    "topology",
    "Link utilisation on the topology",
    "Mean utilisation of every link over the run (load / capacity, time-weighted), drawn "
    "on the scale-up fabric of the busiest domain (torus grid or switch), and per tier "
    "of links over the whole cluster (on-chip DMA, torus axes, switch and EFA tiers) with "
    "each tier's busiest link and peak.",
)
def topology(data: RunData) -> Figure | None:
    links = data.links
    if links is None or links.empty or any(c not in links.columns for c in LINK_COLUMNS):
        return None
    folded = str(data.summary.get("fidelity", "")) == "folded"
    domain = _busiest_domain(links)
    tiers = tier_table(links, folded=folded)
    torus, dims = torus_links(links, domain)
    n = _domains(links)
    noun = "instance" if int(data.summary.get("instances", n)) == n else "UltraServer"
    which = f"{noun} {domain} of {n} (the busiest)" if n > 1 else f"the {noun}"
    if not torus.empty:
        fig = torus_figure(links, torus, dims, domain=domain, tiers=tiers, which=which,
                            folded=folded)  # fmt: skip
        what = "torus"
    elif data.summary.get("fabric_file"):
        fig = graph_figure(links, domain, tiers, folded=folded)
        what = "fabric graph"
    else:
        fig = _switch_figure(links, domain, tiers, which, folded=folded)
        what = "fabric"
    _note(fig, folded=folded)
    fig.suptitle(f"{short(data.name)}: link utilisation on the {what}",
                 fontweight="bold", fontsize=12, y=1 - 0.12 / fig.get_size_inches()[1],
                 va="top")  # fmt: skip
    return fig


def _domains(links: pd.DataFrame) -> int:
    known = links["src_domain"][links["src_domain"] >= 0]
    return int(known.max()) + 1 if len(known) else 1


def _switch_figure(links: pd.DataFrame, domain: int, tiers: pd.DataFrame, which: str, *,
                   folded: bool) -> Figure:  # fmt: skip
    width = 11.0
    bars_h = ROW_H * len(tiers) + 0.1
    has_switch = bool((links["kind"].astype(str) == "switch").any())
    top_h = 2.4 if has_switch else 0.0
    height = 0.55 + (top_h + 0.9 if has_switch else 0.0) + 0.35 + bars_h + 1.0 + 0.3 * folded
    fig = Figure(figsize=(width, height), dpi=100)
    top = 0.55
    if has_switch:
        ax = place_axes(fig, 0.8, top + 0.3, width - 1.1, top_h)
        _switch_panel(ax, links, domain)
        ax.set_title(f"each chip's links to its switch tier, {which}", fontsize=10, loc="left")
        top += top_h + 0.9
    bars = place_axes(fig, TIER_LABEL_W + 0.3, top + 0.35, width - TIER_LABEL_W - 0.6, bars_h)
    tier_panel(bars, tiers, folded=folded)
    bar_legend(fig, bars, folded=folded)
    return fig
