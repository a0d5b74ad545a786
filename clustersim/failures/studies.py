"""Monte Carlo over seeds and the checkpoint-interval study, on a local process pool.

Every replication draws its random numbers from ``(base_seed, seed)`` alone, so a
study gives the same figures whatever the number of workers. Results carry
95% confidence intervals (Student's t over the seeds).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from clustersim.errors import ScenarioError
from clustersim.failures.jobs import JobSetup, build_job
from clustersim.failures.reliability import (
    EVENT_COLUMNS,
    TIME_PARTS,
    JobModel,
    Outcome,
    simulate_job,
)

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.scenario import Resolved

__all__ = [
    "TIMELINE_FILE",
    "add_reliability",
    "checkpoint_study",
    "default_workers",
    "evaluate",
    "mean_ci",
    "run_seeds",
    "summarise",
    "timeline_frame",
]

TIMELINE_FILE = "reliability_timeline.parquet"
Progress = Callable[[int, int], None]
"""Called with (done, total) as replications finish."""


def _one(args: tuple[JobModel, int, int]) -> Outcome | tuple[str, Any, str]:
    """One replication; bad input comes back as the error's fields (a ``ScenarioError``
    does not survive pickling between processes)."""
    model, seed, base = args
    try:
        return simulate_job(model, seed, base)
    except ScenarioError as exc:
        return (exc.path, exc.value, exc.problem)


def _outcome(result: Outcome | tuple[str, Any, str]) -> Outcome:
    if isinstance(result, tuple):
        raise ScenarioError(*result)
    return result


def _map(
    tasks: list[tuple[JobModel, int, int]], workers: int, progress: Progress | None
) -> list[Outcome]:
    """Run the tasks, serially or on a process pool; results in task order."""
    total = len(tasks)
    out: list[Outcome | None] = [None] * total
    if workers <= 1 or total <= 1:
        for i, task in enumerate(tasks):
            out[i] = _outcome(_one(task))
            if progress is not None:
                progress(i + 1, total)
    else:
        with ProcessPoolExecutor(max_workers=min(workers, total)) as pool:
            futures = {pool.submit(_one, task): i for i, task in enumerate(tasks)}
            for done, fut in enumerate(as_completed(futures), 1):
                out[futures[fut]] = _outcome(fut.result())
                if progress is not None:
                    progress(done, total)
    return [o for o in out if o is not None]


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_seeds(
    model: JobModel,
    seeds: int,
    base_seed: int = 0,
    *,
    workers: int = 1,
    progress: Progress | None = None,
) -> list[Outcome]:
    """``seeds`` replications (seeds 0 .. seeds-1), in seed order."""
    return _map([(model, s, base_seed) for s in range(seeds)], workers, progress)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, list[float] | None]:
    """Mean, and its t-interval (None with fewer than two values or no spread)."""
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean()) if arr.size else math.nan
    if arr.size < 2:
        return mean, None
    sem = float(arr.std(ddof=1)) / math.sqrt(arr.size)
    if sem == 0:
        return mean, [mean, mean]
    from scipy import stats

    lo, hi = stats.t.interval(level, arr.size - 1, loc=mean, scale=sem)
    return mean, [float(lo), float(hi)]


def summarise(
    setup: JobSetup,
    outcomes: Sequence[Outcome],
    usd_per_hour: float,
    *,
    preset: str | None,
    instances: int,
    wall_s: float,
) -> dict[str, Any]:
    """The ``reliability`` section of ``summary.json``: means over seeds, with CIs."""
    m = setup.model
    rate = m.tokens_per_s
    usd_h = usd_per_hour * (instances + m.spares) / instances  # hot spares are paid for too
    per: dict[str, list[float]] = {k: [] for k in ("interruptions", "restarts", "goodput", "ettr")}
    per["usd_per_million_useful_tokens"] = []
    causes = sorted({c.cause for c in m.classes})
    counts = dict.fromkeys(causes, 0.0)
    lost_by = dict.fromkeys(causes, 0.0)
    down_by = dict.fromkeys(causes, 0.0)
    for o in outcomes:
        per["interruptions"].append(len(o.events))
        per["restarts"].append(sum(1 for e in o.events if e[4] in ("restart", "migrate")))
        per["goodput"].append(o.goodput)
        per["ettr"].append(o.ettr(rate))
        usd = usd_h * o.wall_s / 3600.0
        per["usd_per_million_useful_tokens"].append(
            usd / (o.useful_tokens / 1e6) if o.useful_tokens > 0 else math.inf
        )
        for e in o.events:
            counts[e[2]] += 1
            lost_by[e[2]] += e[6]
            down_by[e[2]] += e[7]
    n = max(len(outcomes), 1)
    stats: dict[str, tuple[float | None, list[float] | None]] = {
        k: mean_ci(v) if all(math.isfinite(x) for x in v) else (None, None) for k, v in per.items()
    }  # a replication with no useful work has no cost per useful token
    for key in ("goodput", "ettr"):  # fractions: an interval from few seeds stays in [0, 1]
        mean, ci = stats[key]
        stats[key] = (mean, None if ci is None else [max(ci[0], 0.0), min(ci[1], 1.0)])
    reached = [o.time_to_target_s for o in outcomes if o.time_to_target_s is not None]
    ttt = (
        mean_ci(reached) if m.target_tokens is not None and len(reached) == len(outcomes) else None
    )
    useful = float(np.mean([o.useful_tokens for o in outcomes]))
    lost = float(np.mean([o.lost_tokens for o in outcomes]))
    wall = float(np.mean([o.wall_s for o in outcomes]))
    return {
        "preset": preset,
        "recovery": m.recovery,
        "seeds": len(outcomes),
        "horizon_s": m.horizon_s,
        "target_tokens": m.target_tokens,
        "simulated_s": wall,
        "step_time_s": m.step_time_s,
        "degraded_step_time_s": m.degraded_step_time_s,
        "tokens_per_step": m.tokens_per_step,
        "mtbf_s": setup.mtbf_s,
        "failures_per_day": 86400.0 / setup.mtbf_s,
        "checkpoint": {
            "mode": m.mode,
            "interval_s": m.interval_s,
            "size_bytes": setup.checkpoint_bytes,
            "write_s": m.write_s,
            "read_s": m.read_s,
            "young_s": setup.young_s,
            "daly_s": setup.daly_s,
        },
        "classes": [
            {
                "name": c.name,
                "cause": c.cause,
                "per": c.per,
                "components": c.components,
                "mtbf_s": c.mtbf_s,
                "shape": c.shape,
                "effect": c.effect,
                "repair_s": c.repair_s,
                "failures_per_day": c.rate_per_s * 86400.0,
            }
            for c in m.classes
        ],
        "interruptions": stats["interruptions"][0],
        "restarts": stats["restarts"][0],
        "interruptions_by_cause": {c: counts[c] / n for c in causes},
        "lost": {
            "tokens": lost,
            "training_s": lost / rate,
            "downtime_s": sum(down_by.values()) / n,
            "by_cause": {
                c: {"tokens": lost_by[c] / n, "downtime_s": down_by[c] / n} for c in causes
            },
        },
        "time_s": {k: float(np.mean([o.time_s[k] for o in outcomes])) for k in TIME_PARTS},
        "degraded_s": float(np.mean([o.degraded_s for o in outcomes])),
        "useful_tokens": useful,
        "tokens_processed": useful + lost,
        "goodput": stats["goodput"][0],
        "ettr": stats["ettr"][0],
        "time_to_target_s": ttt[0] if ttt is not None else None,
        "target_reached": (len(reached) / n) if m.target_tokens is not None else None,
        "cost": {
            "usd_per_hour": usd_h,
            "usd_total": usd_h * wall / 3600.0,
            "usd_per_million_useful_tokens": stats["usd_per_million_useful_tokens"][0],
        },
        "ci95": {
            **{k: v[1] for k, v in stats.items()},
            "time_to_target_s": ttt[1] if ttt is not None else None,
        },
        "wall_s": wall_s,
    }


def timeline_frame(outcomes: Sequence[Outcome]) -> pd.DataFrame:
    """One row per failure of every seed: ``seed`` and :data:`EVENT_COLUMNS`."""
    import pandas as pd

    rows = [(o.seed, *e) for o in outcomes for e in o.events]
    frame = pd.DataFrame(rows, columns=["seed", *EVENT_COLUMNS])
    return frame.astype(
        {"seed": "int64", "time_s": "float64", "lost_tokens": "float64", "downtime_s": "float64"}
    )


def checkpoint_study(
    setup: JobSetup,
    seeds: int,
    base_seed: int = 0,
    *,
    intervals_s: Sequence[float] | None = None,
    points: int = 17,
    span: float = 4.0,
    workers: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """ETTR against the checkpoint interval, with the simulated optimum beside Young and Daly.

    The grid runs from Daly's interval / ``span`` to x ``span`` (geometric). Every
    interval sees the same failures for a given seed (common random numbers), so
    differences between intervals are not drowned by failure noise. The optimum is
    the best grid point refined by a parabola through it and its neighbours in
    log(interval).
    """
    t0 = time.perf_counter()
    m = setup.model
    if intervals_s is None:
        centre = setup.daly_s if setup.daly_s > 0 else m.interval_s
        intervals_s = list(np.geomspace(centre / span, centre * span, points))
    grid = [max(float(t), m.step_time_s) for t in intervals_s]
    tasks = [(replace(m, interval_s=t), s, base_seed) for t in grid for s in range(seeds)]
    outs = _map(tasks, workers, progress)
    rows = []
    ettr = np.empty((len(grid), seeds))
    for i, t in enumerate(grid):
        chunk = outs[i * seeds : (i + 1) * seeds]
        ettr[i] = [o.ettr(m.tokens_per_s) for o in chunk]
        mean, ci = mean_ci(ettr[i])
        good, _ = mean_ci([o.goodput for o in chunk])
        rows.append({"interval_s": t, "ettr": mean, "ettr_ci95": ci, "goodput": good})
    means = ettr.mean(axis=1)
    best = int(np.argmax(means))
    refined = grid[best]
    if 0 < best < len(grid) - 1:
        x = np.log(grid[best - 1 : best + 2])
        a, b, _ = np.polyfit(x, means[best - 1 : best + 2], 2)
        if a < 0:
            refined = float(np.exp(np.clip(-b / (2 * a), x[0], x[-1])))
    return {
        "mtbf_s": setup.mtbf_s,
        "checkpoint_cost_s": setup.checkpoint_cost_s,
        "seeds": seeds,
        "rows": rows,
        "best_grid_s": grid[best],
        "best_s": refined,
        "young_s": setup.young_s,
        "daly_s": setup.daly_s,
        "wall_s": time.perf_counter() - t0,
    }


def evaluate(
    res: Resolved,
    step_time_s: float,
    usd_per_hour: float,
    *,
    degraded_step_time_s: float | None = None,
    seeds: int | None = None,
    workers: int = 1,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[Outcome]]:
    """The scenario's reliability summary at a measured step time, and its replications."""
    t0 = time.perf_counter()
    cfg = res.scenario.failures
    setup = build_job(res, step_time_s, degraded_step_time_s)
    outcomes = run_seeds(
        setup.model, seeds or cfg.seeds, res.scenario.seed, workers=workers, progress=progress
    )
    summary = summarise(
        setup,
        outcomes,
        usd_per_hour,
        preset=cfg.preset,
        instances=res.scenario.cluster.count,
        wall_s=time.perf_counter() - t0,
    )
    return summary, outcomes


def add_reliability(
    res: Resolved, summary: dict[str, Any], *, degraded: dict[str, Any] | None = None
) -> list[Outcome]:
    """Add ``reliability`` to a run's summary when the scenario configures it.

    Uses the step time and the hourly price the step simulation measured, and
    ``degraded`` (``step_time_s`` and how it was found) when the degraded step time
    was derived; returns the replications (for the timeline), or an empty list.
    """
    cfg = res.scenario.failures
    if not cfg.reliability:
        return []
    # In-process: a run may itself be a worker of a study's process pool.
    summary["reliability"], outcomes = evaluate(
        res,
        summary["step_time_s"],
        summary["cost"]["usd_per_hour"],
        degraded_step_time_s=degraded["step_time_s"] if degraded is not None else None,
        workers=1,
    )
    if degraded is not None:
        summary["reliability"]["degraded_step"] = degraded
    # A run's summary keeps its wall-clock time in the top-level keys only, so that
    # the rest of it is the same byte for byte for the same scenario and seed.
    summary["reliability"].pop("wall_s", None)
    return outcomes
