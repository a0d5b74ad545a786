"""Young's and Daly's intervals against the check values in the references."""

from __future__ import annotations

import math

import pytest

from clustersim.failures import daly_interval, expected_ettr, expected_goodput, young_interval
from clustersim.failures.analytic import first_order_ettr, first_order_goodput

MIN = 60.0


@pytest.mark.parametrize(
    ("mtbf_min", "daly_min", "tol_min"), [(24 * 60, 117, 0.5), (6 * 60, 57, 0.5), (15, 9.1, 0.05)]
)
def test_daly_check_values(mtbf_min: float, daly_min: float, tol_min: float) -> None:
    """d = 5 min: Daly gives 117 min for M = 24 h, 57 min for 6 h, 9.1 min for 15 min."""
    assert daly_interval(5 * MIN, mtbf_min * MIN) / MIN == pytest.approx(daly_min, abs=tol_min)


def test_young() -> None:
    assert young_interval(5 * MIN, 24 * 60 * MIN) == pytest.approx(120 * MIN)
    assert daly_interval(10.0, 4.0) == 4.0  # d >= 2M: Daly says checkpoint every M


def test_daly_is_near_the_exact_optimum() -> None:
    """Daly's estimate approximates the optimum of his exact model."""
    d, m = 5 * MIN, 15 * MIN
    grid = [t * MIN for t in (8.5 + 0.01 * i for i in range(150))]
    best = max(grid, key=lambda t: expected_ettr(t, d, 0.0, m))
    assert best == pytest.approx(daly_interval(d, m), rel=0.02)


def test_first_order_agrees_when_failures_are_rare() -> None:
    tau, d, r, m = 2 * 3600.0, 5 * MIN, 10 * MIN, 24 * 3600.0
    assert first_order_ettr(tau, d, r, m) == pytest.approx(expected_ettr(tau, d, r, m), rel=0.005)
    assert first_order_goodput(tau, d, m) == pytest.approx(expected_goodput(tau, d, m), rel=0.005)
    assert 0 < expected_goodput(tau, d, m) < 1
    assert math.isclose(expected_ettr(tau, 0.0, 0.0, 1e12), 1.0, rel_tol=1e-6)
