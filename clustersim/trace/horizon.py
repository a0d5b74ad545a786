"""The long-horizon reliability timeline as Chrome Trace Event JSON.

One process per Monte Carlo seed. Each failure is a span that starts when it
strikes and lasts the downtime it caused (detection, restart, waiting for
nodes), named by its cause, with what it hit and what the job did in its
arguments; failures that cost no downtime are instants. Open the file in
Perfetto next to the step's ``trace.json``: its time axis is days, not seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.trace.io import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RELIABILITY_TRACE", "write_reliability_trace"]

RELIABILITY_TRACE = "reliability_trace.json"
_US = 1e6


def reliability_events(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Trace events of a reliability timeline (``seed`` and the failure columns)."""
    events: list[dict[str, Any]] = []
    for seed in sorted({int(s) for s in frame["seed"]}):
        events.append(
            {"ph": "M", "name": "process_name", "pid": seed, "tid": 0,
             "args": {"name": f"seed {seed}"}}
        )  # fmt: skip
        events.append(
            {"ph": "M", "name": "thread_name", "pid": seed, "tid": 0,
             "args": {"name": "failures"}}
        )  # fmt: skip
    for fields in frame.to_dict("records"):
        event: dict[str, Any] = {
            "name": str(fields["cause"]),
            "cat": str(fields["action"]),
            "pid": int(fields["seed"]),
            "tid": 0,
            "ts": float(fields["time_s"]) * _US,
            "args": {
                key: (value if isinstance(value, int | float | str) else str(value))
                for key, value in fields.items()
                if key not in {"seed", "time_s", "cause", "action"}
            },
        }
        downtime_us = float(fields["downtime_s"]) * _US
        if downtime_us > 0:
            event.update(ph="X", dur=downtime_us)
        else:
            event.update(ph="i", s="t")
        events.append(event)
    return events


def write_reliability_trace(path: Path, frame: pd.DataFrame) -> None:
    """Write the timeline ``frame`` as Chrome Trace Event JSON to ``path``, atomically."""
    doc = {
        "displayTimeUnit": "ms",
        "otherData": {"contents": "reliability timeline: one process per seed"},
        "traceEvents": reliability_events(frame),
    }
    atomic_write_text(path, json.dumps(doc, separators=(",", ":")) + "\n")
