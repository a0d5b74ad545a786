"""The registry of report figures, their rendering to PNG on the Agg canvas, and the
helpers and colours every figure module shares (:mod:`clustersim.report.figures`
describes how a figure is written)."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

    from clustersim.report.data import RunData

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

T = TypeVar("T")
DPI = 100
RC: dict[RcKeyType, Any] = {
    "text.parse_math": False,  # scenario names may contain "$"
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "savefig.facecolor": "white",
}
PHASE_COLORS = {
    "fwd": "#4C72B0",
    "bwd": "#55A868",
    "recompute": "#8172B2",
    "comm": "#C44E52",
    "bubble": "#BDBDBD",
    "optimizer": "#CCB974",
}
TRACE_PHASE_COLORS = {"compute": "#4C72B0", "memory": "#8172B2", "comm": "#C44E52"}
"""A trace workload's timeline: its nodes say no phase (``clustersim.sim.chakra_trace``)."""
PART_COLORS = {
    "compute": "#4C72B0",
    "exposed_comm": "#C44E52",
    "bubble": "#BDBDBD",
    "optimizer": "#CCB974",
    "interference": "#DD8452",
    "host": "#937860",
    "other": "#8C8C8C",
}
MEMORY_COLORS = {
    "weights": "#4C72B0",
    "grads": "#55A868",
    "optimizer": "#CCB974",
    "activations": "#DD8452",
}


@dataclass(frozen=True)
class FigureSpec(Generic[T]):
    """A registered figure: file stem, title in the report, caption, and how to draw it."""

    name: str
    title: str
    caption: str
    draw: Callable[[T], Figure | None]


FIGURES: list[FigureSpec[RunData]] = []
COMPARISON_FIGURES: list[FigureSpec[Sequence[RunData]]] = []


def figure(
    name: str, title: str, caption: str
) -> Callable[[Callable[[RunData], Figure | None]], Callable[[RunData], Figure | None]]:
    """Register a figure of one run (drawn in registration order)."""

    def register(fn: Callable[[RunData], Figure | None]) -> Callable[[RunData], Figure | None]:
        FIGURES.append(FigureSpec(name, title, caption, fn))
        return fn

    return register


def comparison_figure(name: str, title: str, caption: str) -> Callable[
    [Callable[[Sequence[RunData]], Figure | None]], Callable[[Sequence[RunData]], Figure | None]
]:  # fmt: skip
    """Register a figure that compares several runs."""

    def register(
        fn: Callable[[Sequence[RunData]], Figure | None],
    ) -> Callable[[Sequence[RunData]], Figure | None]:
        COMPARISON_FIGURES.append(FigureSpec(name, title, caption, fn))
        return fn

    return register


@dataclass(frozen=True)
class Rendered:
    """A drawn figure as PNG bytes."""

    name: str
    title: str
    caption: str
    png: bytes

    @property
    def filename(self) -> str:
        return f"{self.name}.png"


def render(spec: FigureSpec[T], data: T) -> Rendered | None:
    with rc_context(RC):
        fig = spec.draw(data)
        if fig is None:
            return None
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return Rendered(spec.name, spec.title, spec.caption, buf.getvalue())


def render_all(specs: Sequence[FigureSpec[T]], data: T) -> list[Rendered]:
    return [r for r in (render(spec, data) for spec in specs) if r is not None]


# -- helpers --------------------------------------------------------------------------


def short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def new_figure(
    width: float, height: float, margins: tuple[float, float, float, float] | None = None
) -> Figure:
    """A figure; with ``margins`` (left, right, top, bottom in inches) a fixed layout.

    Constrained layout adapts to any label, at the price of extra passes over the
    text; the single-run figures, drawn on every ``clustersim run``, have labels of
    known size and use fixed margins instead.
    """
    if margins is None:
        return Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    fig = Figure(figsize=(width, height), dpi=DPI)
    left, right, top, bottom = margins
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height
    )
    return fig


def bottom_legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str] | None = None,
                  *, ncol: int) -> None:  # fmt: skip
    """A legend centred under the axes, outside them."""
    kw: dict[str, Any] = {"ncol": ncol}
    if fig.get_layout_engine() is not None:
        kw["loc"] = "outside lower center"
    else:
        kw.update(loc="lower center", bbox_to_anchor=(0.5, 0.0))
    if labels is None:
        fig.legend(handles=list(handles), **kw)
    else:
        fig.legend(list(handles), list(labels), **kw)


def time_unit(seconds: float) -> tuple[float, str]:
    """A scale and unit name so that ``seconds`` reads as a number between 1 and 1000."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def suptitle(fig: Figure, data: RunData, what: str) -> None:
    fig.suptitle(f"{short(data.name)}: {what}", fontweight="bold", fontsize=12)
