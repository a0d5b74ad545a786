"""``report.html`` of a study: one self-contained page (figures embedded, autoescaped)."""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from typing import Any

from clustersim._version import __version__
from clustersim.report.figures import Rendered
from clustersim.report.html import template_env, versions
from clustersim.report.study_data import (
    CONFIDENCE,
    StudyData,
    distribution_stats,
    pareto_mask,
    pareto_points,
    sample_groups,
    sensitivity,
)
from clustersim.report.study_figures import axis_title

__all__ = ["render_study"]

MAX_ROWS = 200
"""Points listed in the page's table (all of them are in results.parquet)."""


def _num(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pareto_rows(data: StudyData) -> list[dict[str, Any]]:
    x, y = data.x, data.y
    ok, keys = pareto_points(data)
    if not len(ok):
        return []
    xs, ys = ok[x].to_numpy(dtype=float), ok[y].to_numpy(dtype=float)
    front = ok[pareto_mask(xs, ys)].sort_values(x)
    return [
        {
            "label": data.label(r, keys),
            "point": r["point"],
            "x": _num(r[x]),
            "y": _num(r[y]),
            "mfu": _num(r.get("mfu")),
        }
        for r in front.to_dict("records")
    ]


def _best(data: StudyData, column: str, lowest: bool = True) -> str:
    ok = data.ok
    if column not in ok.columns or not len(ok):
        return ""
    values = ok[column].astype(float)
    if values.isna().all():
        return ""
    rows = ok.to_dict("records")
    pick = min if lowest else max
    row = pick(
        (r for r in rows if not math.isnan(float(r[column]))), key=lambda r: float(r[column])
    )
    return f"{data.label(row)} ({axis_title(column)} {_num(row[column])})"


def _mc_rows(data: StudyData) -> list[dict[str, Any]]:
    if not data.has_samples:
        return []
    rows = []
    for label, frame in sample_groups(data):
        for metric in data.metrics:
            st = distribution_stats(frame[metric].astype(float).tolist())
            if st["n"] < 1:
                continue
            rows.append(
                {
                    "group": label,
                    "metric": axis_title(metric),
                    "n": int(st["n"]),
                    **{
                        k: _num(st[k])
                        for k in ("mean", "std", "ci_low", "ci_high", "p5", "p50", "p95")
                    },
                }
            )
    return rows


def render_study(data: StudyData, figures: Sequence[Rendered]) -> str:
    keys = data.axis_keys()
    metrics = data.metrics
    shown = data.frame.head(MAX_ROWS)
    points = [
        {
            "index": r.get("index"),
            "status": r.get("status"),
            "values": [_num(r.get(k)) for k in keys],
            "metrics": [_num(r.get(m)) for m in metrics],
            "error": r.get("error") if isinstance(r.get("error"), str) else "",
        }
        for r in shown.to_dict("records")
    ]
    failed = [
        {"index": r.get("index"), "label": data.label(r), "error": str(r.get("error") or "")}
        for r in data.failed.head(MAX_ROWS).to_dict("records")
    ]
    sens = [
        {
            "axis": s["axis"],
            "metric": axis_title(s["metric"]),
            "swing_pct": 100.0 * s["swing"],
            "levels": ", ".join(f"{k}: {_num(v)}" for k, v in s["levels"][:12]),
            "best": s["best"],
        }
        for s in sensitivity(data)
    ]
    context = {
        "clustersim_version": __version__,
        "name": data.name,
        "description": data.description,
        "n_points": len(data.frame),
        "n_ok": len(data.ok),
        "n_failed": len(data.failed),
        "axes": [
            {
                "kind": a.get("kind", ""),
                "keys": ", ".join(a.get("keys", [])),
                "size": a.get("size", ""),
            }
            for a in data.axes
        ],
        "x_title": axis_title(data.x),
        "y_title": axis_title(data.y),
        "best_x": _best(data, data.x),
        "best_y": _best(data, data.y),
        "pareto": _pareto_rows(data),
        "figures": [
            {
                "name": f.name,
                "title": f.title,
                "caption": f.caption,
                "uri": "data:image/png;base64," + base64.b64encode(f.png).decode("ascii"),
            }
            for f in figures
        ],
        "sensitivity": sens,
        "mc": _mc_rows(data),
        "confidence_pct": round(100 * CONFIDENCE),
        "keys": keys,
        "metric_titles": [axis_title(m) for m in metrics],
        "points": points,
        "more_points": max(len(data.frame) - MAX_ROWS, 0),
        "failed": failed,
        "versions": versions(),
    }
    return template_env().get_template("study.html.j2").render(context)
