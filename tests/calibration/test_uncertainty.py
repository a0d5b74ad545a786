"""Error bars: the interval brackets the prediction, is built from leave-one-out
residuals, widens with fewer rows, and never narrows below the references' own noise."""

from __future__ import annotations

import math

import pytest
from scipy.special import stdtrit

from clustersim.catalog.fits import CalibrationFile, Fit, calibration, interval, spread
from clustersim.scenario import load_scenario
from clustersim.sim import simulate


def _with_fit(n_rows: int, rms: float, fitted: int, noise: float | None = None) -> CalibrationFile:
    residuals = {f"r{i}": rms * (1 if i % 2 else -1) for i in range(n_rows)}
    fit = Fit(
        constants={f"c{i}": 0.5 for i in range(fitted)},
        fitted="2026-12-01",
        rows=tuple(residuals),
        residuals={k: 0.5 * v for k, v in residuals.items()},  # in sample: never read
        loo_residuals=residuals,
        rms=rms,
    )
    cal = calibration()
    families = dict(cal.families)
    if noise is not None:
        fam = families["a100"]
        ref = fam.reference_noise.model_copy(update={"spread": noise})
        families["a100"] = fam.model_copy(update={"reference_noise": ref})
    return cal.model_copy(update={"fits": {"a100/test": fit}, "families": families})


def test_interval_brackets_the_point_and_widens_with_fewer_rows() -> None:
    widths = []
    for n in (3, 5, 10, 40):
        low, high, basis = interval("a100", 10.0, _with_fit(n, 0.04, 1))
        assert low < 10.0 < high
        assert f"{n} rows left out in turn, {n - 1} dof" in basis
        widths.append(high - low)
    assert widths == sorted(widths, reverse=True)  # more rows, narrower


def test_spread_is_students_t_on_the_left_out_residuals() -> None:
    loo = [0.04, -0.04, 0.04, -0.04, 0.04]
    # t(0.95, n - 1) sqrt(sum e^2 / n): t(0.95, 4) = 2.1318
    assert spread(loo) == pytest.approx(2.1318 * 0.04, rel=1e-4)
    assert spread([0.04]) is None  # one error measures no spread
    # the interval reads the left-out residuals, not the in-sample ones
    cal = _with_fit(5, 0.04, 1, noise=0.0)
    low, high, _ = interval("a100", 10.0, cal)
    assert math.log(high / 10.0) == pytest.approx(2.1318 * 0.04, rel=1e-4)
    assert math.log(10.0 / low) == pytest.approx(2.1318 * 0.04, rel=1e-4)


def test_reference_noise_joins_in_quadrature_and_floors_the_interval() -> None:
    model = 2.1318 * 0.04
    for noise in (0.0, 0.03, 0.10):
        low, high, basis = interval("a100", 10.0, _with_fit(5, 0.04, 1, noise=noise))
        assert math.log(high / 10.0) == pytest.approx(
            math.hypot(model, math.log1p(noise)), rel=1e-4
        )
        assert f"{noise:.1%} reference noise" in basis
    # a fit that matches its rows exactly still leaves the references' own noise
    low, high, _ = interval("a100", 10.0, _with_fit(5, 0.0, 1, noise=0.10))
    assert (low, high) == pytest.approx((10.0 / 1.1, 11.0))
    # every shipped family declares its noise with the line that states it
    for name, fam in calibration().families.items():
        assert fam.reference_noise.source.startswith("../shared/REFERENCES.md"), name


def test_no_residuals_fall_back_to_the_declared_spread() -> None:
    cal = calibration().model_copy(update={"fits": {}})
    low, high, basis = interval("a100", 10.0, cal)
    fam = cal.families["a100"]
    d, noise = fam.default_spread, fam.reference_noise.spread
    half = math.hypot(math.log1p(d), math.log1p(noise))
    assert (low, high) == pytest.approx((10 * math.exp(-half), 10 * math.exp(half)))
    assert "declared default" in basis
    assert interval("tpu-v9", 1.0, cal)[2].startswith("tpu-v9: no calibration family")


def test_shipped_intervals_come_from_left_out_residuals() -> None:
    cal = calibration()
    for key, fit in cal.fits.items():
        assert set(fit.loo_residuals) == set(fit.rows), key
    _, high, basis = interval("trn2", 1.0)
    assert "rows left out in turn" in basis
    assert high > 1.10  # at least the Neuron SDK's drift between releases


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


def test_a_family_is_never_narrower_than_every_familys_rows_together() -> None:
    # a100: five rows left out at ±1%; h100: five at ±10%. Pooled: sqrt((5e-4 + 5e-2) / 10).
    def fit(rms: float) -> Fit:
        loo = {f"r{i}": rms * (1 if i % 2 else -1) for i in range(5)}
        return Fit(constants={"c": 0.5}, fitted="2026-12-01", rows=tuple(loo),
                   residuals=loo, loo_residuals=loo, rms=rms)  # fmt: skip

    base = calibration()
    families = {
        name: fam.model_copy(
            update={"reference_noise": fam.reference_noise.model_copy(update={"spread": 0.0})}
        )
        for name, fam in base.families.items()
    }
    cal = base.model_copy(
        update={"fits": {"a100/x": fit(0.01), "h100/y": fit(0.10)}, "families": families}
    )
    pooled = spread([0.01] * 5 + [0.10] * 5)
    assert pooled == pytest.approx(stdtrit(9, 0.95) * math.sqrt((5 * 0.01**2 + 5 * 0.10**2) / 10))
    _, high, basis = interval("a100", 10.0, cal)
    assert math.log(high / 10.0) == pytest.approx(pooled)
    assert "floored at every family's 10 rows'" in basis
    _, high, basis = interval("h100", 10.0, cal)  # its own spread is wider: kept
    assert math.log(high / 10.0) == pytest.approx(spread([0.10] * 5))
    assert "floored" not in basis
