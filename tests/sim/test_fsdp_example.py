"""The FSDP example runs, and keeps the figures docs/explanation/sharding.md gives for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate

EXAMPLE = (
    Path(__file__).resolve().parents[2] / "scenarios" / "trn2-ultraserver-llama3-70b-fsdp.yaml"
)


def test_fsdp_example_matches_the_readme() -> None:
    res = load_scenario(EXAMPLE, ["output.trace=false", "output.html=false"])
    s = simulate(res, record=False, fidelity="folded").summary
    # docs/explanation/sharding.md: 12.95 s, 45.7% MFU, 40.4 GiB, $1.227 per M tokens
    # (detailed; the folded run agrees).
    assert s["step_time_s"] == pytest.approx(12.95, rel=0.02)
    assert s["memory_gib_per_chip"]["total"] == pytest.approx(40.4, abs=0.1)
    assert s["cost"]["usd_per_million_tokens"] == pytest.approx(1.227, rel=0.02)
    assert s["breakdown_s"]["bubble"] == 0.0
