"""A graph's route loads from its next-hop tables equal the per-pair routes' counts, exactly."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import simpy
from test_graph_export import FAMILIES, family_topology

from clustersim.bench.fabrics import fabric_graph_data
from clustersim.network import OPS, Network, algorithm_names
from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import link_counts
from clustersim.network.graphs import GraphTopology, check_fabric, fabric_graph
from clustersim.network.runtimes import NeuronRuntime
from clustersim.network.runtimes.costs import Protocol

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


def timed(topo: GraphTopology, op: str, alg: str, *, bulk: bool) -> float:
    """``op`` by ``alg`` over every chip, its steps routed from the tables or pair by pair."""
    if not bulk:
        topo.route_loads = lambda src, dst: None  # type: ignore[method-assign]
    try:
        net = Network(simpy.Environment(), topo, range(topo.n_chips), {op: alg})
        net.env.run(until=net.collective(op, range(topo.n_chips), 2.0**24))
        return float(net.env.now)
    finally:
        vars(topo).pop("route_loads", None)


NEURON_ALGORITHMS = [
    (op, alg)
    for op in OPS
    for alg in algorithm_names(op)
    if alg not in ("nvls", "nvls_tree", "sharp", "nvls_sharp")
]


@pytest.mark.parametrize("alg", ["mesh", "pairwise", "auto"])
@pytest.mark.parametrize("shape", ["ring", "switch"])
def test_all_to_all_on_rings_and_switches_times_as_before(shape: str, alg: str) -> None:
    topo = shaped(shape, 32)
    assert timed(topo, "all_to_all", alg, bulk=True) == timed(topo, "all_to_all", alg, bulk=False)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_times_as_before(family: str) -> None:
    """Steps routed from the tables run as long as steps routed pair by pair, to the bit."""
    topo = imported(family)
    for op, alg in [("all_to_all", "mesh"), ("all_reduce", "ring"), ("all_reduce", "auto")]:
        assert timed(topo, op, alg, bulk=True) == timed(topo, op, alg, bulk=False), (op, alg)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_and_algorithm_times_as_before(family: str) -> None:
    topo = imported(family)
    for op, alg in NEURON_ALGORITHMS:
        assert timed(topo, op, alg, bulk=True) == timed(topo, op, alg, bulk=False), (op, alg)


def test_per_peer_costs_are_priced_per_step_not_per_pair() -> None:
    """A mesh all-to-all with the runtime's per-message costs schedules a handful of SimPy
    events, however many pairs it has: its costs are priced from the step's pairs at once."""
    topo = shaped("switch", 256)
    runtime = NeuronRuntime(
        Protocol("neuron", launch_s=1e-5, step_s=2e-6, net_step_s=2e-6, message_s=1e-6)
    )
    net = Network(simpy.Environment(), topo, range(256), {"all_to_all": "mesh"}, runtime=runtime)
    net.env.run(until=net.collective("all_to_all", range(256), 2.0**26))
    scheduled = next(net.env._eid)  # type: ignore[attr-defined]
    assert scheduled < 20  # 65,280 pairs
    bare = Network(simpy.Environment(), topo, range(256), {"all_to_all": "mesh"})
    bare.env.run(until=bare.collective("all_to_all", range(256), 2.0**26))
    # 255 messages posted in turn by each rank, the handshake and the launch.
    assert net.env.now - bare.env.now == pytest.approx(1e-5 + 2e-6 + 255 * 1e-6, rel=1e-9)
