"""``clustersim topology export``: every built-in fabric family written as a networkx graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from clustersim.cli import main
from clustersim.network.fabric import Topology, node_name
from clustersim.network.graphs import FORMATS, MAX_GRAPH_NODES, fabric_graph
from clustersim.scenario import load_scenario

FAMILIES: dict[str, str] = {
    "torus2d": "{instance: trn2.48xlarge, count: 2}",
    "torus3d": "{instance: trn2u.48xlarge, count: 4}",
    "neuronswitch": "{instance: trn3-ultraserver-node, count: 36}",
    "nvswitch": "{instance: p5.48xlarge, count: 2}",
    "nvl72": "{instance: gb200-nvl72-node, count: 18}",
    "fat_tree": "{instance: trn2.48xlarge, count: 4, efa: {fabric: fat_tree, tiers: 3, radix: 8}}",
    "rail": "{instance: p5.48xlarge, count: 4, efa: {fabric: rail, tiers: 2, radix: 32}}",
}


def scenario_text(cluster: str) -> str:
    return f"""\
name: fabric
cluster: {cluster}
model: {{name: tiny, layers: 4, hidden: 1024, heads: 8, kv_heads: 2, ffn_hidden: 4096, vocab: 8192}}
parallelism: {{tp: 4, pp: 1}}
training: {{seq_len: 1024, global_batch_size: 32, steps: 1}}
"""


def family_topology(family: str) -> Topology:
    from clustersim.sim.fabric import scenario_topology

    return scenario_topology(load_scenario(scenario_text(FAMILIES[family])))


def read_back(path: Path, fmt: str) -> Any:
    """The file read by networkx's own readers, as a user's tool would."""
    if fmt == "graphml":
        return nx.read_graphml(path)
    if fmt == "gml":
        return nx.read_gml(path)
    return nx.node_link_graph(json.loads(path.read_text()), edges="edges")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_exports_in_every_format(family: str, tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(scenario_text(FAMILIES[family]))
    topo = family_topology(family)
    links = {topo.endpoints(i): i for i in range(topo.n_links)}
    for fmt in FORMATS:
        out = tmp_path / f"fabric.{fmt}"
        assert main(["topology", "export", str(scenario), "--out", str(out)]) == 0
        g = read_back(out, fmt)
        assert g.is_directed()
        assert g.number_of_nodes() == topo.n_nodes
        assert g.number_of_edges() == topo.n_links - topo.n_chips  # no local self-loops
        for chip in (0, topo.n_chips - 1):
            attrs = g.nodes[f"chip{chip}"]
            assert attrs["kind"] == "chip"
            assert attrs["instance"] == topo.instance_of(chip)
            assert attrs["domain"] == topo.domain_of(chip)
            if topo.chip_coords is not None:
                axes = ("x", "y", "z")[: len(topo.torus_dims)]
                assert tuple(attrs[a] for a in axes) == tuple(topo.chip_coords[chip])
        kinds = {data["kind"] for _, data in g.nodes(data=True)}
        assert kinds <= {"chip", "switch", "nic"}
        for u, v, data in g.edges(data=True):
            link = links[(topo.node(topo_index(topo, u)), topo.node(topo_index(topo, v)))]
            assert data["capacity_Bps"] == pytest.approx(topo.nominal_Bps[link], rel=1e-12)
            assert data["latency_s"] == pytest.approx(topo.latency_s[link], rel=1e-12)
            assert data["lanes"] == topo.lanes(link) and data["lanes_up"] == topo.lanes_up(link)
            assert data["kind"] == topo.kinds[link]


def topo_index(topo: Topology, name: str) -> int:
    cache = topo.__dict__.setdefault("_test_names", {})
    if not cache:
        cache.update({node_name(topo.node(i)): i for i in range(topo.n_nodes)})
    index: int = cache[name]
    return index


def test_lanes_down_are_written(tmp_path: Path) -> None:
    topo = family_topology("torus3d")
    link = topo.link(topo.node(0), topo.node(1))
    topo.set_lanes_up(link, 0)
    data = fabric_graph(topo).edges["chip0", "chip1"]
    assert data["lanes_up"] == 0 and data["capacity_Bps"] == topo.nominal_Bps[link]


def test_too_large_fabric_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    count = MAX_GRAPH_NODES // 16 + 1
    scenario.write_text(scenario_text(f"{{instance: trn2.48xlarge, count: {count}}}"))
    out = tmp_path / "big.graphml"
    assert main(["topology", "export", str(scenario), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MiB" in err and "cluster.count" in err
    assert not out.exists()


def test_unknown_suffix_needs_a_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(scenario_text(FAMILIES["nvswitch"]))
    out = tmp_path / "fabric.txt"
    assert main(["topology", "export", str(scenario), "--out", str(out)]) == 2
    assert "suffix" in capsys.readouterr().err
    assert main(["topology", "export", str(scenario), "--out", str(out), "--format", "gml"]) == 0
    assert nx.read_gml(out).number_of_nodes() == 19
