"""Error bars: the interval brackets the prediction and widens with fewer rows."""

from __future__ import annotations

import math

import pytest

from clustersim.catalog.fits import Fit, calibration, interval, spread
from clustersim.scenario import load_scenario
from clustersim.sim import simulate


def _with_fit(n_rows: int, rms: float, fitted: int) -> object:
    residuals = {f"r{i}": rms * (1 if i % 2 else -1) for i in range(n_rows)}
    fit = Fit(
        constants={f"c{i}": 0.5 for i in range(fitted)},
        fitted="2026-12-01",
        rows=tuple(residuals),
        residuals=residuals,
        rms=rms,
    )
    return calibration().model_copy(update={"fits": {"a100/test": fit}})


def test_interval_brackets_the_point_and_widens_with_fewer_rows() -> None:
    widths = []
    for n in (3, 5, 10, 40):
        cal = _with_fit(n, 0.04, 1)
        low, high, basis = interval("a100", 10.0, cal)  # type: ignore[arg-type]
        assert low < 10.0 < high
        assert f"{n} calibration rows" in basis
        widths.append(high - low)
    assert widths == sorted(widths, reverse=True)  # more rows, narrower
    # the closed form: t(0.95, dof) s sqrt(1 + 1/n) in log space
    half = spread([0.04, -0.04, 0.04, -0.04, 0.04], 1)
    assert half == pytest.approx(2.1318 * math.sqrt(5 * 0.04**2 / 4) * math.sqrt(1.2), rel=1e-3)


def test_no_residuals_fall_back_to_the_declared_spread() -> None:
    cal = calibration().model_copy(update={"fits": {}})
    low, high, basis = interval("a100", 10.0, cal)
    d = cal.families["a100"].default_spread
    assert (low, high) == pytest.approx((10 / (1 + d), 10 * (1 + d)))
    assert "declared default" in basis
    assert interval("tpu-v9", 1.0, cal)[2].startswith("tpu-v9: no calibration family")


def test_summary_carries_the_interval() -> None:
    res = load_scenario(
        "name: u\ncluster: {instance: p5.48xlarge, count: 1}\nmodel: {name: llama3-8b, layers: 2}\n"
        "parallelism: {tp: 8}\ntraining: {seq_len: 1024, global_batch_size: 8}\n"
    )
    s = simulate(res, record=False).summary
    low, high = s["uncertainty"]["step_time_s"]
    assert low < s["step_time_s"] < high
    t_low, t_high = s["uncertainty"]["tokens_per_s"]
    assert t_low < s["tokens_per_s"] < t_high
    assert s["uncertainty"]["basis"].startswith("h100:")
