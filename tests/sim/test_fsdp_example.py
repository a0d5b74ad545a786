"""The FSDP example runs: one microbatch per replica and no pipeline, so no bubble, and
its shards fit. The figures docs/explanation/sharding.md gives for it are generated and
checked by ``python -m clustersim.docs`` (``sharding-layouts``)."""

from __future__ import annotations

from pathlib import Path

from clustersim.scenario import load_scenario
from clustersim.sim import simulate

EXAMPLE = (
    Path(__file__).resolve().parents[2] / "scenarios" / "trn2-ultraserver-llama3-70b-fsdp.yaml"
)


def test_fsdp_example_runs_without_a_bubble() -> None:
    res = load_scenario(EXAMPLE, ["output.trace=false", "output.html=false"])
    s = simulate(res, record=False, fidelity="folded").summary
    assert s["layout"]["zero"] == 3 and s["layout"]["pp"] == 1
    assert s["breakdown_s"]["bubble"] == 0.0
    memory = s["memory_gib_per_chip"]
    assert 0 < memory["total"] < memory["capacity"]
