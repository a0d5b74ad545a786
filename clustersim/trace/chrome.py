"""The op-level trace as Chrome Trace Event JSON (``trace.json``), for Perfetto or chrome://tracing.

Layout of the file:

- a process per chip (``pid`` = chip index), with a thread per rank and engine
  (``rank 3: tensor``: the ops that engine bounded) and per rank and
  communication group (``rank 3: tp comm``, ``rank 3: p2p``, ``rank 3: waits``);
  overlapping asynchronous collectives get extra lanes so slices stay nested;
- ``X`` complete events with microsecond timestamps, one per executed op;
- flow events (``s``/``t``/``f``) linking each p2p send to its receive, and the
  members of each collective in order of arrival (the last one is the straggler);
- counter events (``C``) per chip: modelled HBM use (static state plus the
  activations of the microbatches in flight) and communication rate per group;
- a ``steps`` process with one slice per training step;
- with ``failures.inject``, a ``failures`` process (:mod:`clustersim.trace.injections`):
  each injection at the time it applied, link stalls until the reroute, a failed step.

A trace of every rank of a large run would not open in a browser, so the file
shows representative ranks (the first ranks of every pipeline stage, taken in
turn) up to ``max_ranks``, and at most ``max_events`` events; ``otherData`` says
what was left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from clustersim.trace.chrome_select import (
    RankLayout,
    collective_instances,
    group_of,
    labels,
    p2p_pairs,
    representative_ranks,
)
from clustersim.trace.injections import injection_events, not_reached
from clustersim.trace.io import atomic_write

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "DEFAULT_MAX_RANKS",
    "ChromeTraceInfo",
    "RankLayout",
    "collective_instances",
    "labels",
    "p2p_pairs",
    "representative_ranks",
    "write_chrome_trace",
]

# About 150 bytes per event: half a million events keep the file near 75 MB, which
# Perfetto and chrome://tracing still open comfortably.
DEFAULT_MAX_EVENTS = 500_000
DEFAULT_MAX_RANKS = 8

ENGINES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "hbm")
COMM_GROUPS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
_SLOT = {name: i for i, name in enumerate(ENGINES)}
_SLOT.update({g: 8 + i for i, g in enumerate(COMM_GROUPS)})
_SLOT.update({"p2p": 8 + COMM_GROUPS.index("pp"), "wait": 14, "other": 15})
_LANES = 8  # lanes per thread for overlapping (asynchronous) slices
_TIDS_PER_RANK = 16 * _LANES
# The fraction of the event budget kept for flows, counters and metadata.
_OP_SHARE = 0.8


@dataclass(frozen=True)
class ChromeTraceInfo:
    """What ``write_chrome_trace`` wrote, and what it left out."""

    path: Path
    events: int
    ranks_shown: tuple[int, ...]
    ranks_total: int
    rows_total: int
    rows_shown: int
    capped: bool


# -- writing --------------------------------------------------------------------------


def _threads(frame: pd.DataFrame) -> np.ndarray:
    """Thread id per row: rank, slot (engine or group) and lane (for overlapping slices)."""
    res = frame["resource"]
    cats = [str(c) for c in res.cat.categories]
    slot_of_cat = np.array(
        [_SLOT.get(c, _SLOT.get(group_of(c), _SLOT["other"])) for c in cats], dtype=np.int64
    )
    slot = slot_of_cat[res.cat.codes.to_numpy()]
    rank = frame["rank"].to_numpy(dtype=np.int64)
    base = rank * _TIDS_PER_RANK + slot * _LANES
    lane = np.zeros(len(frame), dtype=np.int64)
    start, end = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    # Only communication slices can overlap on one thread (asynchronous collectives).
    for tid in np.unique(base[slot >= _SLOT["tp"]]):
        idx = np.flatnonzero(base == tid)
        idx = idx[np.argsort(start[idx], kind="stable")]
        if not (start[idx[1:]] < end[idx[:-1]]).any():
            continue
        lane_end: list[float] = []
        for i in idx.tolist():
            for k, busy_until in enumerate(lane_end):
                if start[i] >= busy_until:
                    lane[i], lane_end[k] = k, end[i]
                    break
            else:
                k = min(len(lane_end), _LANES - 1)
                if k == len(lane_end):
                    lane_end.append(end[i])
                lane[i], lane_end[k] = k, max(lane_end[k], end[i])
    return base + lane


def _thread_name(tid: int) -> str:
    rank, rest = divmod(tid, _TIDS_PER_RANK)
    slot, lane = divmod(rest, _LANES)
    names = {v: k for k, v in _SLOT.items() if k != "p2p"}
    label = names.get(slot, "other")
    if label == "pp":
        label = "p2p"
    elif label in COMM_GROUPS:
        label = f"{label} comm"
    elif label == "wait":
        label = "waits"
    return f"rank {rank}: {label}" + (f" ({lane + 1})" if lane else "")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3f}"


def _x_events(frame: pd.DataFrame, tids: np.ndarray) -> list[str]:
    # Ranks of a stage repeat the same instructions: format each distinct
    # (op, phase, resource, layer, microbatch, flops, bytes) once, not once per row.
    static = ["op", "phase", "resource", "layer", "microbatch", "flops", "bytes"]
    key = frame.groupby(static, observed=True, sort=False).ngroup().to_numpy()
    first = np.unique(key, return_index=True)[1]
    uniq = frame.iloc[first]
    heads, tails = [], []
    for op, ph, res, layer, mb, fl, by in zip(
        *(labels(uniq[c]).tolist() if c in static[:3] else uniq[c].tolist() for c in static),
        strict=True,
    ):
        heads.append(f'{{"name":{json.dumps(op)},"cat":{json.dumps(ph)},"ph":"X"')
        tails.append(
            f'"layer":{layer},"microbatch":{mb},"resource":{json.dumps(res)},'
            f'"flops":{fl:.10g},"bytes":{by:.10g}}}}}'
        )
    # Round both ends (not the duration) so slices that touch in the simulation touch
    # in the file too, instead of overlapping by a rounding error and breaking nesting.
    start = np.round(frame["start_s"].to_numpy() * 1e6, 3)
    dur = np.maximum(np.round(frame["end_s"].to_numpy() * 1e6, 3) - start, 0.0)
    return [
        f'{heads[k]},"ts":{ts:.3f},"dur":{d:.3f},"pid":{chip},"tid":{tid},'
        f'"args":{{"step":{step},{tails[k]}'
        for k, ts, d, chip, tid, step in zip(
            key.tolist(),
            start.tolist(),
            dur.tolist(),
            frame["chip"].tolist(),
            tids.tolist(),
            frame["step"].tolist(),
            strict=True,
        )
    ]


def _flow(ph: str, fid: int, name: str, cat: str, *, ts_s: float, pid: int, tid: int) -> str:
    return (
        f'{{"name":{json.dumps(name)},"cat":"{cat}","ph":"{ph}","id":{fid},"ts":{_us(ts_s)},'
        f'"pid":{pid},"tid":{tid},"bp":"e"}}'
    )


def _flow_events(
    frame: pd.DataFrame, tids: np.ndarray, layout: RankLayout, budget: int
) -> tuple[list[str], bool]:
    """Flows between rows of ``frame``, which has a RangeIndex (labels are positions)."""
    out: list[str] = []
    start, end = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    chip, ops = frame["chip"].to_numpy(), labels(frame["op"])
    fid = 0
    pairs = p2p_pairs(frame, layout)
    for s_label, r_label in zip(pairs["send"].tolist(), pairs["recv"].tolist(), strict=True):
        if len(out) + 2 > budget:
            return out, True
        s, r = s_label, r_label
        fid += 1
        name = ops[s]
        out.append(_flow("s", fid, name, "p2p", ts_s=start[s], pid=chip[s], tid=tids[s]))
        ts = min(max(start[s], start[r]), end[r])
        out.append(_flow("f", fid, name, "p2p", ts_s=ts, pid=chip[r], tid=tids[r]))
    inst = collective_instances(frame, layout)
    if inst.empty:
        return out, False
    members = inst.groupby(inst).groups
    for member_rows in members.values():
        if len(member_rows) < 2:
            continue
        if len(out) + len(member_rows) > budget:
            return out, True
        rows = sorted((int(i) for i in member_rows), key=lambda i: (start[i], i))
        fid += 1
        name = ops[rows[0]]
        for j, i in enumerate(rows):
            ph = "s" if j == 0 else ("f" if j == len(rows) - 1 else "t")
            out.append(_flow(ph, fid, name, "collective", ts_s=start[i], pid=chip[i], tid=tids[i]))
    return out, False


def _sweep(times_s: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step function from +/- deltas at times: (change times, value after each change)."""
    order = np.argsort(times_s, kind="stable")
    t, v = times_s[order], np.cumsum(deltas[order])
    keep = np.append(t[1:] != t[:-1], True)  # the last value at each time
    return t[keep], v[keep]


def _counter(name: str, pid: int, ts_s: float, args: Mapping[str, float]) -> str:
    body = ",".join(f"{json.dumps(k)}:{v:.6g}" for k, v in args.items())
    return f'{{"name":"{name}","ph":"C","ts":{_us(ts_s)},"pid":{pid},"tid":0,"args":{{{body}}}}}'


def _counter_events(
    frame: pd.DataFrame, memory_gib: Mapping[str, float] | None, budget: int
) -> tuple[list[str], bool]:
    out: list[str] = []
    phase = labels(frame["phase"])
    start, end = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    ranks, chips = frame["rank"].to_numpy(), frame["chip"].to_numpy()
    # Microbatches in flight: from a microbatch's first forward op to its last backward op.
    compute = np.isin(phase, ("fwd", "bwd", "recompute")) & (frame["microbatch"].to_numpy() >= 0)
    span = (
        frame[compute]
        .groupby(["rank", "step", "microbatch"], observed=True)
        .agg(t0=("start_s", "min"), t1=("end_s", "max"))
        .reset_index()
    )
    peak = 1.0
    flight: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    span_rank = span["rank"].to_numpy()
    for rank in np.unique(span_rank).tolist():
        sel = span_rank == rank
        t = np.concatenate([span["t0"].to_numpy()[sel], span["t1"].to_numpy()[sel]])
        d = np.concatenate([np.ones(int(sel.sum())), -np.ones(int(sel.sum()))])
        flight[rank] = _sweep(t, d)
        peak = max(peak, float(flight[rank][1].max()))
    for chip in np.unique(chips).tolist():
        chip_ranks = sorted(set(ranks[chips == chip].tolist()) & set(flight))
        if not chip_ranks:
            continue
        t, v = flight[chip_ranks[0]]  # ranks of a chip run the same stage
        t, v = np.concatenate([[0.0], t]), np.concatenate([[0.0], v])
        if len(out) + len(t) > budget:
            return out, True
        if memory_gib is not None:
            static = sum(memory_gib.get(k, 0.0) for k in ("weights", "grads", "optimizer"))
            act = memory_gib.get("activations", 0.0)
            for ts, n in zip(t.tolist(), v.tolist(), strict=True):
                args = {"static": static, "activations": act * n / peak}
                out.append(_counter("HBM GiB (modelled)", chip, ts, args))
        else:
            for ts, n in zip(t.tolist(), v.tolist(), strict=True):
                out.append(_counter("microbatches in flight", chip, ts, {"microbatches": n}))
    # Communication rate: bytes over time spent in the op, summed per chip and group.
    dur = end - start
    cats = frame["resource"].cat.categories
    groups = np.array([group_of(str(c)) for c in cats] or [""])[
        frame["resource"].cat.codes.to_numpy()
    ]
    comm = (groups != "") & (dur > 0)
    for chip in np.unique(chips[comm]).tolist():
        for group in np.unique(groups[comm & (chips == chip)]).tolist():
            sel = comm & (chips == chip) & (groups == group)
            rate = frame["bytes"].to_numpy()[sel] / dur[sel] / 1e9
            t, v = _sweep(np.concatenate([start[sel], end[sel]]), np.concatenate([rate, -rate]))
            if len(out) + len(t) > budget:
                return out, True
            name = f"{group} comm GB/s"
            out.extend(
                _counter(name, chip, ts, {"GB/s": max(x, 0.0)})
                for ts, x in zip(t.tolist(), v.tolist(), strict=True)
            )
    return out, False


def _meta(name: str, pid: int, tid: int, args: Mapping[str, Any]) -> str:
    return json.dumps(
        {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": dict(args)},
        separators=(",", ":"),
    )


def _metadata(
    frame: pd.DataFrame, tids: np.ndarray, chip_name: str, steps_pid: int
) -> Iterable[str]:
    yield _meta("process_name", steps_pid, 0, {"name": "steps"})
    yield _meta("process_sort_index", steps_pid, 0, {"sort_index": -1})
    for chip in np.unique(frame["chip"].to_numpy()).tolist():
        yield _meta("process_name", chip, 0, {"name": f"chip {chip} ({chip_name})"})
        yield _meta("process_sort_index", chip, 0, {"sort_index": chip})
    keys = np.unique(frame["chip"].to_numpy().astype(np.int64) << 32 | tids)
    for key in keys.tolist():
        chip, tid = key >> 32, key & 0xFFFFFFFF
        yield _meta("thread_name", chip, tid, {"name": _thread_name(tid)})
        yield _meta("thread_sort_index", chip, tid, {"sort_index": tid})


def _step_events(frame: pd.DataFrame, pid: int) -> list[str]:
    spans = frame.groupby("step").agg(t0=("start_s", "min"), t1=("end_s", "max"))
    prev = 0.0
    out = []
    for step, t1 in zip(spans.index.tolist(), spans["t1"].tolist(), strict=True):
        out.append(
            f'{{"name":"step {step}","cat":"step","ph":"X","ts":{_us(prev)},'
            f'"dur":{_us(t1 - prev)},"pid":{pid},"tid":0,"args":{{"step":{step}}}}}'
        )
        prev = t1
    return out


def write_chrome_trace(
    path: Path,
    frame: pd.DataFrame,
    layout: RankLayout,
    *,
    memory_gib_per_chip: Mapping[str, float] | None = None,
    chip_name: str = "chip",
    max_events: int = DEFAULT_MAX_EVENTS,
    max_ranks: int = DEFAULT_MAX_RANKS,
    other: Mapping[str, Any] | None = None,
    injections: Sequence[Mapping[str, Any]] = (),
    step_failed: Mapping[str, Any] | None = None,
    engines: pd.DataFrame | None = None,
) -> ChromeTraceInfo:
    """Write ``frame`` (the op-level trace) as Chrome Trace Event JSON to ``path``, atomically.

    ``injections`` and ``step_failed`` are the summary's records of ``failures.inject``;
    they are drawn on a ``failures`` process whatever the event cap. ``engines`` (the
    engine model's chunks, :mod:`clustersim.trace.engines`) adds a thread per engine
    of the representative cores, within a quarter of ``max_events``.
    """
    max_events = max(int(max_events), 100)
    rows_total = len(frame)
    per_rank = frame["rank"].value_counts()
    traced = [int(r) for r in per_rank.index]
    picked = representative_ranks(layout, max(1, max_ranks), traced)
    engine_events: list[str] = []
    cut_e = False
    if engines is not None and len(engines):
        from clustersim.trace.engines import engine_trace_events

        engine_events, cut_e = engine_trace_events(engines, max_events // 4)
    op_budget = int((max_events - len(engine_events)) * _OP_SHARE)
    shown: list[int] = []
    used = 0
    for rank in picked:
        n = int(per_rank.get(rank, 0))
        if shown and used + n > op_budget:
            break
        shown.append(rank)
        used += n
    sub = frame[frame["rank"].isin(shown)].reset_index(drop=True)
    capped = len(shown) < len(traced)
    if len(sub) > op_budget:  # one rank alone is over budget: keep its earliest ops
        sub = sub.nsmallest(op_budget, "start_s", keep="first").sort_index()
        sub = sub.reset_index(drop=True)
        capped = True
    steps_pid = int(frame["chip"].max()) + 1 if len(frame) else 0
    tids = _threads(sub) if len(sub) else np.zeros(0, dtype=np.int64)
    events: list[str] = list(_metadata(sub, tids, chip_name, steps_pid)) if len(sub) else []
    events += injection_events(injections, step_failed, steps_pid + 1)
    events += _step_events(sub, steps_pid) if len(sub) else []
    events += _x_events(sub, tids) if len(sub) else []
    events += engine_events
    left = max_events - len(events)
    flows, cut_f = _flow_events(sub, tids, layout, left // 2) if len(sub) else ([], False)
    events += flows
    counters, cut_c = (
        _counter_events(sub, memory_gib_per_chip, max_events - len(events))
        if len(sub)
        else ([], False)
    )
    events += counters
    capped = capped or cut_f or cut_c or cut_e
    note = (
        f"showing {len(shown)} of {len(traced)} traced ranks ({layout.ranks} in the run; "
        f"{len(sub):,} of {rows_total:,} ops)"
        + ("; flow or counter events were cut at the event cap" if cut_f or cut_c else "")
    )
    meta: dict[str, Any] = {
        "generator": "clustersim",
        "time_unit": "us",
        "ranks_total": layout.ranks,
        "ranks_traced": len(traced),
        "ranks_shown": ",".join(map(str, shown)),
        "ops_total": rows_total,
        "ops_shown": len(sub),
        "events": len(events),
        "max_events": max_events,
        "max_ranks": max_ranks,
        "capped": capped,
        "engine_chunks_shown": sum(1 for e in engine_events if '"ph":"X"' in e),
        "note": note,
        **(other or {}),
    }
    if injections or step_failed:
        meta["injections"] = len(injections)
        meta["injections_not_reached"] = ",".join(map(str, not_reached(injections)))

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as fh:
            _dump(fh, events, meta)

    atomic_write(path, write)
    return ChromeTraceInfo(
        path, len(events), tuple(shown), layout.ranks, rows_total, len(sub), capped
    )


def _dump(fh: IO[str], events: Sequence[str], meta: Mapping[str, Any]) -> None:
    fh.write('{"displayTimeUnit":"ms","otherData":')
    fh.write(json.dumps(meta, separators=(",", ":")))
    fh.write(',"traceEvents":[\n')
    for i in range(0, len(events), 10_000):
        chunk = events[i : i + 10_000]
        fh.write(",\n".join(chunk))
        fh.write(",\n" if i + 10_000 < len(events) else "\n")
    fh.write("]}\n")
