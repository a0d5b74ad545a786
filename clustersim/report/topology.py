"""Link utilisation drawn on the topology (``topology.png``), from the run's link table.

- **Torus fabrics** (Trn1/Trn2 instances, the Trn2 UltraServer): the chips of one
  scale-up domain (the busiest) at their torus coordinates, every link an arrow
  coloured and widened by its mean utilisation. The two directions of a pair of
  neighbours run side by side; a wrap-around link is drawn as two stubs, one leaving
  its source at the edge of the grid and one entering its target from the other edge.
  A 3D torus gets one panel per Z plane and a panel of its Z rings, aggregated.
- **Switch fabrics** (NVSwitch, NeuronSwitch, NVL72): each chip's up and down link
  to the switch tier, for the busiest domain.
- **Every fabric**: a panel of mean, busiest-link and peak utilisation per tier of
  links (on-chip DMA, torus axes, switch and EFA tiers such as chip to leaf and leaf
  to spine), over the whole cluster.

A folded run loads only the representative groups' links (they carry the traffic
of every replica); the figure says so, draws the other links as not simulated, and
averages each tier over the loaded links.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Colormap, ListedColormap, Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator, PercentFormatter

from clustersim.report.data import RunData
from clustersim.report.figures import figure, short
from clustersim.trace.links import LINK_COLUMNS

__all__ = ["topology"]

_AXES = ("x", "y", "z")
_KIND_LABELS = {
    "local": "on-chip DMA",
    "neuronlink": "NeuronLink",
    "switch": "scale-up switch",
    "efa": "EFA",
}
_KINDS = tuple(_KIND_LABELS)
RGBA = tuple[float, float, float, float]
_IDLE: RGBA = to_rgba("#C8C8C8")
_MEAN_COLOR, _BUSY_COLOR = "#4C72B0", "#DD8452"
_UP_COLOR, _DOWN_COLOR = "#55A868", "#8172B2"
_NICE = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
_MAX_SWITCH_CHIPS = 128
_MAX_PLANES = 8


def _cmap() -> Colormap:
    """Pale (idle) to dark (busy), without magma's palest end, which vanishes on white."""
    return ListedColormap(colormaps["magma_r"](np.linspace(0.12, 0.92, 256)), name="links")


def _vmax(values: np.ndarray) -> float:
    """The colour scale's top: the smallest of a few round numbers above the largest value."""
    top = float(values.max()) if values.size else 0.0
    return next((v for v in _NICE if top <= v + 1e-12), 1.0)


@dataclass(frozen=True)
class _Scale:
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


def _pct(value: float) -> str:
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
    order = _KINDS.index(kind) if kind in _KINDS else len(_KINDS)
    src, _, dst = tier.partition("->")
    if not dst:
        return (order, 0, 0, tier)
    a, b = _level(src), _level(dst)
    return (order, 0, a, tier) if b > a else (order, 1, -a, tier)


def _tier_label(tier: str, kind: str) -> str:
    text = "on-chip DMA" if tier == "local" else tier.replace("->", " → ")
    if tier != "local":
        text += f" ({_KIND_LABELS.get(kind, kind)})"
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


def _mean_label(folded: bool) -> str:
    return "mean over " + ("the loaded links" if folded else "the tier's links")


def _tier_panel(ax: Axes, table: pd.DataFrame, *, folded: bool) -> None:
    n = len(table)
    y = np.arange(n)
    h = 0.36
    mean = table["mean"].to_numpy() * 100.0
    busy = table["busiest"].to_numpy() * 100.0
    peak = table["peak"].to_numpy() * 100.0
    ax.barh(y - h / 2, mean, height=h, color=_MEAN_COLOR, label=_mean_label(folded))
    ax.barh(y + h / 2, busy, height=h, color=_BUSY_COLOR, label="busiest link, mean")
    ax.scatter(peak, y, marker="|", s=260, color="black", linewidths=2.0, zorder=3,
               label="peak (any link, any instant)")  # fmt: skip
    labels = []
    for i, row in enumerate(table.to_dict("records")):
        ax.text(max(float(mean[i]), 0.0) + 1.0, i - h / 2, _pct(float(row["mean"])),
                va="center", fontsize=7.5)  # fmt: skip
        ax.text(max(float(busy[i]), 0.0) + 1.0, i + h / 2, _pct(float(row["busiest"])),
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


# -- torus ----------------------------------------------------------------------------


def _busiest_domain(links: pd.DataFrame) -> int:
    """The domain whose links carried the most bytes (the first of those within rounding)."""
    by = links[links["src_domain"] >= 0].groupby("src_domain")["bytes"].sum()
    if by.empty:
        return 0
    top = float(by.max())
    return int(by.index[by.to_numpy() >= top * (1 - 1e-6)][0])


def _torus_links(links: pd.DataFrame, domain: int) -> tuple[pd.DataFrame, tuple[int, int, int]]:
    tier = links["tier"].astype(str)
    sel = links[
        tier.str.startswith("torus ").to_numpy()
        & (links["src_domain"] == domain).to_numpy()
        & (links["src_x"] >= 0).to_numpy()
    ]
    chips = _domain_chips(links, domain)
    dims = tuple(int(chips[a].max()) + 1 for a in _AXES) if len(chips) else (1, 1, 1)
    return sel, (dims[0], dims[1], dims[2])


def _domain_chips(links: pd.DataFrame, domain: int) -> pd.DataFrame:
    """Chip, x, y, z of the chips of ``domain`` (from the links' source ends)."""
    sub = links[(links["src_domain"] == domain) & (links["src_chip"] >= 0)]
    out = sub[["src_chip", "src_x", "src_y", "src_z"]].drop_duplicates("src_chip")
    out.columns = pd.Index(["chip", "x", "y", "z"])
    return out.sort_values("chip")


class _Arrows:
    """Axis-parallel arrows drawn in bulk: the shafts as one ``LineCollection``, the heads
    as one scatter per direction (far cheaper than a patch per arrow)."""

    _MARKERS: ClassVar[dict[tuple[int, int], str]] = {
        (1, 0): ">", (-1, 0): "<", (0, 1): "v", (0, -1): "^"  # y grows downwards
    }  # fmt: skip

    def __init__(self, points_per_unit: float) -> None:
        self.ppu = points_per_unit
        self.segments: list[list[tuple[float, float]]] = []
        self.colors: list[RGBA] = []
        self.widths: list[float] = []
        self.styles: list[str] = []
        self.heads: dict[str, tuple[list[float], list[float], list[RGBA], list[float]]] = {}

    def add(self, a: tuple[float, float], b: tuple[float, float], u: tuple[int, int],
            color: RGBA, width: float, *, dotted: bool = False) -> None:  # fmt: skip
        head = 4.0 + 1.5 * width  # points
        back = 0.8 * head / self.ppu
        self.segments.append([a, (b[0] - u[0] * back, b[1] - u[1] * back)])
        self.colors.append(color)
        self.widths.append(width)
        self.styles.append("dotted" if dotted else "solid")
        xs, ys, cs, ss = self.heads.setdefault(self._MARKERS[u], ([], [], [], []))
        xs.append(b[0] - u[0] * 0.5 * head / self.ppu)
        ys.append(b[1] - u[1] * 0.5 * head / self.ppu)
        cs.append(color)
        ss.append(head**2)

    def draw(self, ax: Axes) -> None:
        if not self.segments:
            return
        lines = LineCollection(self.segments, colors=self.colors, linewidths=self.widths,
                               linestyles=self.styles, capstyle="butt", zorder=2)  # fmt: skip
        ax.add_collection(lines, autolim=False)
        for marker, (xs, ys, cs, ss) in self.heads.items():
            ax.scatter(xs, ys, s=ss, c=cs, marker=marker, linewidths=0, zorder=2)


def _plane_panel(
    ax: Axes,
    chips: pd.DataFrame,
    plane: pd.DataFrame,
    dims: tuple[int, int],
    scale: _Scale,
    *,
    folded: bool,
    cell: float,
) -> None:
    nx_, ny = dims
    half, lane = 0.2, 0.1  # chip half-size; offset of each direction from the centre line
    arrows = _Arrows(cell * 72.0)
    for chip, x, y in zip(chips["chip"].tolist(), chips["x"].tolist(), chips["y"].tolist(),
                          strict=True):  # fmt: skip
        ax.add_artist(Rectangle((x - half, y - half), 2 * half, 2 * half, facecolor="white",
                               edgecolor="#555555", linewidth=1.0, zorder=3))  # fmt: skip
        ax.text(x, y, str(chip), ha="center", va="center", fontsize=7, zorder=4)
    size = {"x": nx_, "y": ny}
    cols = ("tier", "src_x", "src_y", "dst_x", "dst_y", "bytes")
    utils = plane["mean_util"].to_numpy()
    colors, widths = scale.colors(utils), scale.widths(utils).tolist()
    for i, (tier, x0, y0, x1, y1, nbytes) in enumerate(zip(
        *(plane[c].astype(str if c == "tier" else float).tolist() for c in cols), strict=True
    )):  # fmt: skip
        sx, sy, dx, dy = x0, y0, x1, y1
        axis = str(tier)[-1]
        if axis not in size:
            continue
        delta = (dx - sx) if axis == "x" else (dy - sy)
        n = size[axis]
        wrap = abs(delta) > 1 and n > 2
        step = (-1.0 if delta > 0 else 1.0) if wrap else (1.0 if delta > 0 else -1.0)
        # Two lanes: + direction above (x links) or right (y links) of the centre line.
        if axis == "x":
            off, ux, uy = (-lane if step > 0 else lane), step, 0.0
            sy, dy = sy + off, dy + off
        else:
            off, ux, uy = (lane if step > 0 else -lane), 0.0, step
            sx, dx = sx + off, dx + off
        u = (int(ux), int(uy))
        idle = nbytes <= 0
        color = _IDLE if idle else colors[i]
        width = 0.8 if idle else widths[i]
        dotted = idle and folded
        if not wrap:
            a = (sx + ux * half, sy + uy * half)
            b = (dx - ux * half, dy - uy * half)
            arrows.add(a, b, u, color, width, dotted=dotted)
        else:
            stub = 0.46
            arrows.add((sx + ux * half, sy + uy * half), (sx + ux * stub, sy + uy * stub), u,
                       color, width, dotted=dotted)  # fmt: skip
            arrows.add((dx - ux * stub, dy - uy * stub), (dx - ux * half, dy - uy * half), u,
                       color, width, dotted=dotted)  # fmt: skip
    arrows.draw(ax)
    _grid_axes(ax, nx_, ny)


def _z_panel(ax: Axes, zlinks: pd.DataFrame, dims: tuple[int, int, int], scale: _Scale,
             *, folded: bool) -> None:  # fmt: skip
    nx_, ny, nz = dims
    grid = np.full((ny, nx_), np.nan)
    busiest = np.zeros((ny, nx_))
    xs, ys = zlinks["src_x"].to_numpy(), zlinks["src_y"].to_numpy()
    util, loaded = zlinks["mean_util"].to_numpy(), zlinks["bytes"].to_numpy() > 0
    for y in range(ny):
        for x in range(nx_):
            ring = (xs == x) & (ys == y)
            basis = ring & loaded if folded else ring
            if basis.any():
                grid[y, x] = float(util[basis].mean())
            if ring.any():
                busiest[y, x] = float(util[ring].max())
    faces = scale.colors(np.nan_to_num(grid.ravel()))
    for y in range(ny):
        for x in range(nx_):
            v = grid[y, x]
            face = _IDLE if np.isnan(v) else faces[y * nx_ + x]
            ax.add_artist(Rectangle((x - 0.45, y - 0.45), 0.9, 0.9, facecolor=face,
                                   edgecolor="white", linewidth=1.0))  # fmt: skip
            if np.isnan(v):
                text, dark = "–", False
            else:
                text = f"{_pct(float(v))}\nmax {_pct(float(busiest[y, x]))}"
                dark = float(v) / scale.top > 0.55
            ax.text(x, y, text, ha="center", va="center", fontsize=6.5,
                    color="white" if dark else "black")  # fmt: skip
    _grid_axes(ax, nx_, ny)
    ax.set_title(f"Z rings ({2 * nz if nz > 2 else nz} links each):\nmean and busiest link",
                 fontsize=9, fontweight="normal")  # fmt: skip


def _legend_handles(*, folded: bool, wraps: bool) -> list[object]:
    handles: list[object] = [
        Line2D([], [], color=_IDLE, linewidth=0.8,
               linestyle="dotted" if folded else "solid",
               label="not simulated (folded run)" if folded else "idle link"),
    ]  # fmt: skip
    if wraps:
        handles.append(
            Line2D(
                [],
                [],
                color="#666666",
                linewidth=1.5,
                marker=">",
                markersize=4,
                label="stubs at the edges: wrap-around links",
            )
        )
    return handles


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
           color=_UP_COLOR, label=f"up: {up_name}")  # fmt: skip
    ax.bar([x[c] + w / 2 for c in down["dst_chip"]], down["mean_util"] * 100.0, width=w,
           color=_DOWN_COLOR, label=f"down: {down_name}")  # fmt: skip
    step = max(1, len(chips) // 24)
    ax.set_xticks(range(0, len(chips), step))
    ax.set_xticklabels([str(c) for c in chips[::step]], fontsize=8)
    ax.set_xlim(-0.6, len(chips) - 0.4)
    top = max(float(up["mean_util"].max()) if len(up) else 0.0,
              float(down["mean_util"].max()) if len(down) else 0.0)  # fmt: skip
    ax.set_ylim(0, max(_vmax(np.asarray([top])) * 100.0 * 1.12, 1.0))
    ax.set_xlabel("chip")
    ax.set_ylabel("mean utilisation (%)")
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    ax.grid(axis="y", color="#E5E5E5", linewidth=0.8)
    ax.set_axisbelow(True)
    return True


# -- the figure -----------------------------------------------------------------------


def _axes(fig: Figure, left: float, top: float, width: float, height: float) -> Axes:
    """Axes placed in inches: ``left`` from the left edge, ``top`` down from the top edge."""
    fw, fh = fig.get_size_inches()
    return fig.add_axes((left / fw, 1 - (top + height) / fh, width / fw, height / fh))


def _bar_legend(fig: Figure, ax: Axes, *, folded: bool) -> None:
    handles = [
        Patch(facecolor=_MEAN_COLOR, label=_mean_label(folded)),
        Patch(facecolor=_BUSY_COLOR, label="busiest link, mean"),
        Line2D([], [], color="black", marker="|", linestyle="none", markersize=9,
               markeredgewidth=2, label="peak (any link, any instant)"),
    ]  # fmt: skip
    box = ax.get_position()
    fig.legend(handles=handles, loc="upper left", ncol=2, fontsize=8, handlelength=1.2,
               columnspacing=1.5, bbox_to_anchor=(box.x0, box.y0 - 0.5 / fig.get_size_inches()[1]),
               borderaxespad=0.0)  # fmt: skip


def _note(fig: Figure, *, folded: bool) -> None:
    if folded:
        fig.text(0.01, 0.008,
                 "Folded run: only the links of the representative groups are simulated; they "
                 "carry every replica's traffic, so their utilisation stands for the links they "
                 "are images of (drawn dotted, not simulated).",
                 fontsize=8, style="italic", va="bottom")  # fmt: skip


_TIER_LABEL_W = 2.4  # inches left of the tier bars for their labels
_ROW_H = 0.5  # inches per tier


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
    torus, dims = _torus_links(links, domain)
    n = _domains(links)
    noun = "instance" if int(data.summary.get("instances", n)) == n else "UltraServer"
    which = f"{noun} {domain} of {n} (the busiest)" if n > 1 else f"the {noun}"
    if not torus.empty:
        fig = _torus_figure(links, torus, dims, domain=domain, tiers=tiers, which=which,
                            folded=folded)  # fmt: skip
        what = "torus"
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
    bars_h = _ROW_H * len(tiers) + 0.1
    has_switch = bool((links["kind"].astype(str) == "switch").any())
    top_h = 2.4 if has_switch else 0.0
    height = 0.55 + (top_h + 0.9 if has_switch else 0.0) + 0.35 + bars_h + 1.0 + 0.3 * folded
    fig = Figure(figsize=(width, height), dpi=100)
    top = 0.55
    if has_switch:
        ax = _axes(fig, 0.8, top + 0.3, width - 1.1, top_h)
        _switch_panel(ax, links, domain)
        ax.set_title(f"each chip's links to its switch tier, {which}", fontsize=10, loc="left")
        top += top_h + 0.9
    bars = _axes(fig, _TIER_LABEL_W + 0.3, top + 0.35, width - _TIER_LABEL_W - 0.6, bars_h)
    _tier_panel(bars, tiers, folded=folded)
    _bar_legend(fig, bars, folded=folded)
    return fig


def _grid_axes(ax: Axes, nx_: int, ny: int) -> None:
    """Axes for a torus plane: chips at integer (x, y), y growing downwards."""
    ax.set_xlim(-0.5, nx_ - 0.5)
    ax.set_ylim(ny - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks(range(nx_))
    ax.set_yticks(range(ny))
    ax.set_xlabel("x", labelpad=1)
    ax.set_ylabel("y", labelpad=1)
    ax.tick_params(length=0, labelsize=8)
    ax.spines[:].set_visible(False)


def _torus_figure(
    links: pd.DataFrame,
    torus: pd.DataFrame,
    dims: tuple[int, int, int],
    *,
    domain: int,
    tiers: pd.DataFrame,
    which: str,
    folded: bool,
) -> Figure:
    nx_, ny, nz = dims
    chips = _domain_chips(links, domain)
    tier = torus["tier"].astype(str).to_numpy()
    planar = torus[tier != "torus z"]
    zlinks = torus[tier == "torus z"]
    scale = _Scale(Normalize(0.0, _vmax(torus["mean_util"].to_numpy())), _cmap())
    planes = list(range(min(nz, _MAX_PLANES)))
    panels = len(planes) + (1 if nz > 1 else 0)
    cell = 0.95 if panels == 1 else 0.62  # inches per chip
    aw, ah = cell * nx_, cell * ny  # one panel's axes
    wraps = bool(
        ((planar["src_x"] - planar["dst_x"]).abs() > 1).any()
        or ((planar["src_y"] - planar["dst_y"]).abs() > 1).any()
    )
    bars_h = _ROW_H * len(tiers) + 0.1
    ncols = min(panels, 3)
    nrows = -(-panels // ncols)
    col_w, row_h = aw + 0.75, ah + 0.85
    grid_w = ncols * col_w
    bars_left = 0.55 + aw + 1.25 + _TIER_LABEL_W
    width = bars_left + 3.9 if panels == 1 else max(grid_w + 1.7, 11.0)
    caption = _torus_caption(torus, dims, which)
    lines = textwrap.wrap(caption, width=int((width - 0.8) * 15.5))
    head = 0.95 + 0.16 * len(lines)  # the title and the lines of explanation
    if panels == 1:
        height = head + max(ah + 0.85, bars_h + 1.1) + 0.3 * folded
        fig = Figure(figsize=(width, height), dpi=100)
        ax = _axes(fig, 0.55, head, aw, ah)
        _plane_panel(ax, chips, planar, (nx_, ny), scale, folded=folded,
                     cell=cell)  # fmt: skip
        cax = _axes(fig, 0.55 + aw + 0.2, head, 0.15, ah)
        bars = _axes(fig, bars_left, head, width - bars_left - 0.3, bars_h)
        legend_at = (0.55, head + ah + 0.45)
    else:
        height = head + nrows * row_h + 0.45 + bars_h + 1.0 + 0.3 * folded
        fig = Figure(figsize=(width, height), dpi=100)
        for k in range(panels):
            r, c = divmod(k, ncols)
            ax = _axes(fig, 0.5 + c * col_w, head + 0.3 + r * row_h, aw, ah)
            if k < len(planes):
                z = planes[k]
                sel = planar[(planar["src_z"] == z).to_numpy()]
                _plane_panel(ax, chips[chips["z"] == z], sel, (nx_, ny), scale,
                             folded=folded, cell=cell)  # fmt: skip
                ax.set_title(f"plane z = {z}: x and y links", fontsize=9, fontweight="normal")
            else:
                _z_panel(ax, zlinks, dims, scale, folded=folded)
        cax = _axes(fig, 0.5 + grid_w - 0.1, head + 0.3, 0.15, nrows * row_h - 0.85)
        bars = _axes(fig, _TIER_LABEL_W + 0.3, head + nrows * row_h + 0.45,
                     width - _TIER_LABEL_W - 0.6, bars_h)  # fmt: skip
        free = nrows * ncols > panels
        r, c = divmod(panels, ncols)
        legend_at = (
            (0.5 + c * col_w, head + 0.3 + r * row_h + 0.2)
            if free
            else (width - 3.3, head + nrows * row_h - 0.3)
        )
    bar = fig.colorbar(ScalarMappable(norm=scale.norm, cmap=scale.cmap), cax=cax)
    bar.set_label("mean utilisation, % of capacity")
    bar.locator = MaxNLocator(nbins=5)
    bar.formatter = PercentFormatter(xmax=1.0, decimals=0 if scale.top >= 0.1 else 1)
    bar.update_ticks()
    _tier_panel(bars, tiers, folded=folded)
    _bar_legend(fig, bars, folded=folded)
    fw, fh = fig.get_size_inches()
    fig.legend(handles=_legend_handles(folded=folded, wraps=wraps), loc="upper left",
               bbox_to_anchor=(legend_at[0] / fw, 1 - legend_at[1] / fh), fontsize=8,
               borderaxespad=0.0)  # fmt: skip
    fig.text(0.5 / fw, 1 - 0.55 / fh, "\n".join(lines), fontsize=8.5, va="top")
    return fig


def _torus_caption(torus: pd.DataFrame, dims: tuple[int, int, int], which: str) -> str:
    nx_, ny, nz = dims
    shape = f"{nx_}x{ny}x{nz}" if nz > 1 else f"{nx_}x{ny}"
    kind = _KIND_LABELS.get(str(torus["kind"].iloc[0]), str(torus["kind"].iloc[0]))
    loaded = torus[torus["bytes"] > 0]
    hot = ""
    if len(loaded):
        top = loaded.sort_values("mean_util", ascending=False, kind="stable").iloc[0]
        hot = f" Busiest: {top['link']}, {_pct(float(top['mean_util']))}."
    return (
        f"{shape} {kind} torus of {which}, chips numbered. Arrows are links, coloured and "
        f"widened by mean utilisation (+x runs above -x, +y right of -y).{hot}"
    )
