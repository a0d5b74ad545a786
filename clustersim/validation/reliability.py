"""Reliability rows: checkpoint intervals and the long-horizon model against closed forms.

- ``daly``: the failures package's Daly interval against the published figure
  (``published_s``), for a checkpoint write time and an MTBF;
- ``young``: its Young interval against ``sqrt(2 C M)`` evaluated here;
- ``ettr`` and ``goodput``: the mean over seeds of the long-horizon Monte Carlo
  (one exponential class of job failures, checkpoints every Daly interval)
  against Daly's exact expectation for exponential failures
  (``failures.analytic.expected_ettr`` / ``expected_goodput``).
"""

from __future__ import annotations

import math
import time

from clustersim.validation.rows import ReliabilityRef, Row

__all__ = ["run_reliability_row"]


def _predicted(ref: ReliabilityRef) -> tuple[float, float, str]:
    """(expected, predicted, metric) of one row."""
    from clustersim.failures import (
        FailureClass,
        JobModel,
        daly_interval,
        expected_ettr,
        expected_goodput,
        run_seeds,
        young_interval,
    )

    d, m = ref.write_s, ref.mtbf_s
    if ref.check == "daly":
        assert ref.published_s is not None
        return ref.published_s, daly_interval(d, m), "Daly interval"
    if ref.check == "young":
        return math.sqrt(2.0 * d * m), young_interval(d, m), "Young interval"
    tau = daly_interval(d, m)
    cls = FailureClass("job", "any failure", "job", 1, m, 1.0, 0.0, "job")
    job = JobModel(
        classes=(cls,),
        step_time_s=1.0,
        tokens_per_step=1.0,
        interval_s=tau,
        write_s=d,
        read_s=0.0,
        restart_s=ref.downtime_s,
        horizon_s=ref.horizon_mtbfs * m,
    )
    outs = run_seeds(job, ref.seeds)
    if ref.check == "ettr":
        mean = sum(o.ettr(1.0) for o in outs) / len(outs)
        return expected_ettr(tau, d, ref.downtime_s, m), mean, "ETTR, Monte Carlo"
    mean = sum(o.goodput for o in outs) / len(outs)
    return expected_goodput(tau, d, m), mean, "goodput, Monte Carlo"


def run_reliability_row(ref: ReliabilityRef) -> Row:
    t0 = time.perf_counter()
    expected, predicted, metric = _predicted(ref)
    unit = "s" if ref.check in ("daly", "young") else "fraction"
    return Row(
        name=ref.name,
        kind="reliability",
        metric=metric,
        unit=unit,
        published=expected,
        predicted=predicted,
        tolerance=ref.tolerance,
        source=ref.source,
        wall_s=time.perf_counter() - t0,
        extra={"write_s": ref.write_s, "mtbf_s": ref.mtbf_s},
    )
