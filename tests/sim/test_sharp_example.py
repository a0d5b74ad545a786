"""The in-network reduction example runs, with SHARP on and off, and keeps the figures
docs/explanation/collectives.md gives for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate

EXAMPLE = Path(__file__).resolve().parents[2] / "scenarios" / "dgx-h100-llama3-70b-sharp.yaml"


def test_sharp_example_matches_the_docs() -> None:
    steps = {}
    for on in (True, False):
        res = load_scenario(EXAMPLE, [f"cluster.efa.sharp={str(on).lower()}"])
        steps[on] = simulate(res, record=False).summary["step_time_s"]
    # docs/explanation/collectives.md: 4.685 s with SHARP, 4.781 s without (+2.1%)
    assert steps[True] == pytest.approx(4.685, rel=0.02)
    assert steps[False] == pytest.approx(4.781, rel=0.02)
    assert steps[True] < steps[False]
