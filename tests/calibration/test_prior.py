"""A family too thin to fit its own constants takes its prior family's fitted efficiencies."""

from __future__ import annotations

from typing import Any

import pytest

from clustersim.catalog import chip
from clustersim.catalog.fits import (
    CalibrationFile,
    calibration,
    fit_overrides,
    fit_source,
    parse_calibration,
)
from clustersim.errors import CatalogError


def _with(**changes: Any) -> CalibrationFile:
    data = calibration().model_dump()
    for path, value in changes.items():
        *keys, last = path.split("__")
        node = data
        for k in keys:
            node = node[k]
        node[last] = value
    return parse_calibration(data)


def _fit(constants: dict[str, float]) -> dict[str, Any]:
    return {
        "constants": constants, "fitted": "2026-01-01", "rows": ["a", "b"],
        "residuals": {"a": 0.0, "b": 0.0}, "rms": 0.0,
    }  # fmt: skip


def test_a_family_without_a_fit_takes_its_priors_efficiencies_only() -> None:
    fits = {
        "h100/megatron-core": _fit(
            {"compute_efficiency": 0.9, "hbm_efficiency": 0.7, "op_overhead_s": 1e-5}
        )
    }
    overhead = {"bounds": [0, 1e-4], "what": "x"}
    cal = _with(fits=fits, families__b200__constants__op_overhead_s=overhead)
    assert cal.families["b200"].prior == "h100"
    assert fit_source("b200", "nemo-24.07", cal) == "h100/megatron-core"
    # a time is the chip's own, never lent: only the fractions of peak
    lent = fit_overrides("b200", "nemo-24.07", cal)
    # (and only those b200 declares: hbm_efficiency is not among them)
    assert lent == {"compute_efficiency": 0.9}
    assert fit_overrides("h100", "nemo-24.07", cal)["op_overhead_s"] == 1e-5
    # only the same stack is lent: no prior fit of another stack, nothing
    other = {"what": "x", "families": ["h100", "b200"]}
    cal2 = _with(fits=fits, stacks__other=other)
    assert fit_overrides("b200", "other", cal2) == {}
    # without the prior, nothing
    bare = _with(fits=fits, families__b200__prior=None)
    assert fit_overrides("b200", "nemo-24.07", bare) == {}


def test_a_family_with_its_own_fit_ignores_its_prior() -> None:
    fits = {
        "h100/megatron-core": _fit({"attention_efficiency": 0.4}),
        "b200/megatron-core": _fit({"attention_efficiency": 0.6}),
    }
    cal = _with(fits=fits)
    assert fit_source("b200", "nemo-24.07", cal) == "b200/megatron-core"
    assert fit_overrides("b200", "nemo-24.07", cal) == {"attention_efficiency": 0.6}
    pooled = _with(fits={**fits, "b200/all": fits.pop("b200/megatron-core")})
    assert fit_overrides("b200", "nemo-24.07", pooled) == {"attention_efficiency": 0.6}


def test_shipped_prior_shares_the_vendor_and_its_interval_keeps_the_default() -> None:
    from clustersim.catalog.fits import model_spread

    cal = calibration()
    for fam in cal.families.values():
        if fam.prior is not None:
            vendors = {chip(c).vendor for c in fam.chips + cal.families[fam.prior].chips}
            assert len(vendors) == 1
    _, basis = model_spread("b200", cal)
    assert "declared default" in basis


@pytest.mark.parametrize("prior", ["b200", "nope"])
def test_a_prior_must_be_another_declared_family(prior: str) -> None:
    with pytest.raises(CatalogError, match="prior"):
        _with(families__b200__prior=prior)


def test_a_prior_with_a_prior_is_refused() -> None:
    with pytest.raises(CatalogError, match="prior of its own"):
        _with(families__h100__prior="a100")
