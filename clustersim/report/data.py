"""A run's saved results, loaded back, and the tables the report derives from its trace.

The report reads what ``clustersim run`` wrote (``summary.json``,
``resolved_scenario.yaml``, ``trace.parquet``, ``links.parquet``), never the simulator's objects,
so ``clustersim report DIR`` rebuilds everything from a result directory.

A trace workload's run (``workload: {chakra: PREFIX}``; its summary has a
``workload`` and no ``layout``) has no parallel layout: its ranks form one
stage (:class:`TraceLayout`), its compute resources are ``compute`` and
``memory``, and its communication groups are the traces' process groups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from clustersim.errors import ScenarioError
from clustersim.trace.chrome import RankLayout, labels, p2p_pairs
from clustersim.trace.links import LINK_TABLE
from clustersim.workload.layout import Layout

__all__ = [
    "COMPUTE_RESOURCES",
    "TRACE_COMPUTE_RESOURCES",
    "RunData",
    "TraceLayout",
    "comm_table",
    "exposed_per_row",
    "load_run",
    "utilisation",
]

COMPUTE_RESOURCES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "hbm")
TRACE_COMPUTE_RESOURCES: tuple[str, ...] = ("compute", "memory")
"""The compute resources of a trace workload's rows (``clustersim.sim.chakra_trace``)."""
TRACE_COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather",
    "scatter",
)  # fmt: skip
"""The collectives a trace workload runs, as its utilisation columns (``all_reduce comm``)."""
_GROUP_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class TraceLayout:
    """The layout of a trace workload's run: ``ranks`` ranks in one stage, with no
    pipeline peers. A process group (a ``pg_name``) is one group whatever the rank, so
    its first member, as the trace writer asks for it, is the same for every rank."""

    ranks: int

    def stage(self, rank: int) -> int:
        del rank
        return 0

    def group(self, name: str, rank: int) -> tuple[int, ...]:
        return (rank,) if name == "pp" else (0,)


@dataclass
class RunData:
    """One run's results: the summary, the resolved scenario and (optionally) the trace and
    the link table (``clustersim.trace.links``; absent from result directories of older
    versions)."""

    summary: dict[str, Any]
    resolved: dict[str, Any] = field(default_factory=dict)
    resolved_yaml: str = ""
    frame: pd.DataFrame | None = None
    source: Path | None = None  # the directory it was loaded from, if any
    custom_label: str = ""  # how comparison reports name this run (default: its name)
    links: pd.DataFrame | None = None
    engines: pd.DataFrame | None = None
    """The engine model's chunks (``engines.parquet``), with ``chip_model: engines``."""
    _exposure: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return self.custom_label or self.name

    @property
    def name(self) -> str:
        return str(self.summary.get("scenario", "run"))

    @property
    def step_time_s(self) -> float:
        return float(self.summary["step_time_s"])

    @property
    def steps(self) -> int:
        """Steps in the trace (or in the scenario when there is no trace)."""
        if self.frame is not None and len(self.frame):
            return int(self.frame["step"].nunique())
        return int(self.resolved.get("training", {}).get("steps", 1) or 1)

    def exposure(self) -> tuple[np.ndarray, np.ndarray]:
        """``exposed_per_row`` of the whole trace, computed once."""
        if self._exposure is None:
            if self.frame is None:
                raise ValueError("no trace")
            self._exposure = exposed_per_row(self.frame, self.layout())
        return self._exposure

    @property
    def is_trace(self) -> bool:
        """Whether the run is of a trace workload (``workload: {chakra: ...}``)."""
        return self.summary.get("workload") is not None

    def layout(self) -> RankLayout:
        """The parallel layout, rebuilt from the summary (a :class:`TraceLayout` for a
        trace workload)."""
        s, lay = self.summary, self.summary["layout"]
        ranks, chips = int(s["ranks"]), int(s["chips"])
        if lay is None and self.is_trace:
            return TraceLayout(ranks)
        ep = int(self.resolved.get("parallelism", {}).get("ep", 1) or 1)
        try:
            return Layout(
                tp=int(lay["tp"]),
                pp=int(lay["pp"]),
                dp=int(lay["dp"]),
                cp=int(lay["cp"]),
                ep=ep,
                ranks=ranks,
                ranks_per_chip=max(ranks // max(chips, 1), 1),
                vp=int(lay.get("virtual_stages", 1)),
            )
        except ValueError as exc:
            raise ScenarioError("summary.json: layout", lay, str(exc)) from exc


def load_run(directory: Path, *, trace: bool = True) -> RunData:
    """Load a result directory; raise ``ScenarioError`` (exit 2) if it is not a complete one."""
    if not directory.is_dir():
        raise ScenarioError("DIR", str(directory), "no such result directory")
    path = directory / "summary.json"
    if not path.is_file():
        raise ScenarioError(
            "DIR",
            str(directory),
            "no summary.json: not a complete result directory (run `clustersim run` into it)",
        )
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(str(path), type(exc).__name__, f"unreadable summary: {exc}") from exc
    required = ("scenario", "step_time_s", "breakdown_s", "layout", "ranks", "chips")
    missing = [k for k in required if not isinstance(summary, dict) or k not in summary]
    if missing:
        raise ScenarioError(str(path), missing, "summary.json lacks required keys")
    failed = summary.get("step_failed")
    if isinstance(failed, dict):  # an injected chip or instance failure: no finished step
        raise ScenarioError(
            str(path), failed.get("cause"), f"the step failed at {failed.get('at_s')} s; "
            "a report needs a finished step (see summary.json and injections.parquet)",
        )  # fmt: skip
    resolved_yaml, resolved = "", {}
    rpath = directory / "resolved_scenario.yaml"
    if rpath.is_file():
        resolved_yaml = rpath.read_text(encoding="utf-8")
        loaded = yaml.safe_load(resolved_yaml)
        resolved = loaded if isinstance(loaded, dict) else {}
    frame = None
    tpath = directory / "trace.parquet"
    if trace and tpath.is_file():
        frame = pd.read_parquet(tpath)
        for col in ("resource", "op", "phase"):
            frame[col] = frame[col].astype("category")
    engines = None
    epath = directory / "engines.parquet"
    if trace and epath.is_file():
        engines = pd.read_parquet(epath)
    return RunData(
        summary, resolved, resolved_yaml, frame, directory, links=_load_links(directory),
        engines=engines,
    )  # fmt: skip


def _load_links(directory: Path) -> pd.DataFrame | None:
    """The link table, or None when the directory has none (written before it existed)."""
    path = directory / LINK_TABLE
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise ScenarioError(str(path), type(exc).__name__, f"unreadable link table: {exc}") from exc


# -- derived tables -------------------------------------------------------------------


def _comm_mask(frame: pd.DataFrame) -> np.ndarray:
    res = frame["resource"].astype("category")
    cats = [str(c) for c in res.cat.categories]
    flags = np.array([":" in c or c in ("p2p", "wait") for c in cats] + [False])
    return flags[res.cat.codes.to_numpy()]


def exposed_per_row(frame: pd.DataFrame, layout: RankLayout) -> tuple[np.ndarray, np.ndarray]:
    """(exposed seconds, bubble seconds) per row of ``frame``, as the simulator accounts them.

    A blocking collective or a wait is exposed for its whole duration; an
    asynchronous collective (the rank's next op starts before it ends) is hidden.
    A receive is a bubble while its sender has not sent yet, and exposed after.
    Rows must be in the trace's order: by rank, then by time.
    """
    start, end = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    dur = np.maximum(end - start, 0.0)
    comm = _comm_mask(frame)
    ranks = frame["rank"].to_numpy()
    next_start = np.append(start[1:], np.inf)
    same_rank = np.append(ranks[1:] == ranks[:-1], False)
    overlapped = same_rank & (next_start < end)
    exposed = np.where(comm & ~overlapped, dur, 0.0)
    bubble = np.zeros(len(frame))
    pairs = p2p_pairs(frame.reset_index(drop=True), layout)
    if len(pairs):
        s, r = pairs["send"].to_numpy(), pairs["recv"].to_numpy()
        waited = np.clip(start[s] - start[r], 0.0, dur[r])
        bubble[r] = waited
        exposed[r] = dur[r] - waited
    return exposed, bubble


def comm_table(data: RunData, top: int | None = 10) -> pd.DataFrame:
    """Communication ops by exposed time per rank and step, largest first.

    Columns: ``op, phase, resource, calls, mbytes, time_s, exposed_s, bubble_s,
    exposed_pct`` (times per rank per step; ``exposed_pct`` of the step time).
    """
    cols = [
        "op", "phase", "resource", "calls", "mbytes", "time_s", "exposed_s", "bubble_s",
        "exposed_pct",
    ]  # fmt: skip
    frame = data.frame
    if frame is None or frame.empty:
        return pd.DataFrame(columns=cols)
    exposed, bubble = data.exposure()
    mask = _comm_mask(frame)
    sub = frame.loc[mask, ["op", "phase", "resource", "start_s", "end_s", "bytes"]].copy()
    sub["time_s"] = (sub["end_s"] - sub["start_s"]).clip(lower=0.0)
    sub["exposed_s"], sub["bubble_s"] = exposed[mask], bubble[mask]
    for col in ("op", "phase", "resource"):
        sub[col] = labels(sub[col])
    norm = frame["rank"].nunique() * data.steps
    g = sub.groupby(["op", "phase", "resource"], sort=False)
    out = pd.DataFrame(
        {
            "calls": g.size() / norm,
            "mbytes": g["bytes"].mean() / 1e6,
            "time_s": g["time_s"].sum() / norm,
            "exposed_s": g["exposed_s"].sum() / norm,
            "bubble_s": g["bubble_s"].sum() / norm,
        }
    ).reset_index()
    out["exposed_pct"] = 100.0 * out["exposed_s"] / data.step_time_s
    out = out.sort_values(["exposed_s", "time_s"], ascending=False, ignore_index=True)
    return out[cols] if top is None else out[cols].head(top)


def _union_seconds(start: np.ndarray, end: np.ndarray, key: np.ndarray) -> dict[int, float]:
    """Length of the union of [start, end) intervals per integer key (intervals may overlap)."""
    if len(start) == 0:
        return {}
    order = np.lexsort((start, key))
    k, s, e = key[order], start[order], end[order]
    first = np.concatenate([[True], k[1:] != k[:-1]])
    gid = np.cumsum(first) - 1
    # Offsetting each key's times by more than the time span lets one running max
    # serve every key at once: it never carries over from one key to the next.
    span = float(max(e.max() - min(s.min(), 0.0), 1.0)) * 2.0
    reach = np.maximum.accumulate(e + gid * span)
    prev = np.concatenate([[-np.inf], reach[:-1]])
    new = first | (s + gid * span > prev)
    idx = np.flatnonzero(new)
    seg_end = np.maximum.reduceat(e, idx)
    seg_len = seg_end - s[idx]
    totals = np.bincount(gid[idx], weights=seg_len)
    keys = k[np.flatnonzero(first)]
    return dict(zip(keys.tolist(), totals.tolist(), strict=True))


def _row_groups(frame: pd.DataFrame, *, trace: bool = False) -> tuple[list[str], np.ndarray]:
    """Per row, an index into the returned names: engine name, comm group, or other.

    With ``trace``, a collective's name is its operation (``all_reduce``), since a
    trace's process groups are many and named by number."""
    res = frame["resource"].astype("category")
    names: list[str] = []
    index: dict[str, int] = {}
    codes = []
    for c in [*map(str, res.cat.categories), ""]:
        name = c.split(":", 1)[int(trace)] if ":" in c else ("pp" if c == "p2p" else c)
        if not trace:
            name = "dp" if name.startswith("dp_") else name  # dp_cp, dp_shard, dp_replicate
        codes.append(index.setdefault(name, len(index)))
        if len(index) > len(names):
            names.append(name)
    return names, np.array(codes)[res.cat.codes.to_numpy()]


def utilisation(data: RunData, *, max_rows: int = 32) -> tuple[pd.DataFrame, str]:
    """Busy fraction per rank (or per chip) and resource, over the traced time.

    Compute columns count the time of the ops each engine bounded; communication
    columns count the time at least one op of that group was in flight (union of
    intervals, so overlapping asynchronous buckets are not double counted).
    Above ``max_rows`` ranks, rows are chips (the mean of their ranks), and above
    ``max_rows`` chips an even sample of them.
    Returns the matrix (rows ranks or chips, columns resources) and the row unit.
    """
    frame = data.frame
    if frame is None or frame.empty:
        return pd.DataFrame(), "rank"
    total = data.step_time_s * data.steps
    names, gcode = _row_groups(frame, trace=data.is_trace)
    ranks = frame["rank"].to_numpy().astype(np.int64)
    rank_ids, rank_pos = np.unique(ranks, return_inverse=True)
    start, end = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    dur = np.maximum(end - start, 0.0)
    ng = len(names)
    busy = np.zeros((len(rank_ids), ng))
    if data.is_trace:  # compute and memory nodes; each collective operation, then p2p
        computes, groups = TRACE_COMPUTE_RESOURCES, (*TRACE_COLLECTIVES, "pp")
    else:
        computes, groups = COMPUTE_RESOURCES, _GROUP_ORDER
    compute = np.isin(np.array(names), computes)[gcode]
    np.add.at(busy, (rank_pos[compute], gcode[compute]), dur[compute])
    comm = np.isin(np.array(names), groups)[gcode]
    key = rank_pos[comm] * ng + gcode[comm]
    for k, secs in _union_seconds(start[comm], end[comm], key).items():
        busy[k // ng, k % ng] = secs
    matrix = pd.DataFrame(busy / total, index=pd.Index(rank_ids, name="rank"), columns=names)
    order = [c for c in (*computes, *groups) if c in names]
    matrix = matrix[order]
    matrix = matrix.loc[:, (matrix > 0).any()].clip(upper=1.0)
    unit = "rank"
    if len(matrix) > max_rows:
        chips = frame.groupby("rank")["chip"].first()
        matrix = matrix.groupby(chips.reindex(matrix.index).to_numpy()).mean()
        matrix.index.name, unit = "chip", "chip"
    if len(matrix) > max_rows:
        pick = np.unique(np.linspace(0, len(matrix) - 1, max_rows).round().astype(int))
        matrix = matrix.iloc[pick]
        unit = f"{unit} (sampled)"
    matrix.columns = pd.Index(
        [
            "p2p" if c == "pp" else f"{c.replace('_', '-')} comm" if c in groups else c
            for c in matrix.columns
        ]
    )
    return matrix, unit
