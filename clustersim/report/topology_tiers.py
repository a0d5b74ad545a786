"""The tiers panel of ``topology.png`` (mean, busiest-link and peak utilisation per
tier of links, over the whole cluster) and what the topology figure's panels share:
the colour scale, the tier names, axes placed in inches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, ListedColormap, Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

__all__ = [
    "BUSY_COLOR",
    "DOWN_COLOR",
    "IDLE",
    "KINDS",
    "KIND_LABELS",
    "MEAN_COLOR",
    "RGBA",
    "ROW_H",
    "TIER_LABEL_W",
    "UP_COLOR",
    "Scale",
    "bar_legend",
    "link_cmap",
    "pct",
    "place_axes",
    "tier_panel",
    "tier_table",
    "vmax",
]

KIND_LABELS = {
    "local": "on-chip DMA",
    "neuronlink": "NeuronLink",
    "switch": "scale-up switch",
    "efa": "EFA",
}
KINDS = tuple(KIND_LABELS)
RGBA = tuple[float, float, float, float]
IDLE: RGBA = to_rgba("#C8C8C8")
MEAN_COLOR, BUSY_COLOR = "#4C72B0", "#DD8452"
UP_COLOR, DOWN_COLOR = "#55A868", "#8172B2"
_NICE = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)


def link_cmap() -> Colormap:
    """Pale (idle) to dark (busy), without magma's palest end, which vanishes on white."""
    return ListedColormap(colormaps["magma_r"](np.linspace(0.12, 0.92, 256)), name="links")


def vmax(values: np.ndarray) -> float:
    """The colour scale's top: the smallest of a few round numbers above the largest value."""
    top = float(values.max()) if values.size else 0.0
    return next((v for v in _NICE if top <= v + 1e-12), 1.0)


@dataclass(frozen=True)
class Scale:
    """A link utilisation's colour and width, on a scale from 0 to ``norm.vmax``."""

    norm: Normalize
    cmap: Colormap

    def colors(self, util: np.ndarray) -> list[RGBA]:
        """The colour of each utilisation, in one pass over the colour map."""
        rgba = np.asarray(self.cmap(np.clip(np.asarray(util, dtype=float) / self.top, 0, 1)))
        return [(float(r), float(g), float(b), float(a)) for r, g, b, a in rgba.tolist()]

    def widths(self, util: np.ndarray) -> np.ndarray:
        return 1.0 + 3.0 * np.clip(np.asarray(util, dtype=float) / self.top, 0.0, 1.0)

    @property
    def top(self) -> float:
        return float(self.norm.vmax or 1.0)


def pct(value: float) -> str:
    v = 100.0 * value
    return "0%" if v == 0 else (f"{v:.2g}%" if v < 10 else f"{v:.0f}%")


# -- tiers ----------------------------------------------------------------------------


def _level(node_type: str) -> int:
    """Height of a node type in the fabric: chips at 0, first switch tier 1, spines above."""
    if node_type == "chip":
        return 0
    if node_type.startswith("spine") and node_type[5:].isdigit():
        return int(node_type[5:])
    return 2 if node_type == "nlspine" else 1


def _tier_key(kind_tier: tuple[str, str]) -> tuple[int, int, int, str]:
    """On-chip, then scale-up (torus axes, switch tiers), then scale-out; in each fabric
    up the tree tier by tier, then down again."""
    kind, tier = kind_tier
    order = KINDS.index(kind) if kind in KINDS else len(KINDS)
    src, _, dst = tier.partition("->")
    if not dst:
        return (order, 0, 0, tier)
    a, b = _level(src), _level(dst)
    return (order, 0, a, tier) if b > a else (order, 1, -a, tier)


def _tier_label(tier: str, kind: str) -> str:
    text = "on-chip DMA" if tier == "local" else tier.replace("->", " → ")
    if tier != "local":
        text += f" ({KIND_LABELS.get(kind, kind)})"
    return text


def tier_table(links: pd.DataFrame, *, folded: bool) -> pd.DataFrame:
    """Per tier: links (loaded ones), GB carried, mean utilisation over the links (over
    the loaded ones when ``folded``), the busiest link's mean and the peak utilisation."""
    rows = []
    tier_col = links["tier"].astype(str).to_numpy()
    kind_col = links["kind"].astype(str).to_numpy()
    pairs = set(zip(kind_col.tolist(), tier_col.tolist(), strict=True))
    for kind, tier in sorted(pairs, key=_tier_key):
        sub = links[(tier_col == tier) & (kind_col == kind)]
        loaded = sub[sub["bytes"] > 0]
        basis = loaded if folded else sub
        rows.append(
            {
                "tier": tier,
                "label": _tier_label(tier, kind),
                "links": len(sub),
                "loaded": len(loaded),
                "gbytes": float(sub["bytes"].sum()) / 1e9,
                "mean": float(basis["mean_util"].mean()) if len(basis) else 0.0,
                "busiest": float(sub["mean_util"].max()),
                "peak": float(sub["peak_util"].max()),
            }
        )
    return pd.DataFrame(rows)


def _gb(gbytes: float) -> str:
    if gbytes >= 1000:
        return f"{gbytes / 1000:,.3g} TB" if gbytes < 1e6 else f"{gbytes / 1e6:,.3g} PB"
    return f"{gbytes:.3g} GB"


def mean_label(folded: bool) -> str:
    return "mean over " + ("the loaded links" if folded else "the tier's links")


def tier_panel(ax: Axes, table: pd.DataFrame, *, folded: bool) -> None:
    n = len(table)
    y = np.arange(n)
    h = 0.36
    mean = table["mean"].to_numpy() * 100.0
    busy = table["busiest"].to_numpy() * 100.0
    peak = table["peak"].to_numpy() * 100.0
    ax.barh(y - h / 2, mean, height=h, color=MEAN_COLOR, label=mean_label(folded))
    ax.barh(y + h / 2, busy, height=h, color=BUSY_COLOR, label="busiest link, mean")
    ax.scatter(peak, y, marker="|", s=260, color="black", linewidths=2.0, zorder=3,
               label="peak (any link, any instant)")  # fmt: skip
    labels = []
    for i, row in enumerate(table.to_dict("records")):
        ax.text(max(float(mean[i]), 0.0) + 1.0, i - h / 2, pct(float(row["mean"])),
                va="center", fontsize=7.5)  # fmt: skip
        ax.text(max(float(busy[i]), 0.0) + 1.0, i + h / 2, pct(float(row["busiest"])),
                va="center", fontsize=7.5)  # fmt: skip
        n_links, loaded = int(row["links"]), int(row["loaded"])
        count = f"{loaded} of {n_links} loaded" if folded else f"{n_links} links"
        labels.append(f"{row['label']}\n{count}, {_gb(float(row['gbytes']))}")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(n - 0.45, -0.55)
    ax.set_xlim(0, 109)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.set_xlabel("utilisation, % of capacity (time-weighted over the run)")
    ax.set_title("all links, by tier", fontsize=10, loc="left")
    ax.grid(axis="x", color="#E5E5E5", linewidth=0.8)
    ax.set_axisbelow(True)


def place_axes(fig: Figure, left: float, top: float, width: float, height: float) -> Axes:
    """Axes placed in inches: ``left`` from the left edge, ``top`` down from the top edge."""
    fw, fh = fig.get_size_inches()
    return fig.add_axes((left / fw, 1 - (top + height) / fh, width / fw, height / fh))


def bar_legend(fig: Figure, ax: Axes, *, folded: bool) -> None:
    handles = [
        Patch(facecolor=MEAN_COLOR, label=mean_label(folded)),
        Patch(facecolor=BUSY_COLOR, label="busiest link, mean"),
        Line2D([], [], color="black", marker="|", linestyle="none", markersize=9,
               markeredgewidth=2, label="peak (any link, any instant)"),
    ]  # fmt: skip
    box = ax.get_position()
    fig.legend(handles=handles, loc="upper left", ncol=2, fontsize=8, handlelength=1.2,
               columnspacing=1.5, bbox_to_anchor=(box.x0, box.y0 - 0.5 / fig.get_size_inches()[1]),
               borderaxespad=0.0)  # fmt: skip


TIER_LABEL_W = 2.4  # inches left of the tier bars for their labels
ROW_H = 0.5  # inches per tier
