"""A graph's route loads from its next-hop tables equal the per-pair routes' counts, exactly."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import simpy
from test_graph_export import FAMILIES, family_topology

from clustersim.bench.fabrics import fabric_graph_data
from clustersim.network import Network
from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import link_counts
from clustersim.network.graphs import GraphTopology, check_fabric, fabric_graph

WHERE = "cluster.fabric_file"


def compile_graph(g: nx.Graph, cpi: int, instances: int) -> GraphTopology:
    spec = check_fabric(g, chips_per_instance=cpi, instances=instances, where=WHERE)
    return GraphTopology(spec, chips_per_instance=cpi, instances=instances, local_bw_Bps=1e13)


def imported(family: str) -> GraphTopology:
    built = family_topology(family)
    return compile_graph(fabric_graph(built), built.chips_per_instance, built.instances)


def shaped(shape: str, chips: int) -> GraphTopology:
    g = nx.node_link_graph(fabric_graph_data(shape, chips), edges="edges")
    return compile_graph(g, 16, chips // 16)


def per_pair(topo: Topology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, ...]:
    flat, weights, latency = topo.weighted_routes(src, dst)
    links, counts = link_counts(flat, weights)
    return links, counts, np.asarray(latency.max())


def assert_same(topo: GraphTopology, src: np.ndarray, dst: np.ndarray) -> None:
    found = topo.route_loads(src, dst)
    assert found is not None
    links, counts, latency = found
    want_links, want_counts, want_latency = per_pair(topo, src, dst)
    np.testing.assert_array_equal(links, want_links)
    np.testing.assert_array_equal(counts, want_counts)
    assert latency == float(want_latency)  # to the last bit


def all_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.divmod(np.arange(n * n, dtype=np.int64), n)
    keep = i != j
    return i[keep], j[keep]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_all_to_all(family: str) -> None:
    topo = imported(family)
    assert_same(topo, *all_pairs(topo.n_chips))


@pytest.mark.parametrize("family", ["fat_tree", "torus3d", "rail"])
def test_random_pairs_with_repeats_and_self_pairs(family: str) -> None:
    topo = imported(family)
    rng = np.random.default_rng(7)
    src = rng.integers(0, topo.n_chips, 500)
    dst = rng.integers(0, topo.n_chips, 500)
    assert_same(topo, src, dst)


@pytest.mark.parametrize(("shape", "chips"), [("ring", 64), ("ring", 48), ("switch", 64)])
def test_rings_and_switches(shape: str, chips: int) -> None:
    assert_same(shaped(shape, chips), *all_pairs(chips))


def test_a_link_down_off_the_torus_reroutes_alike() -> None:
    topo = imported("rail")
    assert topo.chip_coords is None
    between = np.flatnonzero((topo.link_u >= topo.n_chips) & (topo.link_v >= topo.n_chips))
    topo.set_lanes_up(int(between[3]), 0)  # a switch link: routes take their other paths
    assert_same(topo, *all_pairs(topo.n_chips))


def test_a_torus_graph_with_a_link_down_routes_pair_by_pair() -> None:
    topo = imported("torus2d")
    topo.set_lanes_up(topo.n_chips + 1, 0)
    assert topo.route_loads(*all_pairs(topo.n_chips)) is None


@pytest.mark.parametrize("alg", ["mesh", "pairwise", "ring", "halving_doubling", "auto"])
def test_collectives_on_a_ring_graph_time_as_before(alg: str) -> None:
    """Steps routed from the tables run the same as those routed pair by pair."""
    topo = shaped("ring", 32)
    times = []
    for bulk in (True, False):
        if not bulk:
            topo.route_loads = lambda src, dst: None  # type: ignore[method-assign]
        op = "all_to_all" if alg in ("mesh", "pairwise") else "all_reduce"
        net = Network(simpy.Environment(), topo, range(topo.n_chips), {op: alg})
        net.env.run(until=net.collective(op, range(topo.n_chips), 2.0**24))
        times.append(net.env.now)
    assert times[0] == times[1]
