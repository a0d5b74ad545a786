"""Fabric graphs read back: checks, ECMP routing on any graph, and the round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
import simpy
from test_graph_export import FAMILIES, family_topology

from clustersim.errors import PartitionError, ScenarioError
from clustersim.network import Network
from clustersim.network.fabric import Topology
from clustersim.network.graphs import GraphTopology, check_fabric, export_fabric, read_fabric

CAP, LAT = 100e9, 1e-6
WHERE = "cluster.fabric_file"


def compile_graph(g: nx.Graph, cpi: int, instances: int = 1) -> GraphTopology:
    spec = check_fabric(g, chips_per_instance=cpi, instances=instances, where=WHERE)
    return GraphTopology(spec, chips_per_instance=cpi, instances=instances, local_bw_Bps=1e13)


def timed(topo: Topology, op: str, nbytes: float, ranks: list[int], alg: str = "auto") -> float:
    net = Network(simpy.Environment(), topo, range(topo.n_chips), {op: alg})
    net.env.run(until=net.collective(op, ranks, nbytes))
    return float(net.env.now)


def ring4() -> nx.Graph:
    """Four chips in a ring, written by hand: an undirected edge is a link each way."""
    g = nx.Graph()
    for name in "abcd":
        g.add_node(name, kind="chip", instance=0)
    for u, v in ("ab", "bc", "cd", "da"):
        g.add_edge(u, v, capacity_Bps=CAP, latency_s=LAT)
    return g


def two_spines() -> nx.DiGraph:
    """Chips a0, a1 on switch s0 and b0, b1 on s1; s0 and s1 joined by two spines."""
    g = nx.DiGraph()
    for inst, side in enumerate("ab"):
        for k in range(2):
            g.add_node(f"{side}{k}", kind="chip", instance=inst)
            g.add_edge(f"{side}{k}", f"s{inst}", capacity_Bps=CAP, latency_s=LAT, kind="efa")
            g.add_edge(f"s{inst}", f"{side}{k}", capacity_Bps=CAP, latency_s=LAT, kind="efa")
    for spine in ("p0", "p1"):
        g.add_node(spine, kind="switch")
        for sw in ("s0", "s1"):
            g.add_edge(sw, spine, capacity_Bps=CAP, latency_s=LAT)
            g.add_edge(spine, sw, capacity_Bps=CAP, latency_s=LAT)
    return g


# -- round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip_times_every_family(family: str, tmp_path: Path) -> None:
    """Export, read back, compile: collectives take the time they take on the built fabric."""
    built = family_topology(family)
    fmt = ("graphml", "gml", "json")[sorted(FAMILIES).index(family) % 3]
    path = tmp_path / f"fabric.{fmt}"
    export_fabric(built, path, fmt)
    spec = check_fabric(
        read_fabric(path, WHERE),
        chips_per_instance=built.chips_per_instance,
        instances=built.instances,
        where=WHERE,
    )
    local = float(built.capacity_Bps[built.local_link(0)])
    topo = GraphTopology(
        spec,
        chips_per_instance=built.chips_per_instance,
        instances=built.instances,
        local_bw_Bps=local,
        local_latency_s=float(built.latency_s[built.local_link(0)]),
    )
    assert topo.n_links == built.n_links and topo.n_nodes == built.n_nodes
    assert topo.domain_instances == built.domain_instances
    assert topo.torus_dims == built.torus_dims
    topo.prove_symmetry(built)
    assert topo.fold_refusal is None
    every = list(range(built.n_chips))
    per_instance = list(range(0, built.n_chips, built.chips_per_instance))
    for op, ranks in (("all_reduce", every), ("all_to_all", every), ("all_reduce", per_instance)):
        want = timed(built, op, 64e6, ranks)
        assert timed(topo, op, 64e6, ranks) == pytest.approx(want, rel=1e-3), (op, len(ranks))


def test_an_edited_graph_is_not_proven_symmetric() -> None:
    built = family_topology("torus3d")
    g = nx.DiGraph(export_graph(built))
    g.remove_edge("chip0", "chip16")
    topo = compile_graph(g, built.chips_per_instance, built.instances)
    topo.prove_symmetry(built)
    assert topo.fold_refusal is not None and "not proven" in topo.fold_refusal


def export_graph(topo: Topology) -> nx.DiGraph:
    from clustersim.network.graphs import fabric_graph

    return fabric_graph(topo)


# -- closed forms and ECMP ----------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [1e3, 1e6, 1e9])
def test_hand_made_ring_matches_alpha_beta(nbytes: float) -> None:
    """A bidirectional ring all-reduce over 4 chips: 2(p-1)a + 2(p-1)/p n b / 2."""
    topo = compile_graph(ring4(), 4)
    p = 4
    want = 2 * (p - 1) * LAT + 2 * (p - 1) / p * nbytes / CAP / 2
    assert timed(topo, "all_reduce", nbytes, [0, 1, 2, 3], "ring") == pytest.approx(want, rel=1e-9)


def test_ecmp_splits_two_equal_paths_evenly() -> None:
    topo = compile_graph(two_spines(), 2, 2)
    ids = topo.aliases
    spine_up = {topo.link(topo.node(ids["s0"]), topo.node(ids[p])) for p in ("p0", "p1")}
    pairs = [(0, 2), (1, 3)]
    flat, _ = topo.routes(pairs)
    assert sorted(int(x) for x in flat if x in spine_up) == sorted(spine_up)
    every = [(s, d) for s in (0, 1) for d in (2, 3)]
    flat, _ = topo.routes(every)
    counts = np.bincount(flat, minlength=topo.n_links)
    assert [int(counts[link]) for link in sorted(spine_up)] == [2, 2]
    # Two flows on two spines: each at a chip's full rate, as if alone.
    net = Network(simpy.Environment(), topo, range(4))
    done = net.flows.transfer(pairs, 1e9, 0.0)
    net.env.run(until=done)
    assert net.env.now == pytest.approx(1e9 / CAP, rel=1e-9)


def test_routes_avoid_a_link_that_goes_down_and_partitions_are_named() -> None:
    topo = compile_graph(two_spines(), 2, 2)
    ids = topo.aliases
    cut = topo.link(topo.node(ids["s0"]), topo.node(ids["p0"]))
    topo.set_lanes_up(cut, 0)
    for s, d in [(0, 2), (0, 3), (1, 2), (1, 3)]:
        assert cut not in topo.route(s, d)
    topo.set_lanes_up(topo.link(topo.node(ids["s0"]), topo.node(ids["p1"])), 0)
    with pytest.raises(PartitionError, match="cannot reach"):
        topo.route(0, 2)


def test_failure_injection_names_the_graph_nodes(tmp_path: Path) -> None:
    from clustersim.failures.injection import resolve
    from clustersim.scenario.failures import Injection

    topo = compile_graph(two_spines(), 2, 2)
    injections = [
        Injection.model_validate({"at": 0, "target": {"link": ["s0", "p0"]}, "kind": "down"}),
        Injection.model_validate({"at": 0, "target": {"switch": "p1"}, "kind": "down"}),
        Injection.model_validate({"at": 0, "target": {"link": ["b1", "s1"]}, "kind": "down"}),
    ]
    actions = resolve(injections, topo)
    assert len(actions) == 3
    with pytest.raises(ScenarioError, match="s0"):
        resolve(
            [Injection.model_validate({"at": 0, "target": {"switch": "s9"}, "kind": "down"})], topo
        )


# -- checks ---------------------------------------------------------------------------------


def bad(g: nx.Graph, cpi: int = 4, instances: int = 1) -> str:
    with pytest.raises(ScenarioError) as info:
        check_fabric(g, chips_per_instance=cpi, instances=instances, where=WHERE)
    text = str(info.value)
    assert "\n" not in text and text.startswith(WHERE)
    return text


def edited(**edge: Any) -> nx.Graph:
    g = ring4()
    g.edges["a", "b"].update(edge)
    return g


def test_unknown_attributes_suggest_the_closest_name() -> None:
    assert "did you mean 'capacity_Bps'" in bad(edited(capacity_bps=1.0))
    g = ring4()
    g.nodes["a"]["instanse"] = 0
    text = bad(g)
    assert "[node 'a'].instanse" in text and "did you mean 'instance'" in text


@pytest.mark.parametrize(
    ("edge", "phrase"),
    [
        ({"capacity_Bps": float("nan")}, "capacity_Bps: must be positive and finite"),
        ({"capacity_Bps": float("inf")}, "capacity_Bps: must be positive and finite"),
        ({"latency_s": -1e-6}, "latency_s: must be positive and finite"),
        ({"latency_s": 0.0}, "latency_s: must be positive and finite"),
        ({"capacity_Bps": "fast"}, "capacity_Bps"),
        ({"lanes": 2.5}, "lanes: must be a whole number"),
        ({"lanes": 2, "lanes_up": 3}, "lanes_up: must be 0..2"),
        ({"kind": "wifi"}, "unknown link kind"),
    ],
)
def test_bad_edge_values_name_edge_and_attribute(edge: dict[str, Any], phrase: str) -> None:
    text = bad(edited(**edge))
    assert "[edge 'a' -> 'b']" in text and phrase in text


def test_units_are_read_in_strings() -> None:
    topo = compile_graph(edited(capacity_Bps="50GB/s", latency_s="2us"), 4)
    link = topo.link(topo.node(0), topo.node(1))
    assert topo.nominal_Bps[link] == 50e9 and topo.latency_s[link] == pytest.approx(2e-6)


def test_chips_must_fill_the_instances_and_reach_each_other() -> None:
    g = ring4()
    g.remove_node("d")
    assert "[instance 0]" in bad(g) and "has 3 chips" in bad(g)
    g = ring4()
    g.nodes["d"]["instance"] = 7
    assert "[node 'd'].instance" in bad(g)
    g = ring4()
    g.remove_edges_from([("b", "c"), ("d", "a")])
    assert "cannot reach" in bad(g)
    g = ring4()
    g.edges["b", "c"]["lanes_up"] = 0
    g.edges["d", "a"]["lanes_up"] = 0
    assert "cannot reach" in bad(g)


def test_self_loops_and_duplicates_are_refused() -> None:
    g = ring4()
    g.add_edge("a", "a", capacity_Bps=CAP, latency_s=LAT)
    assert "self-loop" in bad(g)
    m = nx.MultiGraph(ring4())
    m.add_edge("a", "b", capacity_Bps=CAP, latency_s=LAT)
    assert "duplicate edge" in bad(m)


def test_domains_and_coordinates_are_checked() -> None:
    g = nx.Graph()
    for i in range(8):
        g.add_node(f"c{i}", instance=i // 2, domain=[0, 0, 1, 2][i // 2])
    for i in range(8):
        g.add_edge(f"c{i}", f"c{(i + 1) % 8}", capacity_Bps=CAP, latency_s=LAT)
    assert "runs of 2 consecutive instances" in bad(g, 2, 4)
    for i in range(8):
        g.nodes[f"c{i}"]["domain"] = i // 4
    assert compile_graph(g, 2, 4).domain_instances == 2
    for i in range(8):
        g.nodes[f"c{i}"].update(x=i % 2, y=(i // 2) % 2)
    topo = compile_graph(g, 2, 4)
    assert topo.torus_dims == (2, 2) and topo.chip_coords is not None
    g.nodes["c1"]["x"] = 0
    assert "two chips of one domain sit at (0, 0)" in bad(g, 2, 4)


def test_json_duplicates_are_named(tmp_path: Path) -> None:
    data = nx.node_link_data(nx.DiGraph(ring4()), edges="edges")
    data["edges"].append(dict(data["edges"][0]))
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match="duplicate edge"):
        read_fabric(path, WHERE)


def test_chip_names_follow_chip_order() -> None:
    g = nx.relabel_nodes(ring4(), {"a": "chip1", "b": "chip0"})
    assert "is chip 0 in chip order" in bad(g)
    g = ring4()
    g.add_node("chip9", kind="switch")
    g.add_edge("chip9", "a", capacity_Bps=CAP, latency_s=LAT)
    assert "names chipN are kept for chips" in bad(g)


def test_an_imported_graph_exports_with_its_own_names(tmp_path: Path) -> None:
    topo = compile_graph(two_spines(), 2, 2)
    path = tmp_path / "again.graphml"
    export_fabric(topo, path, "graphml")
    again = compile_graph(read_fabric(path, WHERE), 2, 2)
    assert again.labels == topo.labels
    assert sorted(again.aliases) == ["a0", "a1", "b0", "b1", "p0", "p1", "s0", "s1"]
    assert again.n_links == topo.n_links


def test_tables_through_a_gateway_equal_their_own() -> None:
    """A chip with one link in takes its gateway's table, completed: the same routes."""
    topo = compile_graph(two_spines(), 2, 2)
    fast = {(s, d): topo._path(s, d) for s in range(4) for d in range(4) if s != d}
    slow = compile_graph(two_spines(), 2, 2)
    graph = slow._routing_graph(True)
    graph.gateway[:] = -1
    assert {(s, d): slow._path(s, d) for s, d in fast} == fast
    assert int(topo._routing_graph(True).gateway[0]) == topo.aliases["s0"]
