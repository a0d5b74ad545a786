"""A family's fit carried to chips its rows did not run on (``Family.transfer``)."""

from __future__ import annotations

import pytest

from clustersim.catalog import chip
from clustersim.catalog.fits import calibration
from clustersim.hardware.kernel_tiling import roofline_efficiency
from clustersim.scenario import load_scenario

SCENARIO = """
name: transfer
cluster: {{instance: {instance}, count: 1}}
model: llama3-8b
parallelism: {{tp: 8}}
training: {{seq_len: 4096, global_batch_size: 64}}
"""


def _software(instance: str, *sets: str) -> tuple[float | None, str | None]:
    res = load_scenario(SCENARIO.format(instance=instance), list(sets))
    return res.chip.calibration.attention_efficiency, res.software.scaled


def test_trn1_runs_the_fit_as_fitted_and_trn2_through_the_engine_model() -> None:
    transfer = calibration().families["trainium"].transfer
    assert transfer is not None and transfer.fitted_on == "trn1"
    fitted = calibration().fits["trainium/nxd-training"].constants["attention_efficiency"]
    assert _software("trn1.32xlarge") == (pytest.approx(fitted), None)
    ratio = roofline_efficiency(chip("trn2"), *transfer.shape) / roofline_efficiency(
        chip("trn1"), *transfer.shape
    )
    eff, how = _software("trn2.48xlarge")
    assert eff == pytest.approx(fitted * ratio)
    assert 1.0 < ratio < 1.1  # Trn2's larger SBUF and faster DMA, per clock
    assert how == f"from trn1 by the engine model, x{ratio:.3f}"


def test_a_scenarios_own_constant_still_wins() -> None:
    eff, _ = _software("trn2.48xlarge", "cluster.chip.calibration.attention_efficiency=0.5")
    assert eff == 0.5
