"""Symmetry folding: one representative per stage agrees with simulating every rank."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.sim.folding import replica_groups, replica_pairs, representatives
from clustersim.workload import Layout

LAYOUT = Layout(tp=4, pp=2, dp=3, cp=2, ep=1, ranks=48, ranks_per_chip=4)


@pytest.mark.parametrize("name", ["tp", "cp", "dp"])
def test_replica_groups_match_layout_groups(name: str) -> None:
    for stage in range(LAYOUT.pp):
        rows = replica_groups(LAYOUT, name, stage)
        expected = sorted(g for g in LAYOUT.groups(name) if LAYOUT.stage(g[0]) == stage)
        assert sorted(tuple(int(r) for r in row) for row in rows) == expected
        assert tuple(rows[0]) == LAYOUT.group(name, representatives(LAYOUT)[stage])


def test_replica_pairs_are_stage_neighbours() -> None:
    pairs = replica_pairs(LAYOUT, 0, 1)
    assert len(pairs) == LAYOUT.ranks_per_stage
    for src, dst in pairs:
        tp_i, cp_i, dp_i, pp_i = LAYOUT.coords(int(src))
        assert LAYOUT.coords(int(dst)) == (tp_i, cp_i, dp_i, pp_i + 1)
    assert np.array_equal(pairs[0], [0, LAYOUT.ranks_per_stage])


SCENARIOS = {
    "tp-dp on one torus": [],
    "pipeline across instances": ["cluster.count=2", "parallelism.pp=4", "parallelism.tp=2"],
    "gpu nodes": ["cluster.instance=p5.48xlarge", "cluster.count=4", "parallelism.tp=8"],
    "interleaved pipeline": [
        "cluster.count=2",
        "parallelism.pp=2",
        "parallelism.tp=4",
        "parallelism.virtual_stages=2",
    ],
}


@pytest.mark.parametrize("sets", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_folded_agrees_with_detailed(tiny_yaml: object, sets: list[str]) -> None:
    res = load_scenario(str(tiny_yaml), sets)
    detailed = simulate(res, fidelity="detailed", record=False).summary
    folded = simulate(res, fidelity="folded", record=False).summary
    assert detailed["fidelity"] == "detailed"
    assert folded["fidelity"] == "folded"
    assert folded["simulated_ranks"] == folded["layout"]["pp"]
    assert folded["step_time_s"] == pytest.approx(detailed["step_time_s"], rel=0.01)
    for part in ("compute", "optimizer"):
        assert folded["breakdown_s"][part] == pytest.approx(detailed["breakdown_s"][part], rel=0.01)


@pytest.mark.parametrize("sets", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_sampled_representative_links_agree(
    tiny_yaml: object, sets: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keeping the links of only a few of a step's flows (as folded runs of 10^5 chips
    do) gives the same step on these symmetric fabrics."""
    from clustersim.network import Network

    res = load_scenario(str(tiny_yaml), sets)
    full = simulate(res, fidelity="folded", record=False).summary
    monkeypatch.setattr(Network, "fold_sample_flows", 2)
    sampled = simulate(res, fidelity="folded", record=False).summary
    assert sampled["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.01)
