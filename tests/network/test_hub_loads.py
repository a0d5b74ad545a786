"""Pairs two hops apart through one node are counted in aggregate, exactly as routed pair by pair.

A chip with a single link out and a destination with a single link in that meet at one
node route over those two links: :func:`~clustersim.network.graphs.routeloads.route_loads`
counts them with bincounts. These graphs mix such pairs with ones the tables route
(dual-homed chips, direct chip links, two leaves under ECMP spines), with links of
different latencies so that the longest route is a real maximum.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from test_route_loads import all_pairs, assert_same, compile_graph, shaped, timed

from clustersim.network.graphs import GraphTopology, routeloads

CPI = 4


def _edge(a: str, b: str, latency_s: float, capacity_Bps: float = 50e9) -> tuple[str, str, dict]:
    return a, b, {"capacity_Bps": capacity_Bps, "latency_s": latency_s}


def leaves(chips: int = 16) -> nx.Graph:
    """Two leaf switches under two spines; chips 0-1 dual-homed, chips 2-3 also linked
    to each other, the rest on one leaf each; latencies differ per link."""
    g = nx.Graph()
    for i in range(chips):
        g.add_node(f"chip{i}", instance=i // CPI)
    for name in ("leaf0", "leaf1", "spine0", "spine1"):
        g.add_node(name, kind="switch")
    edges = [_edge("chip0", "leaf1", 1.5e-6), _edge("chip1", "leaf0", 2.5e-6)]
    edges.append(_edge("chip2", "chip3", 0.7e-6))
    for i in range(chips):
        edges.append(_edge(f"chip{i}", f"leaf{i % 2}", (1 + 0.1 * i) * 1e-6))
    for leaf in ("leaf0", "leaf1"):
        for spine in ("spine0", "spine1"):
            edges.append(_edge(leaf, spine, 3e-6, 200e9))
    g.add_edges_from(edges)
    return g


def leaf_topology(chips: int = 16) -> GraphTopology:
    return compile_graph(leaves(chips), CPI, chips // CPI)


def test_mixed_pairs_all_to_all() -> None:
    topo = leaf_topology()
    src, dst = all_pairs(topo.n_chips)
    hub = topo._routing(True).hub
    two = hub.pairs(topo, src, dst)
    assert two.any() and not two.all()  # both paths taken
    assert_same(topo, src, dst)


def test_random_pairs_with_repeats_and_self_pairs() -> None:
    topo = leaf_topology()
    rng = np.random.default_rng(3)
    src = rng.integers(0, topo.n_chips, 400)
    dst = rng.integers(0, topo.n_chips, 400)
    assert_same(topo, src, dst)


def test_a_star_needs_no_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = shaped("switch", 64)

    def refuse(*args: object) -> None:
        raise AssertionError("a star's pairs are all two hops through the switch")

    monkeypatch.setattr(routeloads, "_Chunk", refuse)
    assert_same(topo, *all_pairs(64))


def test_a_link_down_moves_pairs_off_the_hub() -> None:
    """Chip 0's link to leaf 0 down: it has one link out left (to leaf 1), and its pairs
    into leaf 1 become two-hop ones."""
    topo = leaf_topology()
    link = int(topo.links_between(np.asarray([0]), np.asarray([topo.aliases["leaf0"]]))[0])
    topo.set_lanes_up(link, 0)
    assert_same(topo, *all_pairs(topo.n_chips))


def test_a_chip_cut_off_routes_pair_by_pair() -> None:
    topo = shaped("switch", 16)
    up = topo._routing(True).hub.up
    topo.set_lanes_up(int(up[5]), 0)
    assert topo.route_loads(*all_pairs(16)) is None


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "reduce_scatter"])
def test_collectives_time_as_before(op: str) -> None:
    topo = leaf_topology()
    for alg in ("mesh", "auto") if op == "all_to_all" else ("ring", "auto"):
        assert timed(topo, op, alg, bulk=True) == timed(topo, op, alg, bulk=False), alg


def test_a_mesh_all_to_all_on_a_star_times_as_before() -> None:
    topo = shaped("switch", 128)
    assert timed(topo, "all_to_all", "mesh", bulk=True) == timed(
        topo, "all_to_all", "mesh", bulk=False
    )
