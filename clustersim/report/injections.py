"""Injected failures in the report: the tables of the page's section and the timeline markers.

Everything comes from ``summary.json``: ``injections`` (one record per entry of
``failures.inject``: when it applied, the target's resolved name, what it did, when
routing noticed a dead link) and ``step_times_s`` (each step, back to back from
time 0). A run without injections gets no tables and no markers.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from clustersim.trace.injections import injection_label

__all__ = [
    "MARKER_COLOR",
    "InjectionRow",
    "StepRow",
    "applied_injections",
    "injection_table",
    "mark_injections",
    "step_of",
    "step_table",
]

MARKER_COLOR = "#111111"
_STALL_ALPHA = 0.15
# One mark on the timeline is labelled with its target and kind (up to two injections at
# that time); several marks only with their numbers, which the report's table explains.
_MAX_FULL = 2
_LABEL_GAP = 0.08  # marks closer than this fraction of the axis share a label


@dataclass(frozen=True)
class InjectionRow:
    """One injection as the report lists it (times in seconds from the first step's start)."""

    index: int
    label: str  # target, name, kind and factor: "lane chip0<->chip1 down"
    at_s: float
    applied_s: float | None  # None: the run ended before its time
    detected_s: float | None  # a dead link: when routing noticed and rerouted
    step: int | None  # the step it applied in
    effect: str


@dataclass(frozen=True)
class StepRow:
    """One step's time, what it changed by, and the injections that applied during it."""

    step: int
    time_s: float
    vs_previous: float | None  # relative change from the step before
    vs_healthy: float | None  # relative to the mean of the steps before the first injection
    injections: tuple[int, ...]


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _records(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    records = summary.get("injections") or []
    return sorted(records, key=lambda r: int(r["index"]))


def _step_ends(summary: Mapping[str, Any]) -> list[float]:
    return list(itertools.accumulate(float(t) for t in summary.get("step_times_s") or []))


def step_of(t_s: float, step_ends: Sequence[float]) -> int | None:
    """The step running at ``t_s`` (steps run back to back; at a boundary, the next one)."""
    if not step_ends:
        return None
    return min(bisect.bisect_right(list(step_ends), t_s), len(step_ends) - 1)


def injection_table(summary: Mapping[str, Any]) -> list[InjectionRow]:
    """The run's injections in the order of ``failures.inject``; empty without any."""
    ends = _step_ends(summary)
    rows = []
    for rec in _records(summary):
        applied = rec.get("applied_s")
        detected = rec.get("detected_s")
        rows.append(
            InjectionRow(
                index=int(rec["index"]),
                label=injection_label(rec),
                at_s=float(rec["at_s"]),
                applied_s=None if applied is None else float(applied),
                detected_s=None if detected is None else float(detected),
                step=None if applied is None else step_of(float(applied), ends),
                effect=str(rec.get("effect") or ""),
            )
        )
    return rows


def step_table(summary: Mapping[str, Any]) -> list[StepRow]:
    """Each step's time with the injections that applied in it; empty without injections.

    ``vs_healthy`` compares with the mean of the steps that finished before the first
    injection applied, when there are any (an injection at time 0 leaves none).
    """
    injections = injection_table(summary)
    times = [float(t) for t in summary.get("step_times_s") or []]
    if not injections or not times:
        return []
    by_step: dict[int, list[int]] = {}
    for row in injections:
        if row.step is not None:
            by_step.setdefault(row.step, []).append(row.index)
    first = min(by_step, default=len(times))
    healthy = sum(times[:first]) / first if first else None
    out = []
    for k, t in enumerate(times):
        prev = times[k - 1] if k else None
        out.append(
            StepRow(
                step=k,
                time_s=t,
                vs_previous=t / prev - 1.0 if prev else None,
                vs_healthy=t / healthy - 1.0 if healthy and k >= first else None,
                injections=tuple(by_step.get(k, ())),
            )
        )
    return out


def applied_injections(summary: Mapping[str, Any]) -> bool:
    """Whether any injection applied during the run (and so is drawn on the timeline)."""
    return any(r.get("applied_s") is not None for r in summary.get("injections") or [])


def mark_injections(ax: Axes, summary: Mapping[str, Any], scale: float) -> list[Artist]:
    """Draw each applied injection on a timeline whose x axis is time x ``scale``.

    A dashed line with a marker above the rows at the time it applied (labelled
    ``#N``, with its target and kind while few), and a shaded band over a dead
    link's stall until the reroute. Rows are drawn top-down (an inverted y axis);
    the axis gains a strip above them for the labels. Returns legend handles,
    none when nothing applied.
    """
    at: dict[float, list[InjectionRow]] = {}
    stalls: list[tuple[float, float]] = []
    for row in injection_table(summary):
        if row.applied_s is None:
            continue
        at.setdefault(row.applied_s, []).append(row)
        if row.detected_s is not None and row.detected_s > row.applied_s:
            stalls.append((row.applied_s, row.detected_s))
    if not at:
        return []
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top - 0.55)  # a strip above the first row (the axis is inverted)
    mark_y = top - 0.2
    for t0, t1 in stalls:
        ax.axvspan(t0 * scale, t1 * scale, color=MARKER_COLOR, alpha=_STALL_ALPHA,
                   linewidth=0, zorder=3)  # fmt: skip
    x_max = ax.get_xlim()[1]
    # Marks closer than _LABEL_GAP of the axis share one label, which keeps labels apart.
    labels: list[tuple[float, list[InjectionRow]]] = []
    for t_s, group in sorted(at.items()):
        x = t_s * scale
        ax.axvline(x, color=MARKER_COLOR, linestyle="--", linewidth=1.2, zorder=4)
        ax.plot([x], [mark_y], marker="v", color=MARKER_COLOR, markersize=7, zorder=5,
                clip_on=False)  # fmt: skip
        if labels and x - labels[-1][0] < _LABEL_GAP * x_max:
            labels[-1][1].extend(group)
        else:
            labels.append((x, list(group)))
    full = len(labels) == 1 and len(labels[0][1]) <= _MAX_FULL
    for x, group in labels:
        text = ", ".join(f"#{r.index}" + (f" {r.label}" if full else "") for r in group)
        left = x <= 0.6 * x_max  # labels late in the step extend to the left of their line
        ax.text(x, mark_y, f"  {_short(text, 70)}  ", fontsize=7.5, va="center",
                ha="left" if left else "right", zorder=5)  # fmt: skip
    handles: list[Artist] = [
        Line2D([], [], color=MARKER_COLOR, linestyle="--", marker="v", label="injection")
    ]
    if stalls:
        handles.append(Patch(facecolor=MARKER_COLOR, alpha=_STALL_ALPHA, label="stall to reroute"))
    return handles
