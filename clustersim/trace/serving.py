"""A serving run's iterations as Chrome Trace Event JSON (``trace.json``), for Perfetto.

Layout of the file:

- a ``replicas`` process (``pid`` 0) with one thread per replica (``replica 3``, its
  role when disaggregated): an ``X`` slice (category ``iteration``) per engine
  iteration, or per run of decode iterations simulated as one timeout (``steps`` in
  its args), named ``prefill`` when it computes prompt tokens and ``decode`` when not;
  a slice a failure cut short ends at the failure (``aborted``);
- counter events (``C``) per replica at each slice's start: the sequences in the
  batch and the share of the KV cache in use;
- with ``failures`` in the summary, a ``failures`` process: an instant event at each
  injection and, on each failed replica's thread, a ``down`` slice (category
  ``failure``) until it is back.

Times are microseconds from the start. At most ``max_events`` events are written
(the earliest iterations first); ``otherData`` says when the cap cut the trace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clustersim.trace.io import atomic_write_text

__all__ = ["ServingTraceInfo", "write_serving_trace"]

DEFAULT_MAX_EVENTS = 500_000
_US = 1e6
_REPLICAS, _FAILURES = 0, 1


@dataclass(frozen=True)
class ServingTraceInfo:
    path: Path
    events: int
    iterations_shown: int
    iterations_total: int
    capped: bool


def _round(t: float) -> float:
    return round(t, 3)


def write_serving_trace(
    path: Path,
    iterations: pd.DataFrame,
    *,
    failures: Sequence[Mapping[str, Any]] = (),
    other: Mapping[str, Any] | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> ServingTraceInfo:
    """Write ``iterations`` (``serve``'s iteration frame: replica, role, start_s,
    duration_s, prefill_tokens, sequences, steps, kv_blocks, aborted,
    kv_capacity_blocks) and the ``failures`` injections as Chrome trace JSON, atomically."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _REPLICAS, "name": "process_name", "args": {"name": "replicas"}},
    ]
    replicas = iterations.groupby("replica", sort=True)["role"].first()
    for replica, role in replicas.items():
        name = f"replica {replica}" + ("" if role == "both" else f" ({role})")
        tid = int(str(replica))
        events.append(
            {"ph": "M", "pid": _REPLICAS, "tid": tid, "name": "thread_name",
             "args": {"name": name}}
        )  # fmt: skip
        events.append(
            {"ph": "M", "pid": _REPLICAS, "tid": tid, "name": "thread_sort_index",
             "args": {"sort_index": tid}}
        )  # fmt: skip
    per_row = 3  # a slice and two counters
    budget = max(0, (max_events - len(events) - 4 * len(failures) - 2) // per_row)
    ordered = iterations.sort_values(["start_s", "replica"], kind="stable")
    shown = ordered.iloc[:budget]
    cols = {c: shown[c].to_numpy() for c in shown.columns}
    kv_share = cols["kv_blocks"] / np.maximum(cols["kv_capacity_blocks"], 1)
    for i in range(len(shown)):
        tid = int(cols["replica"][i])
        ts = _round(float(cols["start_s"][i]) * _US)
        prefill = int(cols["prefill_tokens"][i])
        seqs = int(cols["sequences"][i])
        events.append(
            {
                "ph": "X", "cat": "iteration", "pid": _REPLICAS, "tid": tid, "ts": ts,
                "dur": _round(float(cols["duration_s"][i]) * _US),
                "name": "prefill" if prefill else "decode",
                "args": {
                    "sequences": seqs, "prefill_tokens": prefill,
                    "steps": int(cols["steps"][i]), "kv_blocks": int(cols["kv_blocks"][i]),
                    "aborted": bool(cols["aborted"][i]),
                },
            }
        )  # fmt: skip
        events.append(
            {"ph": "C", "pid": _REPLICAS, "ts": ts, "name": f"replica {tid} batch",
             "args": {"sequences": seqs}}
        )  # fmt: skip
        events.append(
            {"ph": "C", "pid": _REPLICAS, "ts": ts, "name": f"replica {tid} KV use",
             "args": {"fraction": round(float(kv_share[i]), 6)}}
        )  # fmt: skip
    if failures:
        events.append(
            {"ph": "M", "pid": _FAILURES, "name": "process_name", "args": {"name": "failures"}}
        )
    for inj in failures:
        applied = inj.get("applied_s")
        at = float(applied if applied is not None else inj["at_s"])
        events.append(
            {
                "ph": "i", "s": "g", "pid": _FAILURES, "tid": 0, "ts": _round(at * _US),
                "name": f"{inj['name']} {inj['kind']}", "args": {"effect": inj.get("effect", "")},
            }
        )  # fmt: skip
        back = inj.get("back_s")
        if back is None:
            continue
        for replica in inj.get("replicas", []):
            events.append(
                {
                    "ph": "X", "cat": "failure", "pid": _REPLICAS, "tid": int(replica),
                    "ts": _round(at * _US), "dur": _round((float(back) - at) * _US),
                    "name": "down", "args": {"injection": inj["index"]},
                }
            )  # fmt: skip
    capped = len(shown) < len(iterations)
    info: dict[str, Any] = {
        **(other or {}),
        "iterations": len(iterations),
        "iterations_shown": len(shown),
    }
    if capped:
        info["capped"] = f"the first {len(shown):,} iterations of {len(iterations):,}"
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": info}
    atomic_write_text(path, json.dumps(doc, separators=(",", ":")))
    return ServingTraceInfo(path, len(events), len(shown), len(iterations), capped)
