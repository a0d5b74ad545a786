"""The study's work guard: the whole study's events and memory, estimated up front.

``clustersim run`` refuses one scenario that would simulate too much
(``sim.guard``); a study of many points, each within that limit, can still add up
to days of simulation. Before any point runs, each point still to run is
estimated as ``run`` estimates it (``sim.guard.estimate``, with the fidelity the
point will run at, and the detailed step of a derived ``continue_degraded`` step
time on top), and the study is refused when

- its events, summed over the points, exceed ``max_events``, or
- its memory, the points that run at once (one per worker, the largest ones)
  added up, exceeds ``max_memory_bytes``,

with the estimate and a remedy. Points alike in what the estimate reads (cluster
size, model, parallelism, training, output, failures: not calibration figures or
a seed) are estimated once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clustersim.errors import ScenarioError
from clustersim.scenario import apply_set, resolve
from clustersim.sweep.axes import Point
from clustersim.units import format_bytes

if TYPE_CHECKING:
    from clustersim.sim import Fidelity

__all__ = ["STUDY_MAX_EVENTS", "StudyEstimate", "StudyLimits", "check_study_work"]

STUDY_MAX_EVENTS = 2e9
"""About two hours of one core at the 250,000-300,000 events per second that
``clustersim bench`` measures per worker (README, Performance): a study bigger than
that is refused unless ``--max-events`` allows it."""


@dataclass(frozen=True)
class StudyLimits:
    """What a whole study may use: events over all its points, and memory at once."""

    max_events: float = STUDY_MAX_EVENTS
    max_memory_bytes: float = 8 * 2**30


@dataclass(frozen=True)
class StudyEstimate:
    points: int
    events: float
    memory_bytes: float  # the largest points that run at once, added up
    largest_events: float
    concurrent: int


def _key(data: dict[str, Any]) -> str:
    """What the estimate of a point reads, as text (calibration and seeds left out)."""
    cluster = dict(data.get("cluster") or {})
    chip = cluster.get("chip")
    if isinstance(chip, dict):
        cluster["chip"] = {k: v for k, v in chip.items() if k != "calibration"}
    for figures in ("neuronlink", "efa", "ultraserver", "prices_usd_per_hour", "collectives"):
        cluster.pop(figures, None)
    wanted = {k: data.get(k) for k in ("model", "parallelism", "training", "output", "failures")}
    return json.dumps({"cluster": cluster, **wanted}, sort_keys=True, default=str)


def _point_work(data: dict[str, Any], fidelity: Fidelity) -> tuple[float, float]:
    """(events, memory bytes) of one point, as ``run`` would estimate them."""
    from clustersim.sim import estimate_run

    try:
        est = estimate_run(resolve(data), fidelity)
    except ScenarioError:  # a layout that does not divide, say: the point fails at once
        return 0.0, 0.0  # and is recorded with its error, as the study goes on
    return est.events, est.memory_bytes


def check_study_work(
    base: dict[str, Any],
    points: Sequence[Point],
    fidelity: Fidelity,
    limits: StudyLimits,
    *,
    concurrent: int,
) -> StudyEstimate:
    """Refuse a study whose ``points`` (those still to run, all valid) exceed ``limits``
    together; return the estimate otherwise."""
    memo: dict[str, tuple[float, float]] = {}
    works: list[tuple[float, float]] = []
    for p in points:
        data = copy.deepcopy(base)
        for assignment in p.overrides:
            apply_set(data, assignment)
        key = _key(data)
        work = memo.get(key)
        if work is None:
            work = memo[key] = _point_work(data, fidelity)
        works.append(work)
    events = sum(e for e, _ in works)
    concurrent = max(1, min(concurrent, len(works)))
    memory = sum(sorted((m for _, m in works), reverse=True)[:concurrent])
    largest = max((e for e, _ in works), default=0.0)
    est = StudyEstimate(len(works), events, memory, largest, concurrent)
    fewer = (
        "run fewer points (fewer axis values, seeds or draws), lower training.steps or "
        "training.global_batch_size in the base"
    )
    if events > limits.max_events:
        raise ScenarioError(
            "axes",
            f"{events:.3g} events",
            f"this study would simulate about {events:.3g} events over its {len(works):,} "
            f"points to run (the largest {largest:.3g}), over the study limit of "
            f"{limits.max_events:.3g}; {fewer}, set run.fidelity: folded, or raise the "
            "limit (--max-events)",
        )
    if memory > limits.max_memory_bytes:
        raise ScenarioError(
            "axes",
            format_bytes(memory),
            f"this study would need about {format_bytes(memory)} of memory with "
            f"{concurrent} points running at once, over the study limit of "
            f"{format_bytes(limits.max_memory_bytes)}; use fewer workers, set "
            "output.trace: false in the base, "
            f"{fewer}, or raise the limit (--max-memory)",
        )
    return est
