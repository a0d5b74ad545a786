"""The launch profile: at the catalog's launch it is the shipped fits, and bad grids exit 2."""

from __future__ import annotations

import pytest

from clustersim.calibration import launch
from clustersim.catalog.fits import calibration


@pytest.mark.slow
def test_profile_at_the_catalog_launch_is_the_shipped_fit() -> None:
    (point,) = launch.profile([210.0])
    assert point.collectives["launch_s"] == pytest.approx(210e-6)
    shipped = calibration().fits["trainium/nxd-training"]
    fitted = point.constants["tensor_efficiency"]
    assert fitted == pytest.approx(shipped.constants["tensor_efficiency"], rel=0.005)
    assert set(point.step_errors) == set(shipped.rows)  # calibration rows only
    for row, err in point.step_errors.items():  # the simulated error, the fit's residual
        assert err == pytest.approx(shipped.residuals[row], abs=0.003)
    d = point.as_dict()
    assert d["joint_sse"] == pytest.approx(d["collective_sse"] + d["step_sse"])


@pytest.mark.parametrize("grid", ["0,x", "-10,20"])
def test_bad_grid_exits_2(grid: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main([f"--grid={grid}"]) == 2
    err = capsys.readouterr().err
    assert "--grid" in err and grid in err and len(err.strip().splitlines()) == 1
