"""``cluster.fabric_file``: a scenario simulated on a graph, and the export-import round trip."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from clustersim.errors import ScenarioError
from clustersim.network.graphs import export_fabric, fabric_graph
from clustersim.scenario import load_scenario
from clustersim.sim import run as sim_run
from clustersim.sim import simulate
from clustersim.sim.fabric import scenario_topology

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "scenarios"
FAST = ["p5-llama3-8b"]
SLOW = [
    "trn2-llama3-8b",
    "trn2-ultraserver-lane-loss",
    "trn1-llama2-7b",
    "trn2-multi-ultraserver-llama3-70b",
    "trn3-ultraserver-llama3-405b",
]


@pytest.mark.parametrize("name", [*FAST, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW)])
def test_round_trip_keeps_the_step_time(name: str, tmp_path: Path) -> None:
    """Export a shipped example's fabric, import it: the same step time within 0.1%."""
    path = SHIPPED / f"{name}.yaml"
    res = load_scenario(path)
    fabric = tmp_path / "fabric.graphml"
    export_fabric(scenario_topology(res), fabric, "graphml")
    built = simulate(res, record=False).summary
    imported = simulate(
        load_scenario(path, [f"cluster.fabric_file={fabric}"]), record=False
    ).summary
    assert imported["fidelity"] == built["fidelity"]
    assert imported["fabric_file"]["fold_refused"] is None
    assert imported["fabric_file"]["symmetry_proven"] is True
    assert imported["step_time_s"] == pytest.approx(built["step_time_s"], rel=1e-3)


def write_edited(tmp_path: Path, scenario: Path) -> Path:
    """The scenario's fabric with chip 0's up link at half its capacity."""
    g = fabric_graph(scenario_topology(load_scenario(scenario)))
    u, v, data = next(iter(g.out_edges("chip0", data=True)))
    g.edges[u, v]["capacity_Bps"] = data["capacity_Bps"] / 2
    out = tmp_path / "edited.graphml"
    nx.write_graphml(g, out)
    return out


def test_folding_only_where_the_symmetry_is_proven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim_run, "FOLD_ABOVE_RANKS", 4)
    scenario = SHIPPED / "p5-llama3-8b.yaml"
    same = tmp_path / "same.json"
    export_fabric(scenario_topology(load_scenario(scenario)), same, "json")
    folded = simulate(load_scenario(scenario, [f"cluster.fabric_file={same}"]), record=False)
    assert folded.summary["fidelity"] == "folded"
    edited = load_scenario(scenario, [f"cluster.fabric_file={write_edited(tmp_path, scenario)}"])
    detailed = simulate(edited, record=False).summary
    assert detailed["fidelity"] == "detailed"
    assert "not proven" in detailed["fabric_file"]["fold_refused"]
    assert detailed["fabric_file"]["symmetry_proven"] is False
    with pytest.raises(ScenarioError, match="cannot fold"):
        simulate(edited, record=False, fidelity="folded")


def test_a_relative_fabric_file_sits_beside_the_scenario(tmp_path: Path) -> None:
    text = (SHIPPED / "p5-llama3-8b.yaml").read_text()
    (tmp_path / "fabrics").mkdir()
    export_fabric(
        scenario_topology(load_scenario(SHIPPED / "p5-llama3-8b.yaml")),
        tmp_path / "fabrics" / "p5.gml",
        "gml",
    )
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text.replace("count: 1", "count: 1\n  fabric_file: fabrics/p5.gml"))
    res = load_scenario(scenario)
    assert res.scenario.cluster.fabric_file == str(tmp_path / "fabrics" / "p5.gml")
    assert scenario_topology(res).n_chips == 8


def test_a_graph_with_a_failed_link_is_simulated_rank_by_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fabric file that is the built fabric but for one failed chip-to-chip link (no lane
    up): its symmetry is not proven, so the run does not fold, and the summary says why."""
    monkeypatch.setattr(sim_run, "FOLD_ABOVE_RANKS", 4)
    scenario = SHIPPED / "trn2-llama3-8b.yaml"
    g = fabric_graph(scenario_topology(load_scenario(scenario)))
    u, v = next(
        (u, v)
        for u, v in g.edges()
        if g.nodes[u].get("kind") == "chip" and g.nodes[v].get("kind") == "chip"
    )
    g.edges[u, v]["lanes_up"] = 0
    failed = tmp_path / "failed.graphml"
    nx.write_graphml(g, failed)
    summary = simulate(
        load_scenario(scenario, [f"cluster.fabric_file={failed}"]), record=False
    ).summary
    assert summary["fidelity"] == "detailed"
    assert "not proven" in summary["fabric_file"]["fold_refused"]
    assert summary["fabric_file"]["symmetry_proven"] is False
