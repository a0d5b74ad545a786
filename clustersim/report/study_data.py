"""A study's data as its reports read it (``clustersim sweep`` directories): loading
``results.parquet`` and ``study.json``, the Pareto front, the sensitivity along each
axis, and Monte Carlo distributions with confidence intervals. No drawing, no HTML:
``study_figures`` and ``study_html`` build on this, and ``study`` writes the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clustersim.errors import ScenarioError

__all__ = [
    "StudyData",
    "distribution_stats",
    "is_numeric",
    "is_study_dir",
    "levels_of",
    "load_study_dir",
    "pareto_mask",
    "pareto_points",
    "sample_groups",
    "sensitivity",
    "short_key",
]

RESULTS = "results.parquet"
MARKER = "study.json"
MC_KINDS = ("seeds", "random")
"""Axes whose points are samples of a distribution rather than settings to compare."""
CONFIDENCE = 0.95
MAX_LEVELS = 10
"""An axis with more distinct values than this is binned (into quintiles) for sensitivity."""


def is_study_dir(path: Path) -> bool:
    """A directory written by ``clustersim sweep``: it holds the study marker."""
    return (path / MARKER).is_file()


@dataclass
class StudyData:
    """A study's results and description, as read back from its directory."""

    name: str
    description: str
    frame: pd.DataFrame  # every point
    axes: list[dict[str, Any]]  # {kind, keys, size} per axis, from study.json
    report: dict[str, Any]  # the study's report settings
    source: Path | None = None
    marker: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] == "ok"]

    @property
    def failed(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] != "ok"]

    def axis_keys(self, kinds: Sequence[str] | None = None, *, lead: bool = False) -> list[str]:
        """Keys of the axes (of the given kinds) that take more than one value; with
        ``lead``, one key per zip axis (its keys move together): the first that tells
        the most points apart, such as a ``name`` list."""
        out: list[str] = []
        for a in self.axes:
            if kinds is not None and a["kind"] not in kinds:
                continue
            keys = [k for k in a["keys"] if k in self.frame.columns and self.frame[k].nunique() > 1]
            if lead and a["kind"] == "zip" and keys:
                keys = [max(keys, key=lambda k: self.frame[k].astype(str).nunique())]
            out += keys
        return out

    @property
    def setting_keys(self) -> list[str]:
        """Keys of the grid and zip axes: the settings a study compares."""
        return self.axis_keys(("grid", "zip"))

    @property
    def has_samples(self) -> bool:
        """The study has Monte Carlo axes (seeds or random draws)."""
        return any(a["kind"] in MC_KINDS for a in self.axes)

    @property
    def x(self) -> str:
        if self.report.get("x"):
            return str(self.report["x"])
        return "time_to_train_h" if "time_to_train_h" in self.frame.columns else "step_time_s"

    @property
    def y(self) -> str:
        return str(self.report.get("y") or "cost.usd_per_million_tokens")

    @property
    def metrics(self) -> list[str]:
        wanted = self.report.get("metrics") or ["step_time_s", "mfu", "cost.usd_per_million_tokens"]
        return [m for m in wanted if m in self.frame.columns and is_numeric(self.frame[m])]

    def label(self, row: Mapping[Any, Any], keys: Sequence[str] | None = None) -> str:
        """A point named by its axis values: ``tp=4 microbatch_size=2``."""
        keys = list(keys if keys is not None else self.axis_keys(lead=True))
        if not keys:
            return f"point {row.get('index', '?')}"
        return " ".join(f"{short_key(k, keys)}={_fmt(row.get(k))}" for k in keys)


def short_key(key: str, keys: Sequence[str]) -> str:
    """The last part of a dotted key, unless another key ends the same way."""
    last = key.rsplit(".", 1)[-1]
    clash = sum(k.rsplit(".", 1)[-1] == last for k in keys) > 1
    return key if clash else last


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def is_numeric(col: pd.Series[Any]) -> bool:
    return bool(pd.api.types.is_numeric_dtype(col)) and not pd.api.types.is_bool_dtype(col)


def load_study_dir(path: Path) -> StudyData:
    """Read a study directory written by ``clustersim sweep``."""
    marker: dict[str, Any] = {}
    try:
        loaded = json.loads((path / MARKER).read_text("utf-8"))
        marker = loaded if isinstance(loaded, dict) else {}
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise ScenarioError(
            str(path / MARKER), "", f"cannot read the study marker: {exc}"
        ) from None
    if not (path / RESULTS).is_file():
        raise ScenarioError(
            str(path), "", "the study has not finished (no results.parquet); "
            "rerun `clustersim sweep` on it to complete it",
        )  # fmt: skip
    try:
        frame = pd.read_parquet(path / RESULTS)
    except (OSError, ValueError) as exc:
        raise ScenarioError(str(path / RESULTS), "", f"cannot read results: {exc}") from None
    if "status" not in frame.columns:
        raise ScenarioError(str(path / RESULTS), "", "not the results of a study (no status)")
    return StudyData(
        name=str(marker.get("study", path.name)),
        description=str(marker.get("description", "")),
        frame=frame,
        axes=list(marker.get("axes", [])),
        report=dict(marker.get("report") or {}),
        source=path,
        marker=marker,
    )


# -- analysis -----------------------------------------------------------------------------


def pareto_mask(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Points that no other point beats on both ``x`` and ``y`` (both minimised)."""
    n = len(x)
    keep = np.zeros(n, dtype=bool)
    order = np.lexsort((y, x))  # by x, then y
    best = math.inf
    for i in order:
        if not (math.isfinite(x[i]) and math.isfinite(y[i])):
            continue
        if y[i] < best:
            keep[i] = True
            best = y[i]
    return keep


def pareto_points(data: StudyData) -> tuple[pd.DataFrame, list[str]]:
    """The points the Pareto front is drawn over, and the keys that label them: with a
    seeds axis, the mean over the seeds of each combination of the other axes."""
    x, y = data.x, data.y
    ok = data.ok
    if x not in ok.columns or y not in ok.columns:
        return ok.iloc[0:0], []
    ok = ok[np.isfinite(ok[x].astype(float)) & np.isfinite(ok[y].astype(float))]
    seeds = set(data.axis_keys(("seeds",)))
    keys = [k for k in data.axis_keys() if k not in seeds]
    if not seeds or not len(ok):
        return ok, data.axis_keys(lead=True)
    if not keys:
        mean = ok[[x, y]].astype(float).mean().to_frame().T
        mean["point"] = f"mean of {len(ok)} seeds"
        return mean, []
    grouped = ok.groupby(keys, sort=False, dropna=False)
    means = grouped[[x, y]].mean().reset_index()
    means["point"] = [f"mean of {n} seeds" for n in grouped.size().to_numpy()]
    return means, [k for k in data.axis_keys(lead=True) if k not in seeds]


def levels_of(col: pd.Series[Any]) -> pd.Series[Any]:
    """The values an axis takes, or its quintile bins when there are many (random draws)."""
    if is_numeric(col) and col.nunique() > MAX_LEVELS:
        return pd.qcut(col, 5, duplicates="drop")  # ordered categories: low to high
    return col.astype(str) if not is_numeric(col) else col


def sensitivity(data: StudyData) -> list[dict[str, Any]]:
    """For each axis and metric: the metric's mean at each value of the axis (other axes
    averaged), and its swing, (largest mean - smallest mean) / overall mean."""
    ok = data.ok
    rows: list[dict[str, Any]] = []
    for key in data.axis_keys(("grid", "zip", "random"), lead=True):
        levels = levels_of(ok[key])
        for metric in data.metrics:
            vals = ok[metric].astype(float)
            # Numbers and bins in order; names in the order the study gives them.
            means = vals.groupby(levels, sort=is_numeric(ok[key]), observed=True).mean()
            overall = float(vals.mean())
            if len(means) < 2 or not math.isfinite(overall) or overall == 0:
                continue
            rows.append(
                {
                    "axis": key,
                    "metric": metric,
                    "levels": [(str(k), float(v)) for k, v in means.items()],
                    "swing": float((means.max() - means.min()) / abs(overall)),
                    "best": str(means.idxmin() if _lower_is_better(metric) else means.idxmax()),
                }
            )
    rows.sort(key=lambda r: -r["swing"])
    return rows


def _lower_is_better(metric: str) -> bool:
    higher = ("mfu", "hfu", "tokens_per_s", "sequences_per_s", "goodput")
    return not any(metric.rsplit(".", 1)[-1].startswith(h) for h in higher)


def distribution_stats(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, float]:
    """Mean with a Student-t confidence interval of the mean, spread and percentiles."""
    from scipy import stats

    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    n = len(v)
    if n == 0:
        return {"n": 0.0}
    mean = float(v.mean())
    std = float(v.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)) if n > 1 else 0.0
    p5, p50, p95 = (float(q) for q in np.percentile(v, [5, 50, 95]))
    return {
        "n": float(n),
        "mean": mean,
        "std": std,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "p5": p5,
        "p50": p50,
        "p95": p95,
        "min": float(v.min()),
        "max": float(v.max()),
    }


def sample_groups(data: StudyData, limit: int = 8) -> list[tuple[str, pd.DataFrame]]:
    """The Monte Carlo samples, one group per combination of the compared settings (all
    pooled when there are more than ``limit`` combinations)."""
    ok = data.ok
    keys = data.setting_keys
    if not keys or len(ok) == 0:
        return [("all points", ok)]
    groups = list(ok.groupby(keys, sort=False, dropna=False))
    if len(groups) > limit:
        return [("all points", ok)]
    out = []
    lead = data.axis_keys(("grid", "zip"), lead=True)
    for _, frame in groups:
        first = frame.iloc[0].to_dict()
        out.append((data.label(first, lead), frame))
    return out
