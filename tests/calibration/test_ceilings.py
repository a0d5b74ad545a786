"""Physical ceilings: no constant, fitted or declared, at or above the best measured kernel."""

from __future__ import annotations

from typing import Any

import pytest

from clustersim.catalog.fits import (
    CEILING_MARGIN,
    CalibrationFile,
    calibration,
    ceiling_problems,
    parse_calibration,
)
from clustersim.errors import CatalogError


def _with(data: dict[str, Any]) -> CalibrationFile:
    return parse_calibration(data)


def _ceilinged() -> list[tuple[str, str, float]]:
    cal = calibration()
    return [
        (fam, name, spec.ceiling.value)
        for fam, family in cal.families.items()
        for name, spec in family.constants.items()
        if spec.ceiling is not None
    ]


def test_the_shipped_fits_and_catalog_stay_under_every_ceiling() -> None:
    assert ceiling_problems() == []
    assert _ceilinged(), "the catalog declares ceilings"


def test_bounds_may_not_reach_above_a_ceiling() -> None:
    data = calibration().model_dump()
    fam, name, value = _ceilinged()[0]
    data["families"][fam]["constants"][name]["bounds"] = [0.1, value * 1.1]
    with pytest.raises(CatalogError, match="above the ceiling"):
        _with(data)


def test_a_fit_pressing_on_its_ceiling_is_named() -> None:
    data = calibration().model_dump()
    fam, name, value = _ceilinged()[0]
    key = next(k for k in data["fits"] if k.startswith(f"{fam}/"))
    data["fits"][key]["constants"][name] = value * (1 - CEILING_MARGIN / 2)
    found = ceiling_problems(_with(data))
    assert len(found) == 1
    assert found[0].startswith(f"{key}: {name}") and "presses on its ceiling" in found[0]
    data["fits"][key]["constants"][name] = value * (1 - 2 * CEILING_MARGIN)
    assert ceiling_problems(_with(data)) == []
