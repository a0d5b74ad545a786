"""Injected failures in ``trace.json``: a ``failures`` process above the chips and steps.

The process has a thread per injection (``inject.0: lane chip0<->chip1``) with an
instant event at the simulated time the injection applied; a link that went down
also gets a slice over its stall, from the failure to the reroute (``detected_s``,
when routing noticed). A failed step (``step_failed``) is an instant event on a
``step failed`` thread of its own.

The records are ``summary["injections"]`` and ``summary["step_failed"]`` as
``clustersim run`` writes them, so ``clustersim report DIR`` draws the same events
from ``summary.json``. Events come out in injection order with fixed formatting,
so the same records always give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FAILURES_SORT_INDEX", "injection_events", "injection_label", "not_reached"]

# Above the ``steps`` process (-1) and the chips (0, 1, ...): what failed comes first.
FAILURES_SORT_INDEX = -2
_ARGS = ("index", "target", "name", "kind", "factor", "at_s", "applied_s", "detected_s", "effect")


def injection_label(rec: Mapping[str, Any]) -> str:
    """``lane chip0<->chip1 down``, ``chip3 straggle 1.5``: target, name, kind and factor."""
    target, name = str(rec["target"]), str(rec["name"])
    what = name if name.startswith(target) else f"{target} {name}"
    factor = rec.get("factor")
    return f"{what} {rec['kind']}" + (f" {float(factor):g}" if factor is not None else "")


def not_reached(injections: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the injections that never applied (the run ended before their time)."""
    return [int(r["index"]) for r in injections if r.get("applied_s") is None]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3f}"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _meta(name: str, pid: int, tid: int, args: Mapping[str, Any]) -> str:
    return _dumps({"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": dict(args)})


def _event(name: str, ph: str, ts_s: float, pid: int, tid: int, *, args: Mapping[str, Any],
           dur_s: float | None = None) -> str:  # fmt: skip
    timing = f'"ts":{_us(ts_s)}'
    if dur_s is None:
        timing += ',"s":"t"'  # an instant on its thread
    else:  # both ends rounded, as the op slices are
        dur_us = max(round((ts_s + dur_s) * 1e6, 3) - round(ts_s * 1e6, 3), 0.0)
        timing += f',"dur":{dur_us:.3f}'
    return (
        f'{{"name":{_dumps(name)},"cat":"failure","ph":"{ph}",{timing},'
        f'"pid":{pid},"tid":{tid},"args":{_dumps(dict(args))}}}'
    )


def injection_events(
    injections: Sequence[Mapping[str, Any]], step_failed: Mapping[str, Any] | None, pid: int
) -> list[str]:
    """The ``failures`` process's events (metadata first), or none without anything to draw.

    Thread ``index + 1`` holds injection ``index``; thread 0 the failed step.
    Injections that never applied are left out (``otherData`` lists them).
    """
    applied = sorted(
        (r for r in injections if r.get("applied_s") is not None), key=lambda r: int(r["index"])
    )
    if not applied and not step_failed:
        return []
    meta = [
        _meta("process_name", pid, 0, {"name": "failures"}),
        _meta("process_sort_index", pid, 0, {"sort_index": FAILURES_SORT_INDEX}),
    ]
    out: list[str] = []
    if step_failed:
        meta.append(_meta("thread_name", pid, 0, {"name": "step failed"}))
        meta.append(_meta("thread_sort_index", pid, 0, {"sort_index": 0}))
        args = {k: step_failed.get(k) for k in ("step", "cause", "injection", "at_s")}
        name = f"step {step_failed.get('step')} failed: {step_failed.get('cause')}"
        out.append(_event(name, "i", float(step_failed["at_s"]), pid, 0, args=args))
    for rec in applied:
        tid = int(rec["index"]) + 1
        label = injection_label(rec)
        meta.append(_meta("thread_name", pid, tid, {"name": f"inject.{rec['index']}: {label}"}))
        meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        args = {k: rec.get(k) for k in _ARGS}
        t0 = float(rec["applied_s"])
        out.append(_event(label, "i", t0, pid, tid, args=args))
        detected = rec.get("detected_s")
        if detected is not None and float(detected) > t0:
            stall_s = float(detected) - t0
            stall = {**args, "stall_s": stall_s}
            out.append(
                _event("stalled until reroute", "X", t0, pid, tid, args=stall, dur_s=stall_s)
            )
    return meta + out
