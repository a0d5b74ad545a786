"""The report of a serving run (``clustersim serve``): figures and a self-contained ``report.html``.

It reads what ``serve`` wrote (the summary, the per-request frame and the iteration
log), never the simulator: latency CDFs (TTFT, TPOT, end-to-end) with the SLO and the
summary's percentiles, batch size and KV-cache use over time per replica, latency by
arrival time (where a failure's spike shows), and tables of latency, throughput and
cost, and of the failures injected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from clustersim.report.figures import FigureSpec, Rendered, new_figure, render, short
from clustersim.report.html import template_env, versions
from clustersim.trace.io import atomic_write_bytes, atomic_write_text

__all__ = [
    "SERVING_FIGURES",
    "ServeData",
    "ecdf",
    "latency_cdf",
    "replica_series",
    "write_serving_report",
]

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "end-to-end latency"))
GRID = 400  # time samples of the per-replica series
MAX_LINES = 8  # replicas drawn one by one; more are drawn as their mean and range
MAX_POINTS = 20_000  # requests in the scatter (evenly thinned beyond)


@dataclass(frozen=True)
class ServeData:
    """A serving run's results: ``summary.json``, ``requests.parquet``, the iteration log."""

    summary: Mapping[str, Any]
    requests: pd.DataFrame
    iterations: pd.DataFrame | None = None

    @property
    def name(self) -> str:
        return str(self.summary.get("scenario", "serving"))


def ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of the finite ``values``: sorted values against ``i / (n - 1)``,
    the plotting position at which the curve passes through the linear-interpolated
    percentiles (``numpy.percentile``'s default, as the summary's)."""
    x = np.sort(values[np.isfinite(values)])
    if x.size < 2:
        return x, np.ones_like(x)
    return x, np.arange(x.size) / (x.size - 1)


def _failure_marks(ax: Axes, s: Mapping[str, Any]) -> None:
    for inj in (s.get("failures") or {}).get("injections", []):
        at = inj.get("applied_s")
        if at is None:
            continue
        ax.axvline(at, color="#C44E52", linestyle="--", linewidth=1)
        if inj.get("back_s") is not None:
            ax.axvspan(at, inj["back_s"], color="#C44E52", alpha=0.08, linewidth=0)


def latency_cdf(data: ServeData) -> Figure | None:
    frame = data.requests
    if frame.empty:
        return None
    fig = new_figure(11, 3.6)
    axes = fig.subplots(1, 3)
    slo = data.summary.get("slo", {})
    for ax, (key, label) in zip(axes, LATENCIES, strict=True):
        x, y = ecdf(frame[key].to_numpy(float))
        ax.plot(x * 1e3, y, color="#4C72B0", linewidth=1.5, label="requests")
        stats = data.summary.get(key) or {}
        for q, style in (("p50", "o"), ("p99", "s")):
            if stats.get(q) is not None:
                level = 0.5 if q == "p50" else 0.99
                ax.plot([stats[q] * 1e3], [level], style, color="#DD8452", label=q)
        if key in slo:
            ax.axvline(slo[key] * 1e3, color="#C44E52", linestyle="--", label="SLO")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(loc="lower right")
    fig.suptitle(f"{short(data.name)}: latency CDFs")
    return fig


def replica_series(
    iterations: pd.DataFrame, column: str, times: np.ndarray
) -> dict[int, np.ndarray]:
    """Each replica's ``column`` at ``times``: the value of the iteration running then
    (0 while it is idle), from the iteration log."""
    out = {}
    for replica, group in iterations.groupby("replica", sort=True):
        rows = group.sort_values("start_s")
        start = rows["start_s"].to_numpy(float)
        end = start + rows["duration_s"].to_numpy(float)
        value = rows[column].to_numpy(float)
        idx = np.searchsorted(start, times, side="right") - 1
        ok = (idx >= 0) & (times < end[np.maximum(idx, 0)])
        out[int(str(replica))] = np.where(ok, value[np.maximum(idx, 0)], 0.0)
    return out


def _series_panel(ax: Axes, times: np.ndarray, series: dict[int, np.ndarray], ylabel: str) -> None:
    if len(series) <= MAX_LINES:
        for replica, values in series.items():
            ax.step(times, values, where="post", linewidth=1, label=f"replica {replica}")
    else:
        stack = np.vstack(list(series.values()))
        ax.fill_between(
            times, stack.min(axis=0), stack.max(axis=0), step="post", color="#4C72B0",
            alpha=0.2, label=f"range over {len(series)} replicas",
        )  # fmt: skip
        ax.step(times, stack.mean(axis=0), where="post", color="#4C72B0", label="mean")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def batch_and_kv(data: ServeData) -> Figure | None:
    it = data.iterations
    if it is None or it.empty:
        return None
    end = float((it["start_s"] + it["duration_s"]).max())
    times = np.linspace(0.0, end, GRID)
    fig = new_figure(11, 5.2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    _series_panel(top, times, replica_series(it, "sequences", times), "sequences in batch")
    kv = it.assign(kv_share=it["kv_blocks"] / it["kv_capacity_blocks"].clip(lower=1))
    _series_panel(bottom, times, replica_series(kv, "kv_share", times), "KV cache in use")
    bottom.set_ylim(0, 1.02)
    bottom.set_xlabel("time (s)")
    for ax in (top, bottom):
        _failure_marks(ax, data.summary)
    top.legend(loc="upper right", ncol=4, fontsize=8)
    fig.suptitle(f"{short(data.name)}: batch size and KV use over time")
    return fig


def latency_by_arrival(data: ServeData) -> Figure | None:
    frame = data.requests
    if frame.empty:
        return None
    step = max(1, len(frame) // MAX_POINTS)
    thin = frame.iloc[::step]
    fig = new_figure(11, 3.6)
    ax = fig.subplots()
    for key, label, color in (("e2e_s", "end-to-end", "#4C72B0"), ("ttft_s", "TTFT", "#DD8452")):
        ax.scatter(thin["arrival_s"], thin[key], s=4, color=color, label=label, linewidths=0)
    _failure_marks(ax, data.summary)
    ax.set_xlabel("arrival (s)")
    ax.set_ylabel("latency (s)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", markerscale=3)
    fig.suptitle(f"{short(data.name)}: latency by arrival time")
    return fig


SERVING_FIGURES: list[FigureSpec[ServeData]] = [
    FigureSpec(
        "latency_cdf", "Latency CDFs",
        "TTFT, time per output token and end-to-end latency of every request; the "
        "summary's p50 and p99 marked, the SLO dashed.", latency_cdf,
    ),
    FigureSpec(
        "batch_kv", "Batch size and KV use over time",
        "Sequences in each replica's running iteration and the share of its KV cache in "
        "use (0 while idle); failures dashed, outages shaded.", batch_and_kv,
    ),
    FigureSpec(
        "latency_by_arrival", "Latency by arrival time",
        "Each request's end-to-end latency and TTFT against when it arrived; a failure's "
        "spike shows after its dashed line.", latency_by_arrival,
    ),
]  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f} ms"


def _page(data: ServeData, figures: Sequence[Rendered], files: Sequence[str], note: str) -> str:
    import base64

    s = data.summary
    quantiles = ("mean", "p50", "p90", "p99")
    latency = [
        {"name": label, **{q: _ms((s.get(key) or {}).get(q)) for q in quantiles}}
        for key, label in (*LATENCIES, ("queue_s", "queue"))
    ]
    failures = (s.get("failures") or {}).get("injections", [])
    rows = [
        {
            "index": f["index"], "what": f"{f['name']} {f['kind']}",
            "at": f"{f['at_s']:g} s", "effect": f.get("effect", ""),
            "before": _ms(f["before"]["e2e_s"]["p99"]), "around": _ms(f["around"]["e2e_s"]["p99"]),
            "ttft_before": _ms(f["before"]["ttft_s"]["p99"]),
            "ttft_around": _ms(f["around"]["ttft_s"]["p99"]),
        }
        for f in failures
    ]  # fmt: skip
    figs = [
        {"name": f.name, "title": f.title, "caption": f.caption,
         "uri": "data:image/png;base64," + base64.b64encode(f.png).decode("ascii")}
        for f in figures
    ]  # fmt: skip
    return template_env().get_template("serving.html.j2").render(
        s=s, name=data.name, latency=latency, failures=rows,
        failure_totals=s.get("failures"), figures=figs, files=files, trace_note=note,
        versions=versions(), clustersim_version=str(s.get("clustersim_version", "")),
    )  # fmt: skip


def write_serving_report(
    data: ServeData,
    out: Path,
    *,
    files: Sequence[str] = (),
    trace_note: str = "",
) -> list[Path]:
    """Write the figures (PNG) and ``report.html`` into ``out``; return the paths.
    ``files`` are the results beside it, linked from the page."""
    written = []
    rendered = [r for r in (render(spec, data) for spec in SERVING_FIGURES) if r is not None]
    for fig in rendered:
        atomic_write_bytes(out / fig.filename, fig.png)
        written.append(out / fig.filename)
    atomic_write_text(out / "report.html", _page(data, rendered, files, trace_note))
    written.append(out / "report.html")
    return written
