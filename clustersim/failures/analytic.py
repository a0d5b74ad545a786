"""Closed forms for checkpoint/restart under exponential failures.

``M`` is the job's mean time between failures, ``d`` (or ``C``) the checkpoint
write time, ``R`` the downtime of one failure (detection, restart, reading the
checkpoint back) and ``tau`` the training time between checkpoints.

- Young (1974): ``tau = sqrt(2 C M)``.
- Daly (2006), the higher-order estimate:
  ``tau = sqrt(2 d M) [1 + (1/3) sqrt(d / 2M) + (1/9) (d / 2M)] - d`` for ``d < 2M``,
  else ``tau = M``.
- Daly's exact model: a segment of ``tau`` training and ``d`` writing is retried
  from its start after every failure, failures also strike during the downtime
  ``R`` (which then starts over), and the expected wall time of one segment is
  ``M e^(R/M) (e^((tau + d)/M) - 1)``. The long-horizon simulation follows this
  model, so its means converge to these expectations.
"""

from __future__ import annotations

import math

__all__ = [
    "daly_interval",
    "expected_ettr",
    "expected_goodput",
    "first_order_ettr",
    "first_order_goodput",
    "young_interval",
]


def young_interval(write_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval, sqrt(2 C M)."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def daly_interval(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum checkpoint interval (``mtbf_s`` when d >= 2M)."""
    d, m = write_s, mtbf_s
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


def expected_ettr(interval_s: float, write_s: float, downtime_s: float, mtbf_s: float) -> float:
    """Useful training time over wall time in Daly's exact model (sync checkpoints)."""
    lam = 1.0 / mtbf_s
    segment = math.exp(lam * downtime_s) * math.expm1(lam * (interval_s + write_s)) / lam
    return interval_s / segment


def expected_goodput(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Useful work over all work done (kept or rolled back) in Daly's exact model.

    A failed attempt of a segment loses the training it did: ``min(X, tau)`` for a
    failure at ``X < tau + d``; there are ``e^((tau + d)/M) - 1`` of them per segment.
    """
    lam, tau, d = 1.0 / mtbf_s, interval_s, write_s
    fail = -math.expm1(-lam * (tau + d))
    lost_if_failed = (
        (-math.expm1(-lam * tau) - lam * tau * math.exp(-lam * tau)) / lam
        + tau * (math.exp(-lam * tau) - math.exp(-lam * (tau + d)))
    ) / fail
    attempts_failed = math.expm1(lam * (tau + d))
    return tau / (tau + attempts_failed * lost_if_failed)


def first_order_ettr(interval_s: float, write_s: float, downtime_s: float, mtbf_s: float) -> float:
    """First-order ETTR: each failure costs half a cycle and the downtime, and a
    cycle of tau + d trains for tau."""
    cycle = interval_s + write_s
    return (1.0 - (cycle / 2.0 + downtime_s) / mtbf_s) * interval_s / cycle


def first_order_goodput(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """First-order goodput: a failure strikes uniformly within a cycle and loses the
    training since the cycle began; failures come at 1/M of wall time."""
    cycle = interval_s + write_s
    lost = (interval_s * interval_s / 2.0 + write_s * interval_s) / cycle
    useful_per_failure = mtbf_s * interval_s / cycle
    return useful_per_failure / (useful_per_failure + lost)
