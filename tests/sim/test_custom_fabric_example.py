"""The custom-fabric example (docs/how-to/custom-fabric.md): a Trn2 UltraServer
without the Z links between instances 1 and 2
(``scenarios/trn2-ultraserver-custom-fabric.yaml``). Its all-reduce and step tables are
generated and checked by ``python -m clustersim.docs`` (``clustersim.docstudies``)."""

from __future__ import annotations

from pathlib import Path

from clustersim.network.microbench import run_collective
from clustersim.scenario import load_scenario
from clustersim.sim.fabric import scenario_topology

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
EXAMPLE = SCENARIOS / "trn2-ultraserver-custom-fabric.yaml"
FABRIC = SCENARIOS / "fabrics" / "trn2-ultraserver-missing-z.graphml"


def test_the_example_fabric_lacks_exactly_the_z_links_between_instances_1_and_2() -> None:
    res = load_scenario(EXAMPLE)
    assert res.scenario.cluster.fabric_file == str(FABRIC)
    topo = scenario_topology(res)
    built = scenario_topology(load_scenario(SCENARIOS / "trn2-ultraserver-llama3-70b.yaml"))
    assert topo.n_links == built.n_links - 32
    assert topo.torus_dims == built.torus_dims == (4, 4, 4)
    u, v = topo.link_u, topo.link_v
    chips = (u < 64) & (v < 64) & (u != v)
    pairs = {(int(a) // 16, int(b) // 16) for a, b in zip(u[chips], v[chips], strict=True)}
    assert (1, 2) not in pairs and (2, 1) not in pairs
    assert {(0, 1), (2, 3), (3, 0)} <= pairs


def test_the_cut_slows_only_the_bandwidth_bound_all_reduces() -> None:
    sizes = [2.0**20, 2.0**30]
    built = run_collective("trn2u.48xlarge", 4, "all_reduce", sizes)
    cut = run_collective("trn2u.48xlarge", 4, "all_reduce", sizes, fabric_file=str(FABRIC))
    small, large = (c["time_s"] / b["time_s"] for b, c in zip(built, cut, strict=True))
    assert 1.0 <= small < 1.001  # latency-bound: the detour's extra hops only
    assert large > 1.05  # the Z rings' cut hop carries the buffer on links already in use


def test_reliability_counts_the_graph_links() -> None:
    from clustersim.failures.jobs import component_counts

    built = component_counts(load_scenario(SCENARIOS / "trn2-ultraserver-llama3-70b.yaml"))
    cut = component_counts(load_scenario(EXAMPLE))
    assert (built["link"], cut["link"]) == (192, 176)
    assert built["switch"] == cut["switch"] == 0
