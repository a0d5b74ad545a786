"""The torus panels of ``topology.png``: the chips of one scale-up domain at their
torus coordinates, one panel per Z plane with every x and y link an arrow, and a
panel of the Z rings, aggregated."""

from __future__ import annotations

import textwrap
from typing import ClassVar

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator, PercentFormatter

from clustersim.report.topology_tiers import (
    IDLE,
    KIND_LABELS,
    RGBA,
    ROW_H,
    TIER_LABEL_W,
    Scale,
    bar_legend,
    link_cmap,
    pct,
    place_axes,
    tier_panel,
    vmax,
)

__all__ = ["torus_figure", "torus_links"]

_AXES = ("x", "y", "z")
_MAX_PLANES = 8


def torus_links(links: pd.DataFrame, domain: int) -> tuple[pd.DataFrame, tuple[int, int, int]]:
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
    scale: Scale,
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
        color = IDLE if idle else colors[i]
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


def _z_panel(ax: Axes, zlinks: pd.DataFrame, dims: tuple[int, int, int], scale: Scale,
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
            face = IDLE if np.isnan(v) else faces[y * nx_ + x]
            ax.add_artist(Rectangle((x - 0.45, y - 0.45), 0.9, 0.9, facecolor=face,
                                   edgecolor="white", linewidth=1.0))  # fmt: skip
            if np.isnan(v):
                text, dark = "–", False
            else:
                text = f"{pct(float(v))}\nmax {pct(float(busiest[y, x]))}"
                dark = float(v) / scale.top > 0.55
            ax.text(x, y, text, ha="center", va="center", fontsize=6.5,
                    color="white" if dark else "black")  # fmt: skip
    _grid_axes(ax, nx_, ny)
    ax.set_title(f"Z rings ({2 * nz if nz > 2 else nz} links each):\nmean and busiest link",
                 fontsize=9, fontweight="normal")  # fmt: skip


def _legend_handles(*, folded: bool, wraps: bool) -> list[object]:
    handles: list[object] = [
        Line2D([], [], color=IDLE, linewidth=0.8,
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


def torus_figure(
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
    scale = Scale(Normalize(0.0, vmax(torus["mean_util"].to_numpy())), link_cmap())
    planes = list(range(min(nz, _MAX_PLANES)))
    panels = len(planes) + (1 if nz > 1 else 0)
    cell = 0.95 if panels == 1 else 0.62  # inches per chip
    aw, ah = cell * nx_, cell * ny  # one panel's axes
    wraps = bool(
        ((planar["src_x"] - planar["dst_x"]).abs() > 1).any()
        or ((planar["src_y"] - planar["dst_y"]).abs() > 1).any()
    )
    bars_h = ROW_H * len(tiers) + 0.1
    ncols = min(panels, 3)
    nrows = -(-panels // ncols)
    col_w, row_h = aw + 0.75, ah + 0.85
    grid_w = ncols * col_w
    bars_left = 0.55 + aw + 1.25 + TIER_LABEL_W
    width = bars_left + 3.9 if panels == 1 else max(grid_w + 1.7, 11.0)
    caption = _torus_caption(torus, dims, which)
    lines = textwrap.wrap(caption, width=int((width - 0.8) * 15.5))
    head = 0.95 + 0.16 * len(lines)  # the title and the lines of explanation
    if panels == 1:
        height = head + max(ah + 0.85, bars_h + 1.1) + 0.3 * folded
        fig = Figure(figsize=(width, height), dpi=100)
        ax = place_axes(fig, 0.55, head, aw, ah)
        _plane_panel(ax, chips, planar, (nx_, ny), scale, folded=folded,
                     cell=cell)  # fmt: skip
        cax = place_axes(fig, 0.55 + aw + 0.2, head, 0.15, ah)
        bars = place_axes(fig, bars_left, head, width - bars_left - 0.3, bars_h)
        legend_at = (0.55, head + ah + 0.45)
    else:
        height = head + nrows * row_h + 0.45 + bars_h + 1.0 + 0.3 * folded
        fig = Figure(figsize=(width, height), dpi=100)
        for k in range(panels):
            r, c = divmod(k, ncols)
            ax = place_axes(fig, 0.5 + c * col_w, head + 0.3 + r * row_h, aw, ah)
            if k < len(planes):
                z = planes[k]
                sel = planar[(planar["src_z"] == z).to_numpy()]
                _plane_panel(ax, chips[chips["z"] == z], sel, (nx_, ny), scale,
                             folded=folded, cell=cell)  # fmt: skip
                ax.set_title(f"plane z = {z}: x and y links", fontsize=9, fontweight="normal")
            else:
                _z_panel(ax, zlinks, dims, scale, folded=folded)
        cax = place_axes(fig, 0.5 + grid_w - 0.1, head + 0.3, 0.15, nrows * row_h - 0.85)
        bars = place_axes(fig, TIER_LABEL_W + 0.3, head + nrows * row_h + 0.45,
                     width - TIER_LABEL_W - 0.6, bars_h)  # fmt: skip
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
    tier_panel(bars, tiers, folded=folded)
    bar_legend(fig, bars, folded=folded)
    fw, fh = fig.get_size_inches()
    fig.legend(handles=_legend_handles(folded=folded, wraps=wraps), loc="upper left",
               bbox_to_anchor=(legend_at[0] / fw, 1 - legend_at[1] / fh), fontsize=8,
               borderaxespad=0.0)  # fmt: skip
    fig.text(0.5 / fw, 1 - 0.55 / fh, "\n".join(lines), fontsize=8.5, va="top")
    return fig


def _torus_caption(torus: pd.DataFrame, dims: tuple[int, int, int], which: str) -> str:
    nx_, ny, nz = dims
    shape = f"{nx_}x{ny}x{nz}" if nz > 1 else f"{nx_}x{ny}"
    kind = KIND_LABELS.get(str(torus["kind"].iloc[0]), str(torus["kind"].iloc[0]))
    loaded = torus[torus["bytes"] > 0]
    hot = ""
    if len(loaded):
        top = loaded.sort_values("mean_util", ascending=False, kind="stable").iloc[0]
        hot = f" Busiest: {top['link']}, {pct(float(top['mean_util']))}."
    return (
        f"{shape} {kind} torus of {which}, chips numbered. Arrows are links, coloured and "
        f"widened by mean utilisation (+x runs above -x, +y right of -y).{hot}"
    )
