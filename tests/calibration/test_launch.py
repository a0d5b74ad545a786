"""The launch profile: at the catalog's launch it is the shipped fits, its least joint
squares is the catalog's launch, and bad grids exit 2."""

from __future__ import annotations

import math

import pytest

from clustersim import catalog
from clustersim.calibration import launch
from clustersim.catalog.fits import calibration
from clustersim.serve.references import ROWS

CATALOG_LAUNCH_US = catalog.chip("trn1").collectives.launch_s * 1e6


@pytest.mark.slow
def test_profile_at_the_catalog_launch_is_the_shipped_fit() -> None:
    """At the catalog's launch, and 20 us either side (the grid it was fitted on)."""
    points = launch.profile([CATALOG_LAUNCH_US - 20, CATALOG_LAUNCH_US, CATALOG_LAUNCH_US + 20])
    point = points[1]
    assert point.collectives["launch_s"] == pytest.approx(CATALOG_LAUNCH_US * 1e-6)
    shipped = calibration().fits["trainium/nxd-training"]
    for name, value in shipped.constants.items():
        assert point.constants[name] == pytest.approx(value, rel=0.005)
    assert set(point.step_errors) == set(shipped.rows)  # calibration rows only
    for row, err in point.step_errors.items():  # the simulated error, the fit's log residual
        assert math.log1p(err) == pytest.approx(shipped.residuals[row], abs=0.003)
    rows = {r.id for r in ROWS if r.role == "calibration" and r.instance != "p5.48xlarge"}
    assert {k.split()[0] for k in point.serving_errors} == rows  # no held-out serving row
    d = point.as_dict()
    assert d["joint_sse"] == pytest.approx(d["collective_sse"] + d["step_sse"] + d["serving_sse"])
    joint = [p.as_dict()["joint_sse"] for p in points]
    assert joint[1] == min(joint)


@pytest.mark.parametrize("grid", ["0,x", "-10,20"])
def test_bad_grid_exits_2(grid: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main([f"--grid={grid}"]) == 2
    err = capsys.readouterr().err
    assert "--grid" in err and grid in err and len(err.strip().splitlines()) == 1
