"""Failure processes: counts against rate x time, Weibull lifetimes, presets that scale."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from clustersim.failures import preset, resolve_classes, run_seeds, sample_failures
from clustersim.failures.processes import expected_failures
from clustersim.scenario.failures import FailuresCfg

from .helpers import job, one_class

DAY = 86400.0


def test_exponential_count_is_rate_times_time() -> None:
    """The simulated mean interruption count equals rate x time within statistical error."""
    mtbf, horizon, seeds = 2 * 3600.0, 30 * DAY, 40
    m = job(mtbf, 1800.0, 60.0, 300.0, horizon)
    counts = [len(o.events) for o in run_seeds(m, seeds)]
    expected = horizon / mtbf  # failures strike during downtime too: every one counts
    sem = math.sqrt(expected / seeds)  # Poisson
    assert abs(np.mean(counts) - expected) < 4 * sem
    assert np.var(counts, ddof=1) == pytest.approx(expected, rel=0.5)


def test_rates_scale_with_component_count() -> None:
    rng = np.random.default_rng(1)
    small = sample_failures(one_class(1000 * DAY, components=1024), 365 * DAY, rng)
    big = sample_failures(one_class(1000 * DAY, components=102_400), 365 * DAY, rng)
    assert len(small) == pytest.approx(1024 * 0.365, rel=0.15)
    assert len(big) == pytest.approx(102_400 * 0.365, rel=0.02)
    assert np.all(np.diff(big) >= 0) and big.max() < 365 * DAY


@pytest.mark.parametrize("shape", [0.7, 2.0])
def test_weibull_lifetimes(shape: float) -> None:
    """First failures follow the Weibull law of the class's shape and MTBF, and over
    a long horizon each component fails once per MTBF (renewal theorem)."""
    mtbf, n = 100.0, 50_000
    cls = one_class(mtbf, components=n, shape=shape)
    assert cls.scale_s * math.gamma(1 + 1 / shape) == pytest.approx(mtbf)
    rng = np.random.default_rng(7)
    # A horizon by which 1% of components fail: the times are (almost all) first
    # lifetimes, censored at the horizon.
    law = stats.weibull_min(shape, scale=cls.scale_s)
    horizon = float(law.ppf(0.01))
    times = sample_failures(cls, horizon, rng)
    assert len(times) == pytest.approx(n * 0.01, rel=0.15)
    censored = stats.truncweibull_min(shape, a=0, b=horizon / cls.scale_s, scale=cls.scale_s)
    assert stats.kstest(times, censored.cdf).pvalue > 0.001
    # Long run: n x horizon / MTBF failures.
    long = sample_failures(one_class(mtbf, components=200, shape=shape), 200 * mtbf, rng)
    assert len(long) == pytest.approx(200 * 200, rel=0.05)


def test_weibull_wear_out_fails_late() -> None:
    """Shape > 1: new components rarely fail early, unlike exponential ones."""
    rng = np.random.default_rng(3)
    early = {
        k: len(sample_failures(one_class(100.0, components=5000, shape=k), 10.0, rng))
        for k in (1.0, 3.0)
    }
    assert early[3.0] < 0.1 * early[1.0]


def test_llama3_preset_reproduces_its_fleet() -> None:
    """On its own fleet (16,384 GPUs, 2,048 servers) the preset expects 419 in 54 days."""
    counts = {"chip": 16_384, "instance": 2048, "nic": 0, "switch": 0, "link": 0, "job": 1}
    classes = resolve_classes(FailuresCfg(preset="llama3-54d"), counts)
    assert expected_failures(classes, 54 * DAY) == pytest.approx(419)
    faulty = next(c for c in classes if c.cause == "Faulty GPU")
    assert faulty.mtbf_s / DAY == pytest.approx(16_384 * 54 / 148)
    half = resolve_classes(
        FailuresCfg(preset="llama3-54d"), {**counts, "chip": 8192, "instance": 1024}
    )
    # Everything but the per-job class halves.
    assert expected_failures(half, 54 * DAY) == pytest.approx((419 - 2) / 2 + 2)
    assert "sources" in preset("llama3-54d").model_dump()


def test_rsc_presets() -> None:
    counts = {"chip": 16_384, "instance": 2048, "nic": 0, "switch": 0, "link": 0, "job": 1}
    for name, per_1000 in (("rsc1", 6.50), ("rsc2", 2.34)):
        classes = resolve_classes(FailuresCfg(preset=name), counts)
        per_node_day = expected_failures(classes, DAY) / 2048
        assert per_node_day * 1000 == pytest.approx(per_1000)
    # RSC-1 at 16,384 GPUs: job MTTF 1.8 h, as the paper projects.
    rsc1 = resolve_classes(FailuresCfg(preset="rsc1"), counts)
    assert 1 / sum(c.rate_per_s for c in rsc1) / 3600 == pytest.approx(1.8, abs=0.05)


def test_user_rates_override_and_add() -> None:
    counts = {"chip": 64, "instance": 4, "nic": 64, "switch": 2, "link": 100, "job": 1}
    cfg = FailuresCfg.model_validate(
        {
            "preset": "rsc2",
            "rates": {
                "node": {"mtbf": "100d"},  # replaces the preset's observation
                "cable": {"mtbf": "1000d", "per": "link", "effect": "link", "shape": 1.5},
            },
        }
    )
    classes = {c.name: c for c in resolve_classes(cfg, counts)}
    assert classes["node"].mtbf_s == pytest.approx(100 * DAY)
    assert classes["node"].per == "instance" and classes["node"].components == 4
    assert classes["cable"].components == 100 and classes["cable"].shape == 1.5
